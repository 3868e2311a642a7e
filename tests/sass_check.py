#!/usr/bin/env python3
"""The device backend's kernels as ptxas builds them for one architecture (suite 'sass').

nvcc makes the PTX of sass_kernels.cu, ptxas -v compiles it to a cubin, cuobjdump -sass prints the
machine code. Two checks:
  spills: no kernel spills registers to local memory (ptxas -v).
  loads:  in the element loops of the aligned Adam and LAMB kernels, every global load is a vector
          (LDG.E.64 or LDG.E.128) and fp32 state comes 16 bytes at a time: at least three LDG.E.128
          (m, v and the master). The unaligned kernels that read gradients must fail this (they
          read element by element), which shows the check can fail.
"""
import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys

# A rule's stage runs as rule_pass<Precision, Rule, Stage>: the rule and stage as they are mangled.
UPDATE_PASSES = {"adam update": ("4adam", "12update_stage"),
                 "lamb direction": ("4lamb", "15direction_stage"),
                 "lamb update": ("4lamb", "12update_stage")}
GRADIENT_READERS = ("adam update", "lamb direction")
PRECISIONS = {"4fp32E": "fp32", "4halfE": "fp16", "8bfloat16E": "bf16"}
STATE_ARRAYS = 3  # m, v, master


def demangle(names):
    if not shutil.which("c++filt"):
        return list(names)
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    # The Thrust/CUB wrapper hides the interesting part: show the functor.
    return [re.sub(r"^.*?(mpopt::detail::chunk\w*<.*?quad_lanes<\w+> ?>|mpopt::detail::\w+_kernel).*$", r"\1", n)
            for n in out.splitlines()]


def compile_kernels(args, work):
    ptx, cubin = work / f"sass_kernels.sm_{args.arch}.ptx", work / f"sass_kernels.sm_{args.arch}.cubin"
    includes = [f"-I{d}" for d in args.include]
    nvcc = shutil.which(args.nvcc)
    if not nvcc or subprocess.run([nvcc, "--ptx", "-std=c++20", "-O3", "-DNDEBUG", "--Werror", "all-warnings",
                                   f"-arch=compute_{args.arch}", *includes, args.source, "-o", ptx]).returncode != 0:
        sys.exit(f"nvcc ({args.nvcc}) could not make the PTX")
    ptxas = pathlib.Path(nvcc).resolve().parent / "ptxas"  # the toolkit's own
    log = subprocess.run([ptxas, f"-arch=sm_{args.arch}", "-v", "--warning-as-error", ptx, "-o", cubin],
                         capture_output=True, text=True)
    (work / f"sass_kernels.sm_{args.arch}.ptxas.log").write_text(log.stderr)
    if log.returncode != 0:
        sys.exit(f"ptxas failed:\n{log.stderr}")
    sass = subprocess.run([args.cuobjdump, "-sass", cubin], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{pathlib.Path(args.cuobjdump).parent}:{os.environ['PATH']}"})
    if sass.returncode != 0:
        sys.exit(f"cuobjdump -sass failed:\n{sass.stderr}")
    (work / f"sass_kernels.sm_{args.arch}.sass").write_text(sass.stdout)
    return sass.stdout, log.stderr


def spilling_kernels(log):
    """Kernels whose 'Function properties' report spill stores or loads."""
    bad = []
    properties = (r"Function properties for (\S+)\n"
                  r"\s*\d+ bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
    for name, stores, loads in re.findall(properties, log):
        if int(stores) or int(loads):
            bad.append((name, f"{stores} bytes spill stores, {loads} bytes spill loads"))
    return bad


def functions(sass):
    """(mangled name, [(address, instruction)]) of each kernel in cuobjdump -sass output."""
    for m in re.finditer(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S):
        code = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", m.group(2))
        yield m.group(1), [(int(address, 16), text) for address, text in code]


def element_loops(code):
    """The innermost loops that load from global memory, as their global loads. A loop is the span
    from a backward branch's target to the branch (ptxas lays loops out contiguously)."""
    spans = [(int(m.group(1), 16), a) for a, text in code
             if (m := re.search(r"\bBRA\b.*?(0x[0-9a-f]+)$", text)) and int(m.group(1), 16) <= a]
    loads = lambda s: [re.search(r"LDG\S*", t).group(0) for a, t in code if s[0] <= a <= s[1] and re.search(r"\bLDG\b", t)]
    with_loads = [s for s in spans if loads(s)]
    inner = [s for s in with_loads if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in with_loads)]
    return [loads(s) for s in inner]


def load_problems(code):
    """What keeps one kernel's element loops from reading whole vectors (nothing: empty): a load
    narrower than 8 bytes (4 fp16/bf16 values), or fewer than three 16-byte ones (m, v, master)."""
    loops = element_loops(code)
    if not loops:
        return ["no element loop found"]
    problems = []
    for loads in loops:
        narrow = sorted({op for op in loads if not re.search(r"\.(64|128)\b", op)})
        if narrow:
            problems.append(f"element by element: {', '.join(narrow)}")
        if loads.count("LDG.E.128") < STATE_ARRAYS:
            problems.append(f"an element loop has {loads.count('LDG.E.128')} LDG.E.128, expected at least {STATE_ARRAYS}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nvcc", required=True)
    p.add_argument("--arch", required=True, help="e.g. 90 for sm_90")
    p.add_argument("--cuobjdump", help="cuobjdump, with nvdisasm in the same directory")
    p.add_argument("-I", dest="include", action="append", default=[])
    p.add_argument("--workdir", default=".", help="where the PTX, cubin, ptxas log and SASS are left")
    p.add_argument("source")
    args = p.parse_args()
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if not args.cuobjdump or not shutil.which(args.cuobjdump):
        sys.exit("no cuobjdump (with nvdisasm beside it): .ci/setup installs both from PyPI "
                 "(-Dgpu_tools=DIR tells Meson where they are)")
    sass, log = compile_kernels(args, work)
    failed = False

    kernels = len(re.findall(r"Compiling entry function", log))
    spills = spilling_kernels(log)
    for (name, what), shown in zip(spills, demangle([n for n, _ in spills])):
        print(f"sm_{args.arch} spills: {shown}: {what}")
    print(f"sm_{args.arch} spills: {len(spills)} of {kernels} kernels spill registers")
    failed |= bool(spills) or kernels == 0

    checked, narrow_unaligned = set(), set()
    for name, code in functions(sass):
        pass_name = next((p for p, (rule, stage) in UPDATE_PASSES.items()
                          if "9rule_pass" in name and re.search(rf"NS\d*_{rule}E", name) and stage in name), None)
        precision = next((v for k, v in PRECISIONS.items() if k in name), None)
        if not pass_name or not precision:
            continue
        kernel = (pass_name, precision)
        if "quad_lanesILb0E" in name:
            if load_problems(code):
                narrow_unaligned.add(kernel)
            continue
        checked.add(kernel)
        for problem in sorted(set(load_problems(code))):
            print(f"sm_{args.arch} loads: {kernel[0]} {precision} (aligned): {problem}")
            failed = True
    expected = {(a, b) for a in UPDATE_PASSES for b in PRECISIONS.values()}
    for pass_name, precision in sorted(expected - checked):
        print(f"sm_{args.arch} loads: no aligned {pass_name} kernel for {precision} in the SASS")
    # Unaligned gradients are read element by element (the unaligned LAMB apply reads only state).
    reading_grads = {k for k in expected if k[0] in GRADIENT_READERS}
    for pass_name, precision in sorted(reading_grads - narrow_unaligned):
        print(f"sm_{args.arch} loads: the unaligned {pass_name} {precision} kernel passes too: the check cannot tell")
    failed |= checked != expected or not reading_grads <= narrow_unaligned
    print(f"sm_{args.arch} loads: {len(checked)} aligned update kernels checked, "
          f"{len(narrow_unaligned)} unaligned ones seen to load element by element")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
