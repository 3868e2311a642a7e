#!/usr/bin/env python3
"""mpopt::muon against torch.optim.Muon itself: the same matrices, initial weights and gradients,
step after step (test_muon's test case "muon_steps", in tests/muon_optimizer.cpp, runs mpopt's
side: fp32 parameters, no clipping).

  torch_muon.py --test-muon build/tests/test_muon [--steps 6]

PyTorch's Muon always iterates in bf16, with the middle product fused by addmm; mpopt's bf16
iteration rounds where PyTorch's unfused tensors do, so the two orthogonalized updates differ by
a few percent, as any two bf16 iterations that round in different places. So two comparisons:
  with ns_steps = 0 (the iteration only normalizes), every setting (Nesterov on and off, both rate
  adjustments, weight decay): the parameters' movement within 1e-3 relative (Frobenius, per step;
  observed: 0, and 1.5e-5 without Nesterov); a wrong momentum, rate or decay is far above;
  with 5 steps (PyTorch's default), mpopt's bf16 and fp32 iterations: within 8e-2 relative
  (observed: 5.0e-2 and 3.8e-2).
Tall, wide and square matrices, and a 3-D tensor, which torch.optim.Muon refuses: it is given the
matrix mpopt flattens it to, its first dimension by the rest.

PyTorch with torch.optim.Muon (2.9 or later: PyPI's, not Debian's 1.13) is found as the
interpreter's own, or the one MPOPT_TORCH_PYTHON names (`python3 -m venv DIR && DIR/bin/pip install
torch`, then MPOPT_TORCH_PYTHON=DIR/bin/python). Exits 77 (skipped), saying so, without it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77


def reexec_with_torch():
    """This script under MPOPT_TORCH_PYTHON, if torch is missing here and that one is named."""
    other = os.environ.get("MPOPT_TORCH_PYTHON")
    if other and not os.environ.get("MPOPT_TORCH_REEXEC"):  # (a venv's python may link to this one)
        os.environ["MPOPT_TORCH_REEXEC"] = "1"
        os.execv(other, [other] + sys.argv)


try:
    import torch
except ImportError:
    reexec_with_torch()
    print("skipped: no PyTorch (install one with torch.optim.Muon from PyPI and set MPOPT_TORCH_PYTHON)")
    sys.exit(SKIP)
if not hasattr(torch.optim, "Muon"):
    reexec_with_torch()
    print(f"skipped: PyTorch {torch.__version__} has no torch.optim.Muon (2.9 or later has)")
    sys.exit(SKIP)

SHAPES = [[24, 10], [10, 24], [16, 16], [3, 4, 5]]


def torch_run(shapes, params, grads, o):
    """torch.optim.Muon's parameters after each step."""
    # torch.optim.Muon takes 2-D parameters only: a 3-D tensor goes in as the matrix mpopt flattens it
    # to, its first dimension by the rest (Keller Jordan's Muon's view of a convolution's weight).
    matrices = [[s[0], len(p) // s[0]] for p, s in zip(params, shapes)]
    tensors = [torch.tensor(p, dtype=torch.float32).reshape(m).requires_grad_() for p, m in zip(params, matrices)]
    adjust = None if o["adjust_lr_fn"] == "original" else o["adjust_lr_fn"]
    c = o["ns_coefficients"]
    opt = torch.optim.Muon(tensors, lr=o["lr"], weight_decay=o["weight_decay"], momentum=o["momentum"],
                           nesterov=o["nesterov"], ns_coefficients=(c["a"], c["b"], c["c"]), eps=o["eps"],
                           ns_steps=o["ns_steps"], adjust_lr_fn=adjust)
    out = []
    for step in grads:
        for t, g in zip(tensors, step):
            t.grad = torch.tensor(g, dtype=torch.float32).reshape(t.shape)
        opt.step()
        out.append([t.detach().reshape(-1).tolist() for t in tensors])
    return out


def mpopt_run(exe, shapes, params, grads, o, workdir):
    src, dst = os.path.join(workdir, "in.json"), os.path.join(workdir, "out.json")
    with open(src, "w") as f:
        json.dump({"options": o, "shapes": shapes, "params": params, "grads": grads}, f)
    env = dict(os.environ, MPOPT_MUON_STEPS_IN=src, MPOPT_MUON_STEPS_OUT=dst)
    subprocess.run([exe, "--test-case=muon_steps*", "--no-skip=true", "--minimal=true"], check=True, env=env)
    with open(dst) as f:
        return json.load(f)["params"]


def relative_moves(before, a, b):
    """Per step, max over tensors of ||a - b|| / ||b - before||, each movement from the last step's."""
    worst = []
    prev_a, prev_b = before, before
    for step_a, step_b in zip(a, b):
        w = 0.0
        for pa, pb, xa, xb in zip(prev_a, prev_b, step_a, step_b):
            da = torch.tensor(xa, dtype=torch.float64) - torch.tensor(pa, dtype=torch.float64)
            db = torch.tensor(xb, dtype=torch.float64) - torch.tensor(pb, dtype=torch.float64)
            w = max(w, float((da - db).norm() / db.norm()))
        worst.append(w)
        prev_a, prev_b = step_a, step_b
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--test-muon", required=True)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(46)
    sizes = [int(torch.tensor(s).prod()) for s in SHAPES]
    params = [(0.1 * torch.randn(n, generator=gen)).tolist() for n in sizes]
    grads = [[(0.01 * torch.randn(n, generator=gen)).tolist() for n in sizes] for _ in range(args.steps)]
    cases = []
    for nesterov in (True, False):
        for adjust in ("original", "match_rms_adamw"):
            cases.append(({"ns_steps": 0, "nesterov": nesterov, "adjust_lr_fn": adjust, "ns_precision": "bf16"}, 1e-3))
    for precision in ("bf16", "fp32"):
        cases.append(({"ns_steps": 5, "nesterov": True, "adjust_lr_fn": "original", "ns_precision": precision}, 8e-2))
    failed = 0
    with tempfile.TemporaryDirectory() as workdir:
        for settings, bound in cases:
            o = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "eps": 1e-7,
                 "ns_coefficients": {"a": 3.4445, "b": -4.775, "c": 2.0315}, **settings}
            ours = mpopt_run(args.test_muon, SHAPES, params, grads, o, workdir)
            theirs = torch_run(SHAPES, params, grads, o)
            worst = max(relative_moves(params, ours, theirs))
            ok = worst < bound
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {json.dumps(settings)}: worst step {worst:.2e} (bound {bound:.0e})")
    print(f"PyTorch {torch.__version__}: {len(cases) - failed} of {len(cases)} cases within their bounds")
    sys.exit(1 if failed else 0)


main()
