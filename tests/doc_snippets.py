#!/usr/bin/env python3
"""Every C++ snippet of the docs is either compiled or taken from a file that the build compiles.

  doc_snippets.py --root SOURCE_ROOT --cxx C++ [--mpicxx MPICXX] [--nvcc NVCC] [--cccl DIR] [--include DIR ...]
                  [--flag FLAG ...]

For each ```cpp block of README.md, CHANGELOG.md and docs/*.md:
- a block whose first line is `// from PATH` (PATH relative to the source root) is an excerpt: each
  of its other lines, stripped, must appear in PATH in the same order (`...` lines skip ahead); a
  PATH under examples/snippets/ (files that exist for the docs, built by no target) is compiled too;
- any other block is a whole translation unit, compiled with -fsyntax-only: by MPICXX where it
  includes <mpopt/mpi.hpp> or <mpopt/nccl.hpp>, else by C++; one that includes the device backend
  (cuda.hpp, offload.hpp, nccl.hpp) on Thrust's OpenMP system with --cccl (nccl.h from CCCL's parent
  directory), as the device tests build without a GPU, else by NVCC. A block whose compiler is
  missing is reported skipped. Each --flag goes to C++ and MPICXX (the build's g++ heap setting:
  how the compiler manages its memory, not what it accepts).
Prints one line per block and exits 1 if any fails.
"""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```cpp\s*$")


def blocks(path):
    """(first line number, lines) of each ```cpp block in a Markdown file."""
    out, current, start = [], None, 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if current is None:
                if FENCE.match(line.strip()):
                    current, start = [], number + 1
            elif line.strip() == "```":
                out.append((start, current))
                current = None
            else:
                current.append(line)
    return out


def excerpt_problem(root, source, lines):
    """None if every line appears in `source` in order; else what is missing."""
    full = os.path.join(root, source)
    if not os.path.isfile(full):
        return "no file " + source
    with open(full, encoding="utf-8") as f:
        have = [l.strip() for l in f]
    at = 0
    for line in lines:
        want = line.strip()
        if not want or want == "..." or want == "// ...":
            continue
        while at < len(have) and have[at] != want:
            at += 1
        if at == len(have):
            return "not in %s (in this order): %r" % (source, want)
        at += 1
    return None


def compiler_for(text, args):
    """The compiler and flags for a unit of `text`; (None, _) where this build has none for it."""
    nccl = "<mpopt/nccl.hpp>" in text
    device = nccl or "<mpopt/cuda.hpp>" in text or "<mpopt/offload.hpp>" in text
    if device and not args.cccl:
        host = ["-ccbin", args.mpicxx] if args.mpicxx else []  # nccl.hpp includes <mpi.h>
        return args.nvcc, ["-std=c++20", "-x", "cu", "-c", "-o", os.devnull] + host
    # Declarations are what a snippet is checked against: the separately compiled mode parses half as much.
    flags = ["-std=c++20", "-fsyntax-only", "-fopenmp", "-Wall", "-Wextra"] + args.flag
    if "<mpopt/src.hpp>" not in text:
        flags.append("-DMPOPT_SEPARATE_COMPILATION")
    if device:  # the device backend on Thrust's OpenMP system, as its tests build it; nccl.h beside CCCL
        flags += ["-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP", "-isystem", args.cccl]
        if nccl:
            flags += ["-I", os.path.dirname(os.path.normpath(args.cccl))]
    return (args.mpicxx if nccl or "<mpopt/mpi.hpp>" in text else args.cxx), flags


SNIPPET_DIR = "examples/snippets/"
SKIPPED = "skipped"


def compile_unit(text, source, args):
    """None if `source` (whose text is `text`) compiles; SKIPPED without its compiler; else the errors."""
    compiler, flags = compiler_for(text, args)
    if not compiler:
        return SKIPPED
    includes = ["-I" + os.path.join(args.root, "include")] + ["-I" + d for d in args.include]
    run = subprocess.run([compiler] + flags + includes + [source], capture_output=True, text=True)
    return None if run.returncode == 0 else (run.stdout + run.stderr).strip()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--cxx", required=True)
    p.add_argument("--mpicxx")
    p.add_argument("--nvcc")
    p.add_argument("--cccl", help="CUDA's CCCL headers: <mpopt/cuda.hpp> snippets build with C++ on Thrust's OpenMP system")
    p.add_argument("--include", action="append", default=[])
    p.add_argument("--flag", action="append", default=[])
    args = p.parse_args()

    pages = [os.path.join(args.root, n) for n in ("README.md", "CHANGELOG.md") if os.path.isfile(os.path.join(args.root, n))]
    docs = os.path.join(args.root, "docs")
    pages += sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith(".md"))
    failed = checked = skipped = 0
    # Each block's check, in page order; compiles run side by side (each is one compiler process).
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    compiled = {}  # snippet file -> the future of its compile result
    checks = []    # (where, kind, the result or its future)
    with tempfile.TemporaryDirectory() as scratch, pool:
        for page in pages:
            name = os.path.relpath(page, args.root)
            for start, lines in blocks(page):
                where = "%s:%d" % (name, start)
                first = lines[0].strip() if lines else ""
                if first.startswith("// from "):
                    path = first[len("// from "):].split()[0]
                    problem = excerpt_problem(args.root, path, lines[1:])
                    kind = "excerpt"
                    if not problem and path.startswith(SNIPPET_DIR):  # compiled by no target but this test
                        if path not in compiled:
                            with open(os.path.join(args.root, path), encoding="utf-8") as f:
                                compiled[path] = pool.submit(compile_unit, f.read(), os.path.join(args.root, path), args)
                        problem = compiled[path]
                        kind = "excerpt of a compiled snippet file"
                else:
                    text = "\n".join(lines) + "\n"
                    source = os.path.join(scratch, "snippet%d.cpp" % len(checks))
                    with open(source, "w", encoding="utf-8") as f:
                        f.write(text)
                    problem = pool.submit(compile_unit, text, source, args)
                    kind = "compiled"
                checks.append((where, kind, problem))
        for where, kind, problem in checks:
            if isinstance(problem, concurrent.futures.Future):
                problem = problem.result()
            if problem is SKIPPED:
                print("skipped %s: needs a compiler this build has not (CUDA or MPI)" % where)
                skipped += 1
                continue
            checked += 1
            if problem:
                failed += 1
                print("FAIL %s (%s): %s" % (where, kind, problem))
            else:
                print("ok   %s (%s)" % (where, kind))
    print("%d snippets: %d failed, %d skipped" % (checked + skipped, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
