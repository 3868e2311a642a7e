"""train_gpt's model, batches and schedule in PyTorch, for the scripts that hold the two side by side
(examples/gpt_vs_torch.py, tests/torch_state_handoff.py).

The transformer is built from torch.nn.functional on a dict of named weights (token and position
embeddings, pre-LayerNorm blocks of causal self-attention and a tanh-GELU MLP, a final LayerNorm, the
output tied to the token embedding); the batches are train_gpt's splitmix64 windows, redone here; the
optimizer is torch.optim.AdamW with train_gpt's two groups and the schedule its warm-up and cosine.
Needs PyTorch and numpy.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


class GPT:
    """One setup of train_gpt (fp32, one rank) and its PyTorch twin. total_steps is the schedule's
    length: train_gpt's --steps, or --schedule-steps for a run cut in two."""

    def __init__(self, data, total_steps, layers=4, heads=4, width=128, context=64, batch=16, lr=2e-3, warmup=20,
                 weight_decay=0.1, seed=1):
        self.data, self.total_steps = data, total_steps
        self.layers, self.heads, self.width, self.context, self.batch = layers, heads, width, context, batch
        self.lr, self.warmup, self.weight_decay, self.seed = lr, warmup, weight_decay, seed
        text = open(data, "rb").read()
        token = np.zeros(256, dtype=np.int64)  # byte -> token id: the file's distinct bytes in byte order
        alphabet = sorted(set(text))
        token[alphabet] = np.arange(len(alphabet))
        self.train_text = token[np.frombuffer(text[:len(text) - len(text) // 10], dtype=np.uint8)]

    def flags(self):
        """train_gpt's flags for this setup, less --steps and --schedule-steps."""
        return ["--precision", "fp32", "--layers", str(self.layers), "--heads", str(self.heads),
                "--width", str(self.width), "--context", str(self.context), "--batch", str(self.batch),
                "--lr", str(self.lr), "--warmup", str(self.warmup), "--weight-decay", str(self.weight_decay),
                "--seed", str(self.seed), "--data", self.data, "--sample", "0", "--print-every", "0",
                "--eval-windows", "1"]

    def batch_of(self, step):
        """The inputs and targets of a step (1-based), as train_gpt's fill_batch draws them on one rank."""
        state, _ = splitmix64(self.seed ^ (step << 20))
        windows = len(self.train_text) - self.context
        starts = []
        for _ in range(self.batch):
            state, r = splitmix64(state)
            starts.append(r % windows)
        x = np.stack([self.train_text[s:s + self.context] for s in starts])
        y = np.stack([self.train_text[s + 1:s + 1 + self.context] for s in starts])
        return torch.from_numpy(x), torch.from_numpy(y)

    def lr_factor(self, k):
        """train_gpt's schedule at k steps taken, as transformers' get_cosine_with_min_lr_schedule_with_warmup
        (min_lr_rate 0.1) writes it."""
        if k < self.warmup:
            return k / max(1, self.warmup)
        progress = (k - self.warmup) / max(1, self.total_steps - self.warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)) * (1 - 0.1) + 0.1)

    def loss(self, w, x, y):
        B, T = x.shape
        width, heads = self.width, self.heads
        hs = width // heads
        h = w["wte"][x] + w["wpe"][:T]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.layers):
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

    def optimizer(self, weights):
        """train_gpt's AdamW: group 0 the 2-D tensors with weight decay, group 1 the rest without, each in
        the order of `weights` (an export's, which is the checkpoint's)."""
        decay = [w for w in weights.values() if w.dim() == 2]
        no_decay = [w for w in weights.values() if w.dim() != 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": self.weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}], lr=self.lr, betas=(0.9, 0.99), eps=1e-8)

    def schedule(self, opt, steps_taken=0):
        """The schedule, its next step being steps_taken + 1. Resuming (steps_taken > 0) needs each
        group's initial_lr, which an exported or saved optimizer state holds."""
        return torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor, last_epoch=steps_taken - 1)

    def train_step(self, weights, opt, schedule, step):
        """One step on step's batch, as train_gpt takes it (clipping to a global norm of 1); its loss."""
        x, y = self.batch_of(step)
        loss = self.loss(weights, x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), 1.0)
        opt.step()
        schedule.step()
        return loss.item()


def load_weights(path):
    """An export's state_dict as trainable parameters, in its order."""
    return {k: torch.nn.Parameter(v) for k, v in torch.load(path).items()}
