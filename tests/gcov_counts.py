"""Lines and functions a coverage build (-Db_coverage=true) ran, read from its .gcda files with gcov."""
import gzip
import json
import pathlib
import subprocess
import tempfile


def device_file(name):
    """The device code's files, named from the library's folder: Thrust, CUB, and the headers of
    include/mpopt named for CUDA, the device or offloading. None for any other file."""
    for library in ("/thrust/", "/cub/"):
        if library in name:
            return name[name.index(library) + 1:]
    if "include/mpopt/" in name and any(word in name.rsplit("/", 1)[-1] for word in ("cuda", "device", "offload")):
        return name[name.index("include/mpopt/"):]
    return None


def executed(gcdas, name_of):
    """The lines and functions run, as sets of (name, line number) and (name, demangled function), of
    every source file that name_of(path) names (None leaves the file out)."""
    lines, functions = set(), set()
    with tempfile.TemporaryDirectory() as out:
        for gcda in gcdas:
            subprocess.run(["gcov", "--json-format", "--demangled-names", "-o", str(gcda.parent), str(gcda)], cwd=out,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        for report in pathlib.Path(out).glob("*.gcov.json.gz"):
            for f in json.load(gzip.open(report))["files"]:
                name = name_of(f["file"])
                if name is None:
                    continue
                lines.update((name, ln["line_number"]) for ln in f["lines"] if ln["count"] > 0)
                functions.update((name, fn["demangled_name"]) for fn in f["functions"] if fn["execution_count"] > 0)
    return lines, functions
