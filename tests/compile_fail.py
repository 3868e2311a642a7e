#!/usr/bin/env python3
"""Compile-fail harness: every line of SOURCE marked `// expect: A | B` must fail to compile with
static assertions whose messages contain A and B, raised from that line and from no other, and
nothing else may fail; with -DMALFORMED_FIXED the same file, mended, must compile without a warning.

usage: compile_fail.py CXX INCLUDE_DIR SOURCE [FLAG...] (g++'s diagnostics; FLAGs: more include paths and defines, the
build's g++ heap setting)"""
import re
import subprocess
import sys


def compile_source(cxx, include_dir, source, *flags):
    command = [cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-fdiagnostics-plain-output",
               "-I" + include_dir, *flags, source]
    return subprocess.run(command, capture_output=True, text=True)


def failures_by_line(output, source):
    """(line, message) of each static assertion that failed, the line being the last of SOURCE's lines
    the instantiation went through; and every other error."""
    here = re.compile(re.escape(source) + r":(\d+):\d+:\s+required from here")
    failed = re.compile(r"error: static assertion failed: (.*)")
    line, found, other = None, [], []
    for text in output.splitlines():
        if m := here.search(text):
            line = int(m.group(1))
        elif m := failed.search(text):
            found.append((line, m.group(1)))
        elif "error:" in text:
            other.append(text)
    return found, other


def main():
    cxx, include_dir, source = sys.argv[1:4]
    flags = sys.argv[4:]
    expected = {}
    with open(source) as f:
        for number, text in enumerate(f, 1):
            if "// expect: " in text:
                expected[number] = [e.strip() for e in text.split("// expect: ", 1)[1].split("|")]
    if not expected:
        sys.exit(f"FAIL: no `// expect:` line in {source}")

    mended = compile_source(cxx, include_dir, source, "-DMALFORMED_FIXED", *flags)
    if mended.returncode != 0:
        print(mended.stderr)
        sys.exit("FAIL: the mended policies do not compile")

    malformed = compile_source(cxx, include_dir, source, *flags)
    if malformed.returncode == 0:
        sys.exit("FAIL: the malformed policies compile")
    found, other = failures_by_line(malformed.stderr, source)
    bad = [f"unexpected error: {e}" for e in other]
    for line, wants in expected.items():
        messages = [message for at, message in found if at == line]
        for want in wants:
            if sum(want in message for message in messages) != 1:
                bad.append(f"line {line}: expected one message containing {want!r}, got {messages}")
        for message in messages:
            if not any(want in message for want in wants):
                bad.append(f"line {line}: unexpected message {message!r}")
    for line, message in found:
        if line not in expected:
            bad.append(f"line {line}: a message from a line that expects none: {message!r}")
    for b in bad:
        print("FAIL:", b)
    if bad:
        print(malformed.stderr[-20000:])
        sys.exit(1)
    print(f"{len(expected)} malformed policies rejected, each on its own messages ({len(found)} in all); "
          "mended, they compile")


main()
