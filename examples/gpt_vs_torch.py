#!/usr/bin/env python3
"""train_gpt against PyTorch: the same model, weights, batches and AdamW, loss by loss.

  gpt_vs_torch.py --train-gpt build/examples/train_gpt --data build/examples/kjv.txt \
                  [--steps 100] [--out DIR] [--plot gpt_vs_torch.png] [--tolerance 1e-4]

1. train_gpt saves its initial weights (--steps 0 --save) and then trains in fp32 for --steps steps on
   one rank, writing each step's loss (--csv).
2. This script builds the same transformer from torch.nn.functional (token and position embeddings,
   pre-LayerNorm blocks of causal self-attention and a tanh-GELU MLP, a final LayerNorm, the output
   tied to the token embedding), loads those weights through tools/mpopt_checkpoint.py export, draws
   the same batches (train_gpt's splitmix64 windows, redone here), and trains with torch.optim.AdamW:
   weight decay on the 2-D tensors only, betas (0.9, 0.99), the same warm-up and cosine schedule
   (torch.optim.lr_scheduler.LambdaLR), torch.nn.utils.clip_grad_norm_ to 1.
3. It prints the largest relative difference between the two runs' losses over the steps, plots both
   curves on one PNG (gnuplot), and exits 1 if the difference is above --tolerance.

Needs PyTorch (Debian's python3-torch) and numpy; exits 77 (a skipped test) without PyTorch.
"""

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("gpt_vs_torch: PyTorch is not installed (Debian: apt-get install python3-torch): skipped")
    sys.exit(77)
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
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

# The model and schedule both sides use (train_gpt's flags).
layers, heads, width, context, batch = 4, 4, 128, 64, 16
lr, warmup, weight_decay, seed = 2e-3, 20, 0.1, 1
flags = ["--precision", "fp32", "--layers", str(layers), "--heads", str(heads), "--width", str(width),
         "--context", str(context), "--batch", str(batch), "--lr", str(lr), "--warmup", str(warmup),
         "--weight-decay", str(weight_decay), "--seed", str(seed), "--data", args.data, "--sample", "0",
         "--print-every", "0", "--eval-windows", "1"]
env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
torch.set_num_threads(args.threads)


def run(cmd):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gpt_vs_torch: failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


# --- The text and the batches, as train_gpt makes them ---------------------------------------------
text = open(args.data, "rb").read()
alphabet = sorted(set(text))
token = {b: i for i, b in enumerate(alphabet)}
train_text = np.array([token[b] for b in text[:len(text) - len(text) // 10]], dtype=np.int64)
mask = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & mask
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return state, z ^ (z >> 31)


def batch_of(step):  # one rank, one micro-step
    state, _ = splitmix64(seed ^ (step << 20))
    windows = len(train_text) - context
    starts = []
    for _ in range(batch):
        state, r = splitmix64(state)
        starts.append(r % windows)
    x = np.stack([train_text[s:s + context] for s in starts])
    y = np.stack([train_text[s + 1:s + 1 + context] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def lr_factor(k):
    """train_gpt's schedule at k steps taken, as transformers' get_cosine_with_min_lr_schedule_with_warmup
    (min_lr_rate 0.1) writes it."""
    if k < warmup:
        return k / max(1, warmup)
    progress = (k - warmup) / max(1, args.steps - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)) * (1 - 0.1) + 0.1)


# --- The model ----------------------------------------------------------------------------------------
def forward(w, x, y):
    B, T = x.shape
    hs = width // heads
    h = w["wte"][x] + w["wpe"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(layers):
        p = f"h.{l}."
        a = F.layer_norm(h, (width,), w[p + "ln1.weight"], w[p + "ln1.bias"], eps=1e-5)
        q, k, v = F.linear(a, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"]).split(width, dim=2)
        q, k, v = (t.view(B, T, heads, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, width)
        h = h + F.linear(o, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
        m = F.layer_norm(h, (width,), w[p + "ln2.weight"], w[p + "ln2.bias"], eps=1e-5)
        m = F.gelu(F.linear(m, w[p + "mlp.fc.weight"], w[p + "mlp.fc.bias"]), approximate="tanh")
        h = h + F.linear(m, w[p + "mlp.proj.weight"], w[p + "mlp.proj.bias"])
    h = F.layer_norm(h, (width,), w["lnf.weight"], w["lnf.bias"], eps=1e-5)
    logits = h @ w["wte"].t()
    return F.cross_entropy(logits.view(B * T, -1), y.reshape(-1))


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
    weights = {k: torch.nn.Parameter(v) for k, v in torch.load(exported).items()}
    with open(mpopt_csv) as f:
        mpopt_loss = [float(r["loss"]) for r in csv.DictReader(f) if r["loss"]]  # row 0: before any step

    decay = [w for w in weights.values() if w.dim() == 2]
    no_decay = [w for w in weights.values() if w.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.99), eps=1e-8)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    torch_loss = []
    for step in range(1, args.steps + 1):
        x, y = batch_of(step)
        loss = forward(weights, x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), 1.0)
        opt.step()
        schedule.step()
        torch_loss.append(loss.item())

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
