#!/usr/bin/env python3
"""The device backend's kernels as ptxas builds them for one architecture (suite 'sass').

One nvcc run makes the PTX of sass_kernels.cu, and ptxas -v compiles that PTX to machine code.
Two checks:
  spills: no kernel spills registers to local memory.
  loads:  the aligned Adam and LAMB kernels read fp32 state 16 bytes at a time. This toolkit has no
          cuobjdump, so the check reads the PTX: in each element loop (an innermost loop with global
          loads), every load whose address moves with the loop is a vector load, fp32 ones .v4,
          and there are at least three ld.global.v4.f32 (m, v and the master). A load from an
          address the loop never changes reads a per-chunk value (a coefficient), whatever its width.
"""
import argparse
import pathlib
import re
import shutil
import subprocess
import sys

UPDATE_PASSES = ("adam_pass", "lamb_moments_pass", "lamb_apply_pass")
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
    return ptx.read_text(), log.stderr


def spilling_kernels(log):
    """Kernels whose 'Function properties' report spill stores or loads."""
    bad = []
    properties = (r"Function properties for (\S+)\n"
                  r"\s*\d+ bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
    for name, stores, loads in re.findall(properties, log):
        if int(stores) or int(loads):
            bad.append((name, f"{stores} bytes spill stores, {loads} bytes spill loads"))
    return bad


def entries(ptx):
    """(mangled name, instruction and label lines) of each kernel."""
    for m in re.finditer(r"^\.visible \.entry (\w+)\((.*?)^\}", ptx, re.S | re.M):
        yield m.group(1), [l.strip() for l in m.group(2).splitlines() if re.match(r"\s*(\$\w+:|@|[a-z])", l)]


def instruction(line):
    """(guarded, opcode, operands) of a PTX instruction line."""
    guard = re.match(r"@!?%\w+\s+", line)
    op, _, operands = line[guard.end() if guard else 0:].partition(" ")
    return bool(guard), op, operands.strip()


def control_flow(lines):
    """Basic blocks (lists of instructions) and each one's successors."""
    blocks, labels = [[]], {}
    for line in lines:
        if line.endswith(":"):
            if blocks[-1]:
                blocks.append([])
            labels[line[:-1]] = len(blocks) - 1
            continue
        blocks[-1].append(line)
        if instruction(line)[1] in ("bra", "bra.uni", "ret", "exit", "trap"):
            blocks.append([])
    succ = []
    for i, block in enumerate(blocks):
        guarded, op, operands = instruction(block[-1]) if block else (True, "", "")
        succ.append([labels[operands.rstrip(";")]] if op.startswith("bra") else [])
        if guarded or op not in ("bra", "bra.uni", "ret", "exit", "trap"):
            succ[-1] += [i + 1] if i + 1 < len(blocks) else []
    return blocks, succ


def natural_loops(succ):
    """Each loop as its set of blocks: a back edge's target (the header) dominates its source."""
    pred = [[] for _ in succ]
    for i, ss in enumerate(succ):
        for s in ss:
            pred[s].append(i)
    dom = [set(range(len(succ)))] * len(succ)
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for i in range(1, len(succ)):
            new = set.intersection(*(dom[p] for p in pred[i])) | {i} if pred[i] else {i}
            if new != dom[i]:
                dom[i], changed = new, True
    loops = {}
    for latch, ss in enumerate(succ):
        for header in (s for s in ss if s in dom[latch]):
            body, work = {header, latch}, [latch] if latch != header else []
            while work:
                for p in pred[work.pop()]:
                    if p not in body:
                        body.add(p)
                        work.append(p)
            loops.setdefault(header, set()).update(body)
    return list(loops.values())


def load_problems(lines):
    """What keeps one kernel's element loops from reading 16-byte vectors (nothing: empty)."""
    blocks, succ = control_flow(lines)
    code = lambda loop: [instruction(l) for i in sorted(loop) for l in blocks[i]]
    loads = lambda loop: [(op, operands) for _, op, operands in code(loop) if op.startswith("ld.global.")]
    with_loads = [loop for loop in natural_loops(succ) if loads(loop)]
    element_loops = [loop for loop in with_loads if not any(inner < loop for inner in with_loads)]
    if not element_loops:
        return ["no element loop found"]
    problems = []
    for loop in element_loops:
        written = {operands.split(",")[0] for _, _, operands in code(loop)}  # destinations
        v4 = 0
        for op, operands in loads(loop):
            if op.endswith(".v4.f32"):
                v4 += 1
                continue
            moves = re.search(r"\[([^\]+]+)", operands).group(1) in written
            if moves and (op.endswith(".f32") or not re.search(r"\.v[24]\.", op)):
                problems.append(f"element by element: {op} {operands}")
        if v4 < STATE_ARRAYS:
            problems.append(f"an element loop has {v4} ld.global.v4.f32, expected at least {STATE_ARRAYS}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nvcc", required=True)
    p.add_argument("--arch", required=True, help="e.g. 90 for sm_90")
    p.add_argument("-I", dest="include", action="append", default=[])
    p.add_argument("--workdir", default=".", help="where the PTX, cubin and ptxas log are left")
    p.add_argument("source")
    args = p.parse_args()
    work = pathlib.Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    ptx, log = compile_kernels(args, work)
    failed = False

    kernels = len(re.findall(r"Compiling entry function", log))
    spills = spilling_kernels(log)
    for (name, what), shown in zip(spills, demangle([n for n, _ in spills])):
        print(f"sm_{args.arch} spills: {shown}: {what}")
    print(f"sm_{args.arch} spills: {len(spills)} of {kernels} kernels spill registers")
    failed |= bool(spills) or kernels == 0

    checked = set()
    for name, lines in entries(ptx):
        pass_name = re.search(r"\d+(" + "|".join(UPDATE_PASSES) + r")I", name)
        precision = next((v for k, v in PRECISIONS.items() if k in name), None)
        if not pass_name or not precision or "quad_lanesILb1E" not in name:
            continue
        checked.add((pass_name.group(1), precision))
        for problem in load_problems(lines):
            print(f"sm_{args.arch} loads: {pass_name.group(1)} {precision} (aligned): {problem}")
            failed = True
    missing = {(a, b) for a in UPDATE_PASSES for b in PRECISIONS.values()} - checked
    for pass_name, precision in sorted(missing):
        print(f"sm_{args.arch} loads: no aligned {pass_name} kernel for {precision} in the PTX")
    failed |= bool(missing)
    print(f"sm_{args.arch} loads: {len(checked)} aligned update kernels checked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
