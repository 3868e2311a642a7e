#!/usr/bin/env python3
"""What each device copy of a host test reaches of the device code that no other device test does.

The device build runs a host scenario matrix only as far as it reaches device code that the other
device tests do not (tests/README.md, "The device build"). This measures it. In a build configured
with -Db_coverage=true it runs every test of suite 'device' on its own (counts reset before each),
reads gcov's counts of the device code (Thrust, CUB, and the headers of include/mpopt named for
CUDA, the device or offloading): the lines run, and the functions run by their demangled names,
which tell the instantiations apart (each precision, rule, pass kind and partition is a function of
its own). The backend-generic code (the optimizer's orchestration, the exchanges, the drivers) is
the host's, run by the host suites; where it calls the device backend, that is device code. Then,
for each test, it prints what that test alone reached, and last a greedy order in which tests can
go without the device tests together reaching less.

  meson setup cov -Db_coverage=true -Dcuda=disabled && ninja -C cov $(python3 tests/device_coverage.py --targets cov)
  python3 tests/device_coverage.py cov [--save cov.json] [--load cov.json] [test ...]
"""
import argparse
import json
import os
import pathlib
import subprocess

from gcov_counts import device_file, executed


def device_tests(build):
    out = subprocess.run(["meson", "introspect", "--tests", str(build)], capture_output=True, text=True, check=True).stdout
    return [t for t in json.loads(out) if any(s.split(":")[-1] == "device" for s in t["suite"])]


def reached(build):
    """Device lines and functions run since the counts were last reset; resets them."""
    gcdas = list(build.rglob("*.gcda"))
    found = executed(gcdas, device_file)
    for gcda in gcdas:
        gcda.unlink()
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build", type=pathlib.Path, help="a build directory configured with -Db_coverage=true")
    p.add_argument("tests", nargs="*", help="test names (default: every test of suite 'device')")
    p.add_argument("--targets", action="store_true", help="print the ninja targets the tests need, and stop")
    p.add_argument("--save", type=pathlib.Path, help="write what each test reached to this JSON file")
    p.add_argument("--load", type=pathlib.Path, help="read it from this file instead of running the tests")
    args = p.parse_args()
    build = args.build.resolve()
    tests = [t for t in device_tests(build) if not args.tests or t["name"] in args.tests]
    if args.targets:
        exes = {os.path.relpath(build / c, build) for t in tests for c in t["cmd"]
                if "/" in c and not c.startswith("-") and (build / c).resolve().is_relative_to(build)}
        print(" ".join(sorted(exes)))
        return
    if args.load:
        saved = json.loads(args.load.read_text())
        cover = {name: ({tuple(x) for x in lines}, {tuple(x) for x in functions}) for name, (lines, functions) in saved.items()}
    else:
        reached(build)  # reset
        cover = {}
        for t in tests:
            env = {**os.environ, **t["env"]}
            r = subprocess.run(t["cmd"], env=env, cwd=t.get("workdir") or build, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            cover[t["name"]] = reached(build)
            print(f"{t['name']}: exit {r.returncode}, {len(cover[t['name']][0])} device lines, "
                  f"{len(cover[t['name']][1])} device functions", flush=True)
        if args.save:
            args.save.write_text(json.dumps({k: [sorted(v[0]), sorted(v[1])] for k, v in cover.items()}))

    def union(names):
        lines, functions = set(), set()
        for n in names:
            lines |= cover[n][0]
            functions |= cover[n][1]
        return lines, functions

    total = union(cover)
    print(f"\nall device tests: {len(total[0])} device lines, {len(total[1])} device functions")
    print("\nwhat each test alone reaches:")
    for name in cover:
        others = union(n for n in cover if n != name)
        only_lines = sorted(cover[name][0] - others[0])
        only_functions = sorted(cover[name][1] - others[1])
        print(f"{name}: {len(only_lines)} lines, {len(only_functions)} functions")
        for file, function in only_functions:
            print(f"    {file}: {function}")
    print("\ntests that can go, one after another, without the rest reaching less:")
    kept = list(cover)
    while True:
        for name in sorted(kept, key=lambda n: len(cover[n][1])):
            rest = [n for n in kept if n != name]
            if union(rest) == total:
                print(f"  {name}")
                kept = rest
                break
        else:
            break
    print("kept: " + ", ".join(kept))


if __name__ == "__main__":
    main()
