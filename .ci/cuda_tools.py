#!/usr/bin/env python3
"""Installs cuobjdump and nvdisasm (NVIDIA's wheels on PyPI) into the directory given, for suite
'sass': this CUDA toolkit ships without them. Stdlib only, no pip: each wheel is fetched by the URL
and sha256 PyPI's simple index lists for it, checked, and its bin/ unpacked. Does nothing if they are there."""
import hashlib
import pathlib
import re
import sys
import urllib.request
import zipfile

VERSION = "13.2.51"  # the oldest CUDA 13 release on PyPI; reads the sm_80/sm_90 cubins nvcc 13.0 makes
PACKAGES = {"nvidia-cuda-cuobjdump": "cuobjdump", "nvidia-cuda-nvdisasm": "nvdisasm"}


def fetch(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def install(package, tool, target):
    index = fetch(f"https://pypi.org/simple/{package}/").decode()
    links = re.findall(r'href="([^"#]+/([^"/#]+\.whl))#sha256=([0-9a-f]{64})"', index)
    url, name, sha256 = next(l for l in links if f"-{VERSION}-" in l[1] and "x86_64" in l[1])
    data = fetch(url)
    if hashlib.sha256(data).hexdigest() != sha256:
        sys.exit(f"{name}: sha256 differs from PyPI's")
    archive = target / name
    archive.write_bytes(data)
    with zipfile.ZipFile(archive) as z:
        member = next(n for n in z.namelist() if n.endswith(f"/bin/{tool}"))
        (target / tool).write_bytes(z.read(member))
    (target / tool).chmod(0o755)
    archive.unlink()


def main():
    target = pathlib.Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    for package, tool in PACKAGES.items():
        if not (target / tool).exists():
            install(package, tool, target)
    print(f"{', '.join(PACKAGES.values())} {VERSION} in {target}")


if __name__ == "__main__":
    main()
