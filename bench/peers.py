#!/usr/bin/env python3
"""peers.py: one AdamW step of mpopt, DeepSpeed's CPU Adam and PyTorch's AdamW, each against the
same minimal-traffic kernel, in one process.

What it measures: for every case (fp32/1, fp32/1000, fp16/1, bf16/1) and every peer, the ratio
t_limit / t_step, where t_limit is one run of mpopt's minimal-traffic kernel (bench/traffic.hpp: the
bytes an Adam update cannot avoid, 28 per parameter, moved with trivial arithmetic over the mpopt
handle's own buffers) and t_step one optimizer step of the peer over its own buffers of the same size.
A ratio of 1 means the step runs at the memory system's limit for that traffic.

How: per case, every buffer is written once and every peer makes one untimed step, the limit kernel
one untimed run; then R rounds of  limit, mpopt, limit, deepspeed, limit, torch-foreach, limit,
torch-fused, each run timed alone (time.perf_counter), each peer step paired with the limit run just
before it. Reported per (case, peer): median, min and max of the paired ratios over the rounds,
gbps = bytes_per_param * N / median step time, and the limit's GB/s (median of its paired runs).
Peers:
  mpopt                 bench/peer_shim.cpp through ctypes (fp32 master, m, v; no clipping);
  deepspeed_cpu_adam    deepspeed.ops.adam.DeepSpeedCPUAdam, its op JIT-built by CPUAdamBuilder;
  torch_adamw_foreach   torch.optim.AdamW(foreach=True);
  torch_adamw_fused     torch.optim.AdamW(fused=True) (CPU fused kernels: torch >= 2.4).
AdamW everywhere: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, bias correction, no
clipping, no AMSGrad. Params N(0, 0.02), grads N(0, 1e-3), written once before timing. A peer that
cannot be loaded, built or run is reported as "skipped" with the reason; the script exits 0.
After the timed cases a small problem (1000 params, 3 steps) checks every peer against a float64
AdamW, so that we know we time the same algorithm; a mismatch prints a warning, not a failure.

Output: a JSON line of versions, one JSON line per (case, peer) and per sanity check on stdout, then
a Markdown table; progress on stderr. Run it on an otherwise idle machine.

Install (Python 3.11, Linux x86-64, PyPI only; the torch wheel pulls the nvidia-* CUDA packages,
about 5 GB, which the CPU run does not use):
  python3 -m venv .venv-peers
  .venv-peers/bin/pip install --upgrade pip
  .venv-peers/bin/pip install torch numpy ninja py-cpuinfo        # torch 2.15.0 when written
  DS_BUILD_OPS=0 .venv-peers/bin/pip install --no-build-isolation deepspeed==0.19.6
  g++ -std=c++20 -O3 -fopenmp -shared -fPIC -Iinclude -Ibench -DNDEBUG -Wno-psabi -ffp-contract=off \\
      bench/peer_shim.cpp -o build/bench/libmpopt_peer_shim.so
  OMP_PROC_BIND=close .venv-peers/bin/python bench/peers.py [--quick] [--filter fp32] [--threads 2]
DeepSpeed's op is compiled on first use (about 70 s on 2 cores) into ~/.cache/torch_extensions;
DS_ACCELERATOR defaults to "cpu" here, so no CUDA toolkit or GPU is needed.
"""
import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
CASES = {"fp32/1": ("fp32", 1), "fp32/1000": ("fp32", 1000), "fp16/1": ("fp16", 1), "bf16/1": ("bf16", 1)}
PEERS = ["mpopt", "deepspeed_cpu_adam", "torch_adamw_foreach", "torch_adamw_fused"]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shim", default="build/bench/libmpopt_peer_shim.so", help="path of libmpopt_peer_shim.so")
    ap.add_argument("--params", type=int, help="parameters per case (default 2**26; 2**20 with --quick)")
    ap.add_argument("--repeat", type=int, help="timed rounds (default 11; 3 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2**20 params, 3 rounds")
    ap.add_argument("--filter", default="", help="run the cases whose name contains this")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads (default: all cores)")
    a = ap.parse_args()
    a.params = a.params or (2**20 if a.quick else 2**26)
    a.repeat = a.repeat or (3 if a.quick else 11)
    return a


ARGS = parse_args()
# Before torch (and its OpenMP runtime, which DeepSpeed's op and the shim share) is loaded.
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")  # the venv's ninja
try:
    import torch  # noqa: E402
except ImportError as e:  # every peer, and the buffers, need torch: report, do not fail
    why = f"torch not importable ({e}); install: see the docstring"
    print(f"peers.py: {why}", file=sys.stderr)
    for name in CASES:
        if ARGS.filter in name:
            for peer in PEERS:
                print(json.dumps({"bench": "peers", "case": name, "peer": peer, "skipped": why}))
    sys.exit(0)

torch.set_num_threads(ARGS.threads)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def emit(obj):
    print(json.dumps(obj), flush=True)


@contextlib.contextmanager
def stdout_to_stderr():
    """Sends what DeepSpeed prints (build log, printf from C++) to stderr: stdout carries JSON only."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def short(e):
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def split_sizes(n, tensors):
    q, r = divmod(n, tensors)
    return [q + 1] * r + [q] * (tensors - r)


# ---------------------------------------------------------------- loading the peers (once)

class Shim:
    def __init__(self, path):
        lib = ctypes.CDLL(os.path.abspath(path))  # after torch: the shim binds to the libgomp already loaded
        sz, vp, d = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_double
        lib.mpopt_peer_create.restype = vp
        lib.mpopt_peer_create.argtypes = [ctypes.c_char_p, sz, ctypes.POINTER(sz), ctypes.POINTER(vp),
                                          ctypes.POINTER(vp)] + [d] * 6
        lib.mpopt_peer_step.argtypes = [vp]
        lib.mpopt_peer_limit.restype, lib.mpopt_peer_limit.argtypes = d, [vp]
        lib.mpopt_peer_bytes_per_param.restype, lib.mpopt_peer_bytes_per_param.argtypes = sz, [vp]
        lib.mpopt_peer_error.restype = ctypes.c_char_p
        lib.mpopt_peer_destroy.argtypes = [vp]
        self.lib = lib

    def error(self):
        return self.lib.mpopt_peer_error().decode(errors="replace")


def load_deepspeed():
    """Returns (DeepSpeedCPUAdam, info dict) or raises; builds the op now so no case pays for it."""
    with stdout_to_stderr():
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.ops.op_builder import CPUAdamBuilder
        builder = CPUAdamBuilder()
        t0 = time.perf_counter()
        builder.load()
        built = time.perf_counter() - t0
    info = {"deepspeed": deepspeed.__version__, "ds_accelerator": get_accelerator().device_name(),
            "ds_cpu_adam_simd": builder.simd_width().replace("-D__", "").strip("_"),
            "ds_cpu_adam_arch": builder.cpu_arch(), "ds_op_load_s": round(built, 1)}
    return DeepSpeedCPUAdam, info


def torch_fused_adamw():
    """None when AdamW(fused=True) steps on CPU tensors, else the reason it does not."""
    try:
        p = torch.zeros(4, requires_grad=True)
        p.grad = torch.ones(4)
        torch.optim.AdamW([p], fused=True).step()
        return None
    except Exception as e:
        return f"AdamW(fused=True) fails on CPU in torch {torch.__version__}: {short(e)}"


def openmp_runtimes():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "omp" in line.split()[-1].rsplit("/", 1)[-1]})


def git_head():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


# ---------------------------------------------------------------- one peer over one case's buffers

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def tensors_for(p0, g0, dtype, sizes):
    """The peer's own parameters (with .grad) as separate tensors of the given sizes."""
    ps = []
    for p, g in zip(p0.split(sizes), g0.split(sizes)):
        t = p.to(dtype, copy=True).requires_grad_(True)
        t.grad = g.to(dtype, copy=True)
        ps.append(t)
    return ps


class MpoptPeer:
    def __init__(self, shim, precision, params):
        self.shim, self.params = shim, params
        n = len(params)
        sizes = (ctypes.c_size_t * n)(*[p.numel() for p in params])
        ptrs = (ctypes.c_void_p * n)(*[p.data_ptr() for p in params])
        grads = (ctypes.c_void_p * n)(*[p.grad.data_ptr() for p in params])
        self.h = shim.lib.mpopt_peer_create(precision.encode(), n, sizes, ptrs, grads, LR, *BETAS, EPS, WD, 0.0)
        if not self.h:
            raise RuntimeError(f"mpopt_peer_create: {shim.error()}")
        self.bytes_per_param = shim.lib.mpopt_peer_bytes_per_param(self.h)

    def step(self):
        if self.shim.lib.mpopt_peer_step(self.h) != 0:
            raise RuntimeError(f"mpopt_peer_step: {self.shim.error()}")

    def limit(self):
        return self.shim.lib.mpopt_peer_limit(self.h)

    def close(self):
        if self.h:
            self.shim.lib.mpopt_peer_destroy(self.h)
            self.h = self.params = None


class TorchPeer:
    """Any torch.optim-style optimizer over its own tensors (DeepSpeedCPUAdam is one)."""

    def __init__(self, make, params):
        self.params = params
        with stdout_to_stderr():
            self.opt = make(params)

    def step(self):
        self.opt.step()

    def close(self):
        self.opt = self.params = None


def notes(peer, precision, tensors, simd):
    if peer == "mpopt":
        return {"fp32": "fp32 params (= master), fp32 m, v",
                "fp16": "fp16 params/grads, fp32 master, m, v; loss scale 1, overflow check",
                "bf16": "bf16 params/grads, fp32 master, m, v"}[precision]
    if peer == "deepspeed_cpu_adam":
        n = f"{simd} build; " + ("fp32 params, m, v" if precision == "fp32" else
                                 f"{precision} params/grads updated in place, fp32 m, v, NO fp32 master (22 B/param)")
        return n + ("; one adam_update call per tensor (ZeRO-Offload passes one flat tensor)" if tensors > 1 else "")
    return {"torch_adamw_foreach": "AdamW(foreach=True): one multi-tensor op per formula term, several passes",
            "torch_adamw_fused": "AdamW(fused=True): one fused kernel"}[peer]


def skip_reason(peer, precision, loaded):
    if peer in loaded:
        return loaded[peer]
    if peer in ("torch_adamw_foreach", "torch_adamw_fused") and precision != "fp32":
        return ("no fp32 master: torch AdamW on 16-bit params keeps 16-bit m, v and updates in 16 bits "
                "(different algorithm and traffic; fp16 v underflows for g ~ 1e-3)")
    return None


def make_peer(peer, precision, params, shim, ds_adam):
    kw = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    if peer == "mpopt":
        return MpoptPeer(shim, precision, params)
    if peer == "deepspeed_cpu_adam":
        return TorchPeer(lambda ps: ds_adam(ps, bias_correction=True, adamw_mode=True, **kw), params)
    if peer == "torch_adamw_foreach":
        return TorchPeer(lambda ps: torch.optim.AdamW(ps, foreach=True, amsgrad=False, **kw), params)
    return TorchPeer(lambda ps: torch.optim.AdamW(ps, fused=True, amsgrad=False, **kw), params)


# ---------------------------------------------------------------- timing

def timed(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def run_case(name, n, skipped, shim, ds_adam, simd, versions):
    precision, tensors = CASES[name]
    sizes = split_sizes(n, tensors)
    base = {"bench": "peers", "case": name, "params": n, "tensors": tensors, "threads": ARGS.threads}
    reasons = {peer: why for peer in PEERS if (why := skip_reason(peer, precision, skipped)) is not None}
    if "mpopt" in reasons:  # the limit kernel runs on mpopt's buffers: nothing to compare against
        reasons = {peer: reasons.get(peer, f"no limit kernel: mpopt skipped ({reasons['mpopt']})") for peer in PEERS}
    gen = torch.Generator().manual_seed(1234)
    p0 = torch.randn(n, generator=gen) * 0.02 if len(reasons) < len(PEERS) else None
    g0 = torch.randn(n, generator=gen) * 1e-3 if p0 is not None else None
    peers = {}  # the peers still timed; `reasons` says why the others are not
    for peer in PEERS:
        if peer in reasons:
            continue
        if "mpopt" not in peers and peer != "mpopt":
            reasons[peer] = "no limit kernel (mpopt_peer_create failed)"
            continue
        try:
            peers[peer] = make_peer(peer, precision, tensors_for(p0, g0, DTYPES[precision], sizes), shim, ds_adam)
        except Exception as e:
            reasons[peer] = short(e)
    del p0, g0
    made = list(peers.values())  # closed at the end, even those dropped on an error
    results = []
    if "mpopt" in peers:
        mp = peers["mpopt"]
        bpp, sink = mp.bytes_per_param, 0.0
        for peer, obj in list(peers.items()):  # warm-up: state allocated and touched, code paths loaded
            try:
                obj.step()
            except Exception as e:
                reasons[peer] = f"warm-up step failed: {short(e)}"
                del peers[peer]
        sink += mp.limit()
        pairs = {peer: [] for peer in peers}
        for r in range(ARGS.repeat):
            for peer, obj in list(peers.items()):
                t0 = time.perf_counter()
                sink += mp.limit()  # the limit run paired with this peer's step
                tl = time.perf_counter() - t0
                try:
                    tp = timed(obj.step)
                except Exception as e:
                    reasons[peer] = f"step failed in round {r}: {short(e)}"
                    del peers[peer]
                    continue
                pairs[peer].append((tl, tp))
            log(f"  {name}: round {r + 1}/{ARGS.repeat}")
        for peer, ps in pairs.items():
            if peer in reasons:
                continue
            ratios = [tl / tp for tl, tp in ps]
            t_step = statistics.median(tp for _, tp in ps)
            t_lim = statistics.median(tl for tl, _ in ps)
            results.append(dict(base, peer=peer, version=versions[peer], bytes_per_param=bpp,
                                limit_ratio=round(statistics.median(ratios), 4),
                                limit_ratio_min=round(min(ratios), 4), limit_ratio_max=round(max(ratios), 4),
                                step_ms=round(t_step * 1e3, 3), gbps=round(bpp * n / t_step / 1e9, 2),
                                limit_gbps=round(bpp * n / t_lim / 1e9, 2),
                                note=notes(peer, precision, tensors, simd)))
        log(f"  {name}: limit kernel checksum {sink:g}")  # uses the kernel's result
    for obj in made:
        obj.close()
    del made, peers
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # glibc keeps freed small tensors (fp32/1000) otherwise
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        log(f"  {name}: done; resident {int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**30:.2f} GiB")
    out = {r["peer"]: r for r in results}
    for peer in PEERS:
        row = out.get(peer) or dict(base, peer=peer, version=versions[peer], skipped=reasons.get(peer, "not run"))
        emit(row)
        yield row


# ---------------------------------------------------------------- sanity: the same algorithm?

def reference_adamw(p0, g0, steps, dtype, master):
    """AdamW in float64. master=False rounds the weights to `dtype` after every step (DeepSpeed's
    16-bit mode); master=True rounds once at the end (an fp32 master)."""
    w, g = p0.to(dtype).double(), g0.to(dtype).double()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t in range(1, steps + 1):
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        denom = v.sqrt() / (1 - BETAS[1] ** t) ** 0.5 + EPS
        w = w * (1 - LR * WD) - LR / (1 - BETAS[0] ** t) * m / denom
        if not master:
            w = w.to(dtype).double()
    return w.to(dtype).double()


def sanity(precision, skipped, shim, ds_adam, n=1000, steps=3):
    gen = torch.Generator().manual_seed(99)
    p0, g0 = torch.randn(n, generator=gen) * 0.02, torch.randn(n, generator=gen) * 1e-3
    dtype = DTYPES[precision]
    tol = {"fp32": 1e-6, "bf16": 2.0**-7, "fp16": 2.0**-10}[precision]  # about one ulp in 16 bits
    for peer in PEERS:
        if skip_reason(peer, precision, skipped) is not None:
            continue
        try:
            params = tensors_for(p0, g0, dtype, [n])
            obj = make_peer(peer, precision, params, shim, ds_adam)
            for _ in range(steps):
                obj.step()
            master = not (peer == "deepspeed_cpu_adam" and precision != "fp32")
            ref = reference_adamw(p0, g0, steps, dtype, master)
            err = ((params[0].detach().double() - ref).abs().max() / ref.abs().max()).item()
            obj.close()
        except Exception as e:
            emit({"bench": "peers", "sanity": precision, "peer": peer, "error": short(e)})
            continue
        row = {"bench": "peers", "sanity": precision, "peer": peer, "params": n, "steps": steps,
               "max_rel_err": float(f"{err:.3g}"), "tolerance": tol}
        if not err <= tol:
            row["warning"] = f"{peer} {precision} differs from float64 AdamW by {err:.3g} (> {tol:.3g})"
            log("WARNING: " + row["warning"])
        emit(row)


# ---------------------------------------------------------------- main

def main():
    import platform
    skipped, versions = {}, {"mpopt": git_head(), "torch_adamw_foreach": torch.__version__,
                             "torch_adamw_fused": torch.__version__, "deepspeed_cpu_adam": None}
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "mpopt": versions["mpopt"]}
    shim = None
    if not os.path.exists(ARGS.shim):
        log(f"error: no shim at {ARGS.shim}: build it (see the docstring); without it there is no limit kernel")
        for peer in PEERS:
            skipped[peer] = f"no shim at {ARGS.shim} (it also provides the limit kernel)"
    else:
        try:
            shim = Shim(ARGS.shim)
        except OSError as e:
            for peer in PEERS:
                skipped[peer] = f"cannot load the shim: {short(e)}"
    ds_adam, simd = None, "?"
    if shim is not None:
        log("loading DeepSpeed's CPU Adam (compiles the op on first use) ...")
        try:
            ds_adam, ds_info = load_deepspeed()
            info.update(ds_info)
            versions["deepspeed_cpu_adam"], simd = ds_info["deepspeed"], ds_info["ds_cpu_adam_simd"]
        except Exception as e:
            skipped["deepspeed_cpu_adam"] = f"deepspeed not usable: {short(e)}"
        why = torch_fused_adamw()
        if why:
            skipped["torch_adamw_fused"] = why
    info["openmp_runtimes"] = openmp_runtimes()
    emit({"bench": "peers", "versions": info, "threads": ARGS.threads, "params": ARGS.params,
          "repeat": ARGS.repeat, "omp_proc_bind": os.environ.get("OMP_PROC_BIND")})
    if len(info["openmp_runtimes"]) > 1:
        log(f"warning: more than one OpenMP runtime loaded: {info['openmp_runtimes']}")

    rows = []
    for name in CASES:
        if ARGS.filter in name:
            log(f"case {name}: {ARGS.params} params, {ARGS.repeat} rounds")
            rows += list(run_case(name, ARGS.params, skipped, shim, ds_adam, simd, versions))
    if shim is not None:
        for precision in dict.fromkeys(CASES[name][0] for name in CASES if ARGS.filter in name):
            sanity(precision, skipped, shim, ds_adam)

    print("\n| case | peer | limit_ratio median [min-max] | note |\n|---|---|---|---|")
    for r in rows:
        cell = (f"{r['limit_ratio']:.3f} [{r['limit_ratio_min']:.3f}-{r['limit_ratio_max']:.3f}]"
                if "skipped" not in r else "skipped")
        print(f"| {r['case']} | {r['peer']} | {cell} | {r.get('note') or r.get('skipped')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
