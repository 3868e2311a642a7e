#!/usr/bin/env python3
"""train_gpt on 1 rank and on 2 ranks under ZeRO-2 must reach the same parameters, bit for bit.

  gpt_ranks.py TRAIN_GPT MPIRUN CHECKPOINT_TOOL TEXT

Both runs see the same global batch of 4 windows: 2 ranks train on 2 windows each, 1 rank on the
same 2 and then the other 2, accumulating 2 micro-batches (train_gpt gives micro-step m on rank r
the (m x ranks + r)-th share). The 2-rank run sums the ranks' gradients by a reduce-scatter into
shards and steps each shard on its own rank, then gathers the parameters; the 1-rank run folds
its two micro-steps into one accumulator and steps everything at once. The arithmetic is the same
(a + b, then a halving, then AdamW element by element), so the parameters after 1 and after 3 fp32
steps must be equal to the bit, tensor by tensor (tools/mpopt_checkpoint.py export). Without
clipping: the global norm sums its squares in another order on shards, and Adam turns the
rounding noise of a gradient that is zero in exact arithmetic (the attention's key bias) into
steps of up to lr/100, which a bitwise test would see.

The test also checks that the steps moved the parameters, so that it can fail.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

exe, mpirun, tool, text = sys.argv[1:5]
lr = 1e-2
common = ["--data", text, "--precision", "fp32", "--layers", "2", "--heads", "2", "--width", "32", "--context", "16",
          "--lr", str(lr), "--warmup", "0", "--clip", "0", "--eval-windows", "2", "--sample", "0", "--print-every", "0", "--seed", "3"]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")


def run(cmd):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")


def weights(checkpoint, work):
    """Tensor name -> float32 array, the masters of an mpopt checkpoint."""
    out = os.path.join(work, os.path.basename(checkpoint) + ".weights.safetensors")
    run([sys.executable, tool, "export", checkpoint, out, "--weights", "master"])
    with open(out, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {name: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=np.float32).reshape(e["shape"])
            for name, e in header.items()}


with tempfile.TemporaryDirectory() as work:
    def train(ranks, steps):
        path = os.path.join(work, f"np{ranks}_steps{steps}.mpopt")
        args = common + ["--steps", str(steps), "--save", path]
        if ranks == 1:
            run([exe, "--batch", "2", "--accumulate", "2"] + args)
        else:
            run([mpirun, "-np", str(ranks), exe, "--zero", "2", "--batch", "2"] + args)
        return weights(path, work)

    initial = train(1, 0)
    failed = False
    for steps in (1, 3):
        one, two = train(1, steps), train(2, steps)
        assert one.keys() == two.keys() == initial.keys(), "the runs hold different tensors"
        moved = max(float(np.abs(one[k] - initial[k]).max()) for k in one)
        differ = [k for k in one if not np.array_equal(one[k].view(np.uint32), two[k].view(np.uint32))]
        apart = max(float(np.abs(one[k] - two[k]).max()) for k in one)
        print(f"{steps} step(s): {len(one)} tensors moved up to {moved:.3e}; 1 rank vs 2 ranks ZeRO-2: "
              f"{len(differ)} tensors differ, by up to {apart:.3e}{' (' + ', '.join(differ) + ')' if differ else ''}")
        if moved < 0.1 * lr:
            print(f"FAIL: the steps moved the parameters by at most {moved:.3e}: the runs did not train")
            failed = True
        if differ:
            print("FAIL: 1 rank and 2 ranks reached different parameters")
            failed = True
    sys.exit(1 if failed else 0)
