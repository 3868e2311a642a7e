#!/usr/bin/env python3
"""The device backend's kernels as ptxas builds them for one architecture (suite 'sass').

nvcc makes the PTX of sass_kernels.cu, ptxas -v compiles it to a cubin, cuobjdump -sass prints the
machine code. Two checks:
  spills: no kernel spills registers to local memory (ptxas -v).
  loads:  in the element loops of the aligned Adam and LAMB kernels and of the overflow-and-norm
          pass, every global load is a vector (LDG.E.64 or LDG.E.128), and in the update passes fp32
          state comes 16 bytes at a time: at least three LDG.E.128 (m, v and the master). The
          kernels that finish in their own last block (the norm with the step's sums, LAMB's
          moments with its trust ratios) are checked too, their finish left out: the loops after
          the kernel's one atomic (the blocks' arrival count). The unaligned kernels that read
          gradients must fail this (they read element by element), which shows the check can fail.
  fp16:   a turn of an aligned fp16 element loop issues at most FP16_OVER_BF16 times bf16's
          instructions (round to nearest; the common case, a NaN's exact conversion skipped): fp16
          converts by the GPU's instructions, not in integer arithmetic (quad_lanes.hpp,
          converts_by_cvt), with which the norm pass issued 1.8 times bf16's, Adam's update 1.27.
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
NORM_PASS = "norm"  # gradient_norm_pass: reads the gradients only
GRADIENT_READERS = ("adam update", "lamb direction", NORM_PASS)
# The passes run with a finish in their kernel (pass_finish.hpp), as the finish is mangled.
FINISHED = {NORM_PASS: "16step_sums_finish", "lamb direction": "15segments_finish"}
PRECISIONS = {"4fp32E": "fp32", "4halfE": "fp16", "8bfloat16E": "bf16"}
STATE_ARRAYS = 3  # m, v, master
FP16_OVER_BF16 = 1.25


def pass_of(name):
    """The checked pass a kernel runs (None: not one of them)."""
    if "18gradient_norm_pass" in name:
        return NORM_PASS
    return next((p for p, (rule, stage) in UPDATE_PASSES.items()
                 if "9rule_pass" in name and re.search(rf"NS\d*_{rule}E", name) and stage in name), None)


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


def element_loop_spans(code):
    """The innermost loops that load from global memory, as (first, last) addresses. A loop is the
    span from a backward branch's target to the branch (ptxas lays loops out contiguously); loops
    after the kernel's first atomic are its finish, not element loops."""
    finish = next((a for a, text in code if re.search(r"\b(ATOMG?|RED)\b", text)), float("inf"))
    spans = [(int(m.group(1), 16), a) for a, text in code
             if (m := re.search(r"\bBRA\b.*?(0x[0-9a-f]+)$", text)) and int(m.group(1), 16) <= a and a < finish]
    with_loads = [s for s in spans if any(s[0] <= a <= s[1] and re.search(r"\bLDG\b", t) for a, t in code)]
    return [s for s in with_loads if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in with_loads)]


def element_loops(code):
    """The element loops (element_loop_spans), as their global loads."""
    return [[re.search(r"LDG\S*", t).group(0) for a, t in code if s[0] <= a <= s[1] and re.search(r"\bLDG\b", t)]
            for s in element_loop_spans(code)]


def common_pass(code, span):
    """Instructions issued by one turn of a loop in its common case: a conditional branch forward
    is taken where it skips only arithmetic (a NaN's exact conversion), not where it skips loads
    (another form of the element, such as an accumulated gradient)."""
    body = [(a, t) for a, t in code if span[0] <= a <= span[1]]
    at = {a: i for i, (a, _) in enumerate(body)}
    issued, i = 0, 0
    while i < len(body):
        issued += 1
        text = body[i][1]
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)$", text)
        target = at.get(int(m.group(1), 16)) if m else None
        if target is not None and target > i and (
                not text.startswith("@") or not any(re.search(r"\bLDG\b", t) for _, t in body[i + 1:target])):
            i = target
        else:
            i += 1
    return issued


def element_loop_size(code):
    """Instructions a turn of the kernel's largest element loop issues (common_pass)."""
    spans = element_loop_spans(code)
    return common_pass(code, max(spans, key=lambda s: s[1] - s[0])) if spans else 0


def load_problems(code, wide_loads=STATE_ARRAYS):
    """What keeps one kernel's element loops from reading whole vectors (nothing: empty): a load
    narrower than 8 bytes (4 fp16/bf16 values), or fewer than `wide_loads` 16-byte ones (m, v,
    master)."""
    loops = element_loops(code)
    if not loops:
        return ["no element loop found"]
    problems = []
    for loads in loops:
        narrow = sorted({op for op in loads if not re.search(r"\.(64|128)\b", op)})
        if narrow:
            problems.append(f"element by element: {', '.join(narrow)}")
        if loads.count("LDG.E.128") < wide_loads:
            problems.append(f"an element loop has {loads.count('LDG.E.128')} LDG.E.128, expected at least {wide_loads}")
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

    checked, narrow_unaligned, finished, loop_size = set(), set(), set(), {}
    for name, code in functions(sass):
        pass_name = pass_of(name)
        precision = next((v for k, v in PRECISIONS.items() if k in name), None)
        if not pass_name or not precision:
            continue
        kernel = (pass_name, precision)
        wide_loads = 0 if pass_name == NORM_PASS else STATE_ARRAYS
        if "quad_lanesILb0E" in name:
            if load_problems(code, wide_loads):
                narrow_unaligned.add(kernel)
            continue
        checked.add(kernel)
        if "16round_to_nearest" in name or precision == "fp32":
            loop_size[kernel] = max(loop_size.get(kernel, 0), element_loop_size(code))
        with_finish = FINISHED.get(pass_name, "-") in name
        if with_finish:
            finished.add(kernel)
        for problem in sorted(set(load_problems(code, wide_loads))):
            print(f"sm_{args.arch} loads: {kernel[0]} {precision} (aligned{', with its finish' if with_finish else ''}): {problem}")
            failed = True
    expected = {(a, b) for a in [*UPDATE_PASSES, NORM_PASS] for b in PRECISIONS.values()}
    for pass_name, precision in sorted(expected - checked):
        print(f"sm_{args.arch} loads: no aligned {pass_name} kernel for {precision} in the SASS")
    expected_finished = {(a, b) for a in FINISHED for b in PRECISIONS.values()}
    for pass_name, precision in sorted(expected_finished - finished):
        print(f"sm_{args.arch} loads: no aligned {pass_name} kernel with its finish for {precision} in the SASS")
    failed |= finished != expected_finished
    # Unaligned gradients are read element by element (the unaligned LAMB apply reads only state).
    reading_grads = {k for k in expected if k[0] in GRADIENT_READERS}
    for pass_name, precision in sorted(reading_grads - narrow_unaligned):
        print(f"sm_{args.arch} loads: the unaligned {pass_name} {precision} kernel passes too: the check cannot tell")
    failed |= checked != expected or not reading_grads <= narrow_unaligned
    print(f"sm_{args.arch} loads: {len(checked)} aligned kernels checked ({len(finished)} with their finish), "
          f"{len(narrow_unaligned)} unaligned ones seen to load element by element")
    for pass_name in [*UPDATE_PASSES, NORM_PASS]:
        sizes = {p: loop_size.get((pass_name, p), 0) for p in ("fp32", "bf16", "fp16")}
        ratio = sizes["fp16"] / sizes["bf16"] if sizes["bf16"] else float("inf")
        print(f"sm_{args.arch} fp16: {pass_name} element loop, instructions a turn: "
              + ", ".join(f"{p} {n}" for p, n in sizes.items()) + f" (fp16/bf16 {ratio:.2f})")
        failed |= not ratio <= FP16_OVER_BF16
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
