#!/usr/bin/env python3
"""train_gpt against PyTorch: the same model, weights, batches and AdamW, loss by loss.

  gpt_vs_torch.py --train-gpt build/examples/train_gpt --data build/examples/kjv.txt \
                  [--steps 100] [--out DIR] [--plot gpt_vs_torch.png] [--tolerance 1e-4]

1. train_gpt saves its initial weights (--steps 0 --save) and then trains in fp32 for --steps steps on
   one rank, writing each step's loss (--csv).
2. This script builds the same transformer from torch.nn.functional (token and position embeddings,
   pre-LayerNorm blocks of causal self-attention and a tanh-GELU MLP, a final LayerNorm, the output
   tied to the token embedding; gpt/torch_gpt.py), loads those weights through
   tools/mpopt_checkpoint.py export, draws the same batches (train_gpt's splitmix64 windows, redone
   here), and trains with torch.optim.AdamW: weight decay on the 2-D tensors only, betas (0.9, 0.99),
   the same warm-up and cosine schedule (torch.optim.lr_scheduler.LambdaLR),
   torch.nn.utils.clip_grad_norm_ to 1.
3. It prints the largest relative difference between the two runs' losses over the steps, plots both
   curves on one PNG (gnuplot), and exits 1 if the difference is above --tolerance.

Needs PyTorch (Debian's python3-torch) and numpy; exits 77 (a skipped test) without PyTorch.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("gpt_vs_torch: PyTorch is not installed (Debian: apt-get install python3-torch): skipped")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(here, "gpt"))
from torch_gpt import GPT, load_weights  # noqa: E402 (needs the path above)
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--train-gpt", required=True)
p.add_argument("--data", required=True)
p.add_argument("--tool", default=os.path.join(here, "..", "tools", "mpopt_checkpoint.py"))
p.add_argument("--steps", type=int, default=100)
p.add_argument("--out", default=None, help="directory for the checkpoint, CSVs and plot (default: a temporary one)")
p.add_argument("--plot", default=None, help="the PNG (default: OUT/gpt_vs_torch.png when --out is given)")
p.add_argument("--tolerance", type=float, default=1e-4)
p.add_argument("--threads", type=int, default=2)
args = p.parse_args()

# The model, batches and schedule both sides use (gpt/torch_gpt.py).
gpt = GPT(args.data, total_steps=args.steps)
flags = gpt.flags()
env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
torch.set_num_threads(args.threads)


def run(cmd):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gpt_vs_torch: failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


with tempfile.TemporaryDirectory() as scratch:
    out = args.out or scratch
    os.makedirs(out, exist_ok=True)
    init = os.path.join(out, "gpt_init.mpopt")
    run([args.train_gpt] + flags + ["--steps", "0", "--save", init])
    mpopt_csv = os.path.join(out, "gpt_mpopt.csv")
    run([args.train_gpt] + flags + ["--steps", str(args.steps), "--eval-every", str(max(1, args.steps)),
                                    "--csv", mpopt_csv])
    exported = os.path.join(out, "gpt_init.pt")
    run([sys.executable, args.tool, "export", init, exported, "--weights", "master"])
    weights = load_weights(exported)
    with open(mpopt_csv) as f:
        mpopt_loss = [float(r["loss"]) for r in csv.DictReader(f) if r["loss"]]  # row 0: before any step

    opt = gpt.optimizer(weights)
    schedule = gpt.schedule(opt)
    torch_loss = [gpt.train_step(weights, opt, schedule, step) for step in range(1, args.steps + 1)]

    rel = [abs(a - b) / abs(b) for a, b in zip(mpopt_loss, torch_loss)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    print(f"{args.steps} fp32 AdamW steps, {sum(w.numel() for w in weights.values())} parameters, "
          f"{torch.get_num_threads()} threads (PyTorch {torch.__version__})")
    print(f"loss at step 1: mpopt {mpopt_loss[0]:.6f}, PyTorch {torch_loss[0]:.6f}; at step {args.steps}: "
          f"mpopt {mpopt_loss[-1]:.6f}, PyTorch {torch_loss[-1]:.6f}")
    print(f"largest relative loss difference: {rel[worst]:.2e} at step {worst + 1} (tolerance {args.tolerance:.0e})")

    both = os.path.join(out, "gpt_vs_torch.csv")
    with open(both, "w") as f:
        f.write("step,mpopt,torch,relative_difference\n")
        for i, (a, b) in enumerate(zip(mpopt_loss, torch_loss)):
            f.write(f"{i + 1},{a:.8f},{b:.8f},{rel[i]:.3e}\n")
    plot = args.plot or (os.path.join(out, "gpt_vs_torch.png") if args.out else None)
    if plot:
        script = f"""set terminal pngcairo size 900,500 font ',11'
set output '{plot}'
set datafile separator ','
set key top right
set xlabel 'step'
set ylabel 'training loss (fp32)'
set y2label 'relative difference'
set y2tics
set logscale y2
set format y2 '%.0e'
set title 'train\\_gpt (mpopt AdamW) against PyTorch (torch.optim.AdamW): same weights, batches, schedule'
plot '{both}' every ::1 using 1:2 with lines lw 3 lc rgb '#1f77b4' title 'mpopt', \\
     '' every ::1 using 1:3 with lines lw 1.5 dt 2 lc rgb '#d62728' title 'PyTorch', \\
     '' every ::1 using 1:($4 > 0 ? $4 : 1e-9) axes x1y2 with points pt 7 ps 0.4 lc rgb '#7f7f7f' title '|difference| / loss'
"""
        r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
        if r.returncode != 0:
            sys.exit(f"gpt_vs_torch: gnuplot failed: {r.stderr}")
        print(f"wrote {plot}")
    sys.exit(0 if rel[worst] <= args.tolerance else 1)
