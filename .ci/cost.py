#!/usr/bin/env python3
"""What a run of the suite cost: the compiler's total seconds and the longest translation units
(build/.ninja_log), the longest tests (build/meson-logs/testlog.json), and the run's wall time.

usage: cost.py BUILD_DIR [WALL_SECONDS]

A unit is a ninja step that compiles (its output ends in .o, or it is a custom compile such as the
fuzz target); linking, archiving and generated files are left out. Where ninja ran a step more
than once (an incremental build), its last run counts; a unit the build no longer has (its output
is gone) does not.
"""
import json
import os
import sys


def units(build):
    last = {}
    try:
        with open(os.path.join(build, ".ninja_log")) as log:
            for line in log:
                if line.startswith("#"):
                    continue
                start, end, _, output, _ = line.rstrip("\n").split("\t")
                last[output] = (int(end) - int(start)) / 1000.0
    except OSError:
        return {}
    return {out: s for out, s in last.items()
            if (out.endswith(".o") or out.endswith("fuzz_load")) and os.path.exists(os.path.join(build, out))}


def tests(build):
    result = []
    try:
        with open(os.path.join(build, "meson-logs", "testlog.json")) as log:
            for line in log:
                t = json.loads(line)
                result.append((t.get("duration", 0.0), t["name"], t["result"]))
    except OSError:
        pass
    return result


def main():
    build = sys.argv[1]
    if len(sys.argv) > 2:
        print(f"wall time: {float(sys.argv[2]):.0f} s")
    u = units(build)
    print(f"compiler total: {sum(u.values()):.0f} s over {len(u)} translation units")
    for out, s in sorted(u.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {s:7.1f} s  {out}")
    t = tests(build)
    print(f"tests: {sum(d for d, _, _ in t):.0f} s over {len(t)} tests (run side by side where they may)")
    for d, name, result in sorted(t, reverse=True)[:10]:
        print(f"  {d:7.1f} s  {name} ({result})")


if __name__ == "__main__":
    main()
