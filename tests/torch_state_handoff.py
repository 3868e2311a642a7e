#!/usr/bin/env python3
"""Optimizer state handed over mid-run between PyTorch and mpopt (tools/mpopt_checkpoint.py
--optimizer): the losses after the handover agree, to float rounding, with the run that stayed.

  torch_state_handoff.py --train-gpt build/examples/train_gpt --data build/examples/kjv.txt \
                         [--steps N] [--more M] [--workdir DIR] [--tolerance 1e-4] [--threads 1]

The model is examples/train_gpt's (2 layers, width 64, context 32, batches of 8) in fp32 on one rank,
twinned in PyTorch by examples/gpt/torch_gpt.py
(as examples/gpt_vs_torch.py does): torch.optim.AdamW in two groups, LambdaLR with train_gpt's
warm-up and cosine over N + M steps, clipping to 1. Both start from train_gpt's initial weights.

  torch -> mpopt: PyTorch trains N steps and saves its state_dict and its optimizer's; import
                  --optimizer makes them a checkpoint train_gpt --load continues for M steps; PyTorch
                  continues M steps itself. A control, the same import with fresh optimizer state,
                  must differ by far more than the tolerance.
  mpopt -> torch: train_gpt trains N steps (--schedule-steps N+M) and saves; export --optimizer gives
                  PyTorch the weights and the AdamW state, loaded with load_state_dict and LambdaLR
                  resumed at step N; train_gpt continues M steps from its own checkpoint (with the
                  losses of its uninterrupted run, to the bit).
  round trip:     import(export(checkpoint at step N)) is that checkpoint: tensors bit for bit,
                  metadata and checksum.
  refusals:       a LAMB checkpoint; groups out of order or swapped tensors; two steps in a group;
                  AMSGrad; no --optimizer-class where it is needed, or the other kind of weight decay:
                  exit status 1, a message naming the problem, no output file.

Exits 1 if a check fails, 77 (skipped) without PyTorch.
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import torch
except ImportError:
    print("torch_state_handoff: PyTorch is not installed (Debian: apt-get install python3-torch): skipped")
    sys.exit(SKIP)

here = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(here, "..", "examples", "gpt"))
from torch_gpt import GPT, load_weights  # noqa: E402 (needs the path above)

ARGS = None
FAILURES = []


def check(cond, what):
    print(("  ok: " if cond else "  FAILED: ") + what)
    if not cond:
        FAILURES.append(what)
    return cond


def run(cmd, expect=0):
    cmd = [str(c) for c in cmd]
    env = dict(os.environ, OMP_NUM_THREADS=str(ARGS.threads), OMP_WAIT_POLICY="PASSIVE")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit("torch_state_handoff: exit status %d, expected %d: %s\n%s%s"
                 % (r.returncode, expect, " ".join(cmd), r.stdout[-3000:], r.stderr[-3000:]))
    return r


def tool(*args, expect=0):
    return run([sys.executable, ARGS.tool] + list(args), expect=expect)


def train_gpt(gpt, *args):
    return run([ARGS.train_gpt] + gpt.flags() + list(args))


def csv_losses(path):
    """{step: training loss} of a train_gpt --csv (its first row, before any step, has none)."""
    with open(path) as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r["loss"]}


def compare(what, theirs, ours, first):
    """Loss by loss from step `first` on; the largest relative difference against the tolerance."""
    rel = [abs(a - b) / abs(b) for a, b in zip(theirs, ours)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    check(len(theirs) == len(ours) == ARGS.more and rel[worst] <= ARGS.tolerance,
          "%s: steps %d..%d, largest relative loss difference %.2e at step %d (tolerance %.0e)"
          % (what, first, first + len(rel) - 1, rel[worst], first + worst, ARGS.tolerance))
    return rel[worst]


def path(name):
    return os.path.join(ARGS.workdir, name)


# --------------------------------------------------------------------------------------------

def torch_to_mpopt(gpt, init, init_pt):
    n, m = ARGS.steps, ARGS.more
    weights = load_weights(init_pt)
    opt = gpt.optimizer(weights)
    schedule = gpt.schedule(opt)
    for step in range(1, n + 1):
        gpt.train_step(weights, opt, schedule, step)
    model_pt, opt_pt = path("torch_model_%d.pt" % n), path("torch_adamw_%d.pt" % n)
    torch.save({k: w.detach().clone() for k, w in weights.items()}, model_pt)
    torch.save(opt.state_dict(), opt_pt)
    torch_after = [gpt.train_step(weights, opt, schedule, step) for step in range(n + 1, n + m + 1)]

    # torch 1.13's weights_only loader reads no Python floats, which an optimizer state_dict holds.
    imported = path("from_torch.safetensors")
    tool("import", model_pt, "--like", init, "-o", imported, "--optimizer", opt_pt, "--optimizer-class", "AdamW",
         "--trust-pickle")
    info = tool("info", imported).stdout
    check("%d applied steps" % n in info and info.count("step %d," % n) == 2,
          "the import is at step %d, both groups too" % n)
    out_csv = path("from_torch.csv")
    train_gpt(gpt, "--load", imported, "--steps", m, "--csv", out_csv)
    mpopt_after = csv_losses(out_csv)
    check(sorted(mpopt_after) == list(range(n + 1, n + m + 1)), "train_gpt --load numbers its steps on from %d" % n)
    worst = compare("torch -> mpopt", [mpopt_after[s] for s in sorted(mpopt_after)], torch_after, n + 1)

    # The control: the same weights with fresh optimizer state go elsewhere.
    fresh = path("from_torch_fresh.safetensors")
    tool("import", model_pt, "--like", init, "-o", fresh)
    fresh_csv = path("from_torch_fresh.csv")
    train_gpt(gpt, "--load", fresh, "--steps", m, "--csv", fresh_csv)
    control = csv_losses(fresh_csv)
    apart = max(abs(a - b) / abs(b) for a, b in zip(control.values(), torch_after))
    check(apart > 100 * ARGS.tolerance, "control: with fresh optimizer state instead, a difference of %.2e" % apart)
    return worst, opt_pt, model_pt


def mpopt_to_torch(gpt, init):
    n, m = ARGS.steps, ARGS.more
    saved = path("mpopt_%d.safetensors" % n)
    train_gpt(gpt, "--steps", n, "--schedule-steps", n + m, "--save", saved)
    cont_csv = path("mpopt_continued.csv")
    train_gpt(gpt, "--load", saved, "--steps", m, "--csv", cont_csv)
    mpopt_after = csv_losses(cont_csv)
    whole_csv = path("mpopt_whole.csv")
    train_gpt(gpt, "--steps", n + m, "--csv", whole_csv)
    whole = csv_losses(whole_csv)
    check(all(whole[s] == mpopt_after[s] for s in mpopt_after) and len(mpopt_after) == m,
          "train_gpt cut in two (--steps %d --schedule-steps %d --save, --load --steps %d): the losses of the "
          "uninterrupted run" % (n, n + m, m))
    with open(cont_csv) as f:
        mpopt_lr = {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f) if r["loss"]}

    model_pt, opt_pt = path("mpopt_model_%d.pt" % n), path("mpopt_adamw_%d.pt" % n)
    tool("export", saved, model_pt, "--optimizer", opt_pt)
    state = torch.load(opt_pt)
    weights = load_weights(model_pt)
    # The groups as the export lists them (param_names), then the state and the schedule's position.
    opt = torch.optim.AdamW([{"params": [weights[k] for k in g["param_names"]]} for g in state["param_groups"]])
    opt.load_state_dict(state)
    schedule = gpt.schedule(opt, steps_taken=n)
    check(abs(opt.param_groups[0]["lr"] - mpopt_lr[n + 1]) <= 1e-5 * mpopt_lr[n + 1],
          "LambdaLR resumed at step %d: lr %.6g, train_gpt's %.6g" % (n + 1, opt.param_groups[0]["lr"],
                                                                      mpopt_lr[n + 1]))
    check([g["weight_decay"] for g in opt.param_groups] == [gpt.weight_decay, 0.0] and
          all(g["betas"] == (0.9, 0.99) and g["eps"] == 1e-8 for g in opt.param_groups),
          "the param groups' weight decay, betas and eps are train_gpt's")
    check(all(float(s["step"]) == n for s in opt.state.values()) and len(opt.state) == len(weights),
          "every parameter's state is at step %d" % n)
    torch_after = [gpt.train_step(weights, opt, schedule, step) for step in range(n + 1, n + m + 1)]
    return compare("mpopt -> torch", torch_after, [mpopt_after[s] for s in sorted(mpopt_after)], n + 1), saved


def round_trip(init, saved):
    model_pt, opt_pt = path("round_trip_model.pt"), path("round_trip_adamw.pt")
    tool("export", saved, model_pt, "--optimizer", opt_pt)
    back = path("round_trip.safetensors")
    tool("import", model_pt, "--like", init, "-o", back, "--optimizer", opt_pt, "--optimizer-class", "AdamW",
         "--trust-pickle")
    check(read_safetensors(back) == read_safetensors(saved),
          "import(export(checkpoint at step %d)): the checkpoint's tensors, bit for bit, and its metadata, "
          "checksum included" % ARGS.steps)


def read_safetensors(path):
    """A safetensors file as (its header, tensor by tensor, and metadata; its data section)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), f.read()


def refused(args, words, outputs):
    for o in outputs:
        if os.path.exists(o):
            os.remove(o)
    r = tool(*args, expect=1)
    message = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    check(all(w in message for w in words) and not any(os.path.exists(o) for o in outputs),
          "refused (%s): %s" % (", ".join(words), message))


def refusals(gpt, init, torch_opt, torch_model):
    lamb = path("lamb.safetensors")
    train_gpt(gpt, "--rule", "lamb", "--steps", 0, "--save", lamb)
    m, o = path("lamb_model.pt"), path("lamb_opt.pt")
    refused(["export", lamb, m, "--optimizer", o], ["rule 'lamb'"], [m, o])

    out = path("refused.safetensors")
    base = ["import", torch_model, "--like", init, "-o", out, "--trust-pickle", "--optimizer"]
    state = torch.load(torch_opt)

    def variant(name, change):
        s = torch.load(torch_opt)
        change(s)
        p = path(name)
        torch.save(s, p)
        return p

    sizes = [len(g["params"]) for g in state["param_groups"]]
    swapped = variant("groups_swapped.pt", lambda s: s["param_groups"].reverse())
    refused(base + [swapped, "--optimizer-class", "AdamW"],
            ["param group 0 has %d parameters" % sizes[1], "group 0 has %d" % sizes[0]], [out])
    first, second = state["param_groups"][0]["params"][:2]  # wte [vocabulary, width], wpe [context, width]
    shapes = {k: list(v.shape) for k, v in torch.load(torch_model).items()}

    def swap_tensors(s):
        s["state"][first], s["state"][second] = s["state"][second], s["state"][first]
    refused(base + [variant("tensors_swapped.pt", swap_tensors), "--optimizer-class", "AdamW"],
            ["'wte'", "shape [%d, %d]" % tuple(shapes["wpe"]), "[%d, %d]" % tuple(shapes["wte"])], [out])

    def two_steps(s):
        s["state"][second]["step"] = s["state"][second]["step"] + 1
    refused(base + [variant("two_steps.pt", two_steps), "--optimizer-class", "AdamW"],
            ["one step per group"], [out])

    def amsgrad(s):
        s["param_groups"][0]["amsgrad"] = True
        s["state"][first]["max_exp_avg_sq"] = s["state"][first]["exp_avg_sq"].clone()
    refused(base + [variant("amsgrad.pt", amsgrad), "--optimizer-class", "AdamW"], ["max_exp_avg_sq"], [out])
    # Which class wrote a state_dict with weight decay: said by --optimizer-class where the groups
    # do not say it (older PyTorch wrote no decoupled_weight_decay), checked against them where
    # they do.
    def unsaid(s):
        for g in s["param_groups"]:
            g.pop("decoupled_weight_decay", None)
    older = variant("unsaid.pt", unsaid)
    refused(base + [older], ["--optimizer-class AdamW or Adam"], [out])
    refused(base + [older, "--optimizer-class", "Adam"],
            ["weight decay is Adam's (L2)", "template's group 0's AdamW's (decoupled)"], [out])
    if "decoupled_weight_decay" in state["param_groups"][0]:
        refused(base + [torch_opt, "--optimizer-class", "Adam"],
                ["decoupled_weight_decay True", "--optimizer-class is Adam"], [out])


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-gpt", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--tool", default=os.path.join(here, "..", "tools", "mpopt_checkpoint.py"))
    p.add_argument("--steps", type=int, default=30, help="N: steps before the handover (more than the warm-up's 20)")
    p.add_argument("--more", type=int, default=30, help="M: steps after it")
    p.add_argument("--workdir", help="for the checkpoints and CSVs (default: a temporary directory)")
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--threads", type=int, default=1)
    ARGS = p.parse_args()
    ARGS.tool = os.path.abspath(ARGS.tool)
    torch.set_num_threads(ARGS.threads)
    with tempfile.TemporaryDirectory() as scratch:
        ARGS.workdir = os.path.abspath(ARGS.workdir or scratch)
        os.makedirs(ARGS.workdir, exist_ok=True)
        n, m = ARGS.steps, ARGS.more
        gpt = GPT(ARGS.data, total_steps=n + m, layers=2, width=64, context=32, batch=8)  # train_gpt's test size
        print("torch_state_handoff: %d + %d fp32 AdamW steps, PyTorch %s, %d thread(s)"
              % (n, m, torch.__version__, ARGS.threads))
        # The template and the common start: train_gpt's weights before its first step, with the
        # schedule of the whole run.
        init, init_pt = path("init.safetensors"), path("init.pt")
        train_gpt(gpt, "--steps", 0, "--schedule-steps", n + m, "--save", init)
        tool("export", init, init_pt)
        print("== torch -> mpopt")
        to_mpopt, torch_opt, torch_model = torch_to_mpopt(gpt, init, init_pt)
        print("== mpopt -> torch")
        to_torch, saved = mpopt_to_torch(gpt, init)
        print("== round trip")
        round_trip(init, saved)
        print("== refusals")
        refusals(gpt, init, torch_opt, torch_model)
        print(json.dumps({"torch_to_mpopt_max_rel": to_mpopt, "mpopt_to_torch_max_rel": to_torch}))
    if FAILURES:
        print("\n%d check(s) failed:\n  %s" % (len(FAILURES), "\n  ".join(FAILURES)))
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
