#!/usr/bin/env python3
"""Tests tools/mpopt_checkpoint.py on checkpoints the C++ side writes and reads: examples/train_mlp
--save (fp16, bf16 with LAMB, fp32, bf16 state with remainder16 masters; with --zero2, bf16 under
ZeRO-2 on two ranks) and --load.

  export: the masters (F32; remainder16's joined from parameter and remainder) and the parameters
          (F16, BF16, F32) bit for bit as the file holds them, with the shapes train_mlp registered
          ([out, in], [out]);
  import: from that export, from the parameters' export, from a sharded zero_to_fp32-style
          directory and from prefixed names, into a template train_mlp saved before its first
          step; the parameters rounded as the C++ optimizer rounds them (equal to the trained
          file's), the rest the template's; train_mlp --load takes it, saves it back unchanged and
          trains on from it;
  round trip: export(load(import(export(file)))) == export(file), byte for byte;
  quantized state (8-bit, 4-bit, fp8 codes with block scales): export --optimizer OPT.safetensors
          decodes the moments, with maps the tool writes from their definitions, to the bits the
          C++ side's load() into an fp32-state optimizer gives (train_mlp --load), and the
          remainder16 masters to its fp32 masters;
  refusals: a trained template, a corrupt file, shapes and names that do not match: exit status
          1, a message naming the problem, no output file;
  without numpy (MPOPT_CHECKPOINT_NO_NUMPY=1): info and export give the same bytes, import says
          it needs numpy.

With --torch, the PyTorch path instead (.pt export, torch.save / DeepSpeed sources, an nn.Module
loading the export); without PyTorch it reports itself skipped (exit status 77). Both need numpy:
the script re-runs itself under an interpreter that has it (python3 on PATH, /usr/bin/python3),
and without one it is skipped, saying why.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import traceback

SKIP = 77
NAMES = ["fc1.weight", "fc2.weight", "fc3.weight", "fc1.bias", "fc2.bias", "fc3.bias"]
SHAPES = {"fc1.weight": [64, 32], "fc2.weight": [64, 64], "fc3.weight": [10, 64],
          "fc1.bias": [64], "fc2.bias": [64], "fc3.bias": [10]}


# --------------------------------------------------------------------------------------------
# The interpreter: one with the modules this run needs.

def interpreter_with(modules):
    candidates = []
    for c in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if c and os.path.exists(c) and os.path.realpath(c) not in [os.path.realpath(x) for x in candidates]:
            candidates.append(c)
    for c in candidates:
        if subprocess.run([c, "-c", "import " + ", ".join(modules)], capture_output=True).returncode == 0:
            return c, candidates
    return None, candidates


def ensure_modules(modules, install_hint):
    try:
        for m in modules:
            __import__(m)
        return
    except ImportError:
        pass
    if os.environ.get("MPOPT_CHECKPOINT_TEST_REEXEC"):
        sys.exit("checkpoint_tool: re-run under another interpreter still lacks " + ", ".join(modules))
    found, tried = interpreter_with(modules)
    if found is None:
        print("SKIPPED: none of the Python interpreters here (%s) has %s: %s"
              % (", ".join(tried), " and ".join(modules), install_hint))
        sys.exit(SKIP)
    print("checkpoint_tool: %s lacks %s: running under %s" % (sys.executable, ", ".join(modules), found))
    sys.stdout.flush()
    os.environ["MPOPT_CHECKPOINT_TEST_REEXEC"] = "1"
    os.execv(found, [found] + sys.argv)


# --------------------------------------------------------------------------------------------
# A small harness: checks count, a failed check is reported and the case goes on; a failed
# command ends its case.

class CaseFailed(Exception):
    pass


class Harness:
    def __init__(self):
        self.checks = 0
        self.failures = []
        self.case = ""

    def check(self, cond, what):
        self.checks += 1
        if not cond:
            self.failures.append("%s: %s" % (self.case, what))
            print("  FAILED: " + what)
        return cond

    def run_case(self, name, fn, *args):
        self.case = name
        print("== " + name)
        sys.stdout.flush()
        try:
            fn(*args)
        except CaseFailed as e:
            self.failures.append("%s: %s" % (name, e))
            print("  FAILED: %s" % e)
        except Exception:
            self.failures.append("%s: exception" % name)
            traceback.print_exc()


H = Harness()
ARGS = None


def run(cmd, expect=0, env=None):
    cmd = [str(c) for c in cmd]
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, env=e)
    if expect is not None and p.returncode != expect:
        raise CaseFailed("exit status %d, expected %d: %s\n--- stdout\n%s--- stderr\n%s"
                         % (p.returncode, expect, " ".join(cmd), p.stdout[-3000:], p.stderr[-3000:]))
    return p


def tool(*args, expect=0, pure=False):
    env = {"MPOPT_CHECKPOINT_NO_NUMPY": "1"} if pure else {}
    return run([sys.executable, ARGS.tool] + list(args), expect=expect, env=env)


def refused(args, needle, output=None, pure=False):
    """The tool exits 1 saying `needle`, and leaves no `output` (nor its .tmp)."""
    p = tool(*args, expect=1, pure=pure)
    H.check(needle in p.stderr, "message %r contains %r" % (p.stderr.strip(), needle))
    H.check(p.stderr.startswith("mpopt_checkpoint: error: "), "message starts with 'mpopt_checkpoint: error: '")
    if output:
        H.check(not os.path.exists(output) and not os.path.exists(output + ".tmp"), "no %s written" % output)


def train(flags, *more, mpi=False):
    if mpi:
        cmd = [ARGS.mpirun, "-np", "2", ARGS.train_mlp]
    else:
        cmd = [ARGS.train_mlp]
    return run(cmd + list(flags) + ["--print-every", "0"] + list(more))


# --------------------------------------------------------------------------------------------
# safetensors files, read and written here independently of the tool.

def read_st(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", {})
    return header, meta, b[8 + n:]


def tensor_bytes(st, key):
    header, _, data = st
    begin, end = header[key]["data_offsets"]
    return data[begin:end]


def write_st(path, tensors, metadata=None):
    """tensors: (name, dtype, shape, bytes)."""
    header = {"__metadata__": metadata or {"format": "pt"}}
    offset, blobs = 0, []
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def widened(dtype, data):
    """16-bit floats -> float32 bytes, one by one with struct (exact for finite values)."""
    if dtype == "F32":
        return data
    out = bytearray()
    for (u,) in struct.iter_unpack("<H", data):
        if dtype == "BF16":
            out += struct.pack("<I", u << 16)
        else:
            out += struct.pack("<f", struct.unpack("<e", struct.pack("<H", u))[0])
    return bytes(out)


def in_file_order(st):
    return sorted(st[0], key=lambda k: st[0][k]["data_offsets"])


def same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def registered_names(st):
    return [t["name"] for g in json.loads(st[1]["mpopt"])["groups"] for t in g["tensors"]]


# --------------------------------------------------------------------------------------------
# The numpy cases.

CONFIGS = [  # name, train_mlp flags, parameter dtype
    ("fp16", ["--precision", "fp16", "--layout", "unfused"], "F16"),
    ("bf16_lamb", ["--precision", "bf16", "--rule", "lamb"], "BF16"),
    ("fp32", ["--precision", "fp32"], "F32"),
    ("bf16_state_remainder16", ["--precision", "bf16", "--state", "bf16", "--master", "remainder16", "--rule", "lamb"],
     "BF16"),
]


def make_checkpoints(d, flags, mpi=False):
    os.makedirs(d, exist_ok=True)
    trained, template = os.path.join(d, "trained.safetensors"), os.path.join(d, "template.safetensors")
    train(flags, "--steps", "25", "--save", trained, mpi=mpi)
    train(flags, "--steps", "0", "--save", template, mpi=mpi)
    return trained, template


def master_key(st, name):
    return "master/" + name if "master/" + name in st[0] else "param/" + name


def master_bytes(st, name):
    """The fp32 masters' bits: saved, joined from a remainder16 master's parameter and remainder
    (as integers, (param << 16) + remainder), or the fp32 parameters."""
    if "remainder/" + name not in st[0]:
        return tensor_bytes(st, master_key(st, name))
    param, remainder = tensor_bytes(st, "param/" + name), tensor_bytes(st, "remainder/" + name)
    n = len(param) // 2
    p, r = struct.unpack("<%dH" % n, param), struct.unpack("<%dh" % n, remainder)
    return struct.pack("<%dI" % n, *(((a << 16) + b) & 0xFFFFFFFF for a, b in zip(p, r)))


def case_config(name, flags, param_dtype):
    d = os.path.join(ARGS.workdir, name)
    trained, template = make_checkpoints(d, flags)
    tr, tp = read_st(trained), read_st(template)
    H.check(registered_names(tr) == NAMES, "the checkpoint registers %s" % NAMES)
    for n in NAMES:  # the C++ side stores the shapes train_mlp registered, for every tensor of a parameter
        for kind in ("param", "master", "remainder", "exp_avg", "exp_avg_sq"):
            key = kind + "/" + n
            if key in tr[0]:
                H.check(tr[0][key]["shape"] == SHAPES[n], "%s has shape %s" % (key, SHAPES[n]))
    H.check(tr[0]["param/fc1.weight"]["dtype"] == param_dtype, "parameters are %s" % param_dtype)

    info = tool("info", trained)
    H.check("[64, 32]" in info.stdout and "checksum ok" in info.stdout, "info lists shapes and the checksum")

    # export: masters, parameters, parameters widened.
    m, p, p32 = (os.path.join(d, f) for f in ("masters.safetensors", "params.safetensors", "params32.safetensors"))
    tool("export", trained, m)
    tool("export", trained, p, "--weights", "param")
    tool("export", trained, p32, "--weights", "param", "--float32")
    ms, ps, p32s = read_st(m), read_st(p), read_st(p32)
    H.check(list(ms[0]) == NAMES and list(ps[0]) == NAMES, "exports hold the tensors in registration order")
    H.check(ms[1].get("format") == "pt", "exports say format 'pt'")
    for n in NAMES:
        H.check(ms[0][n]["dtype"] == "F32" and ms[0][n]["shape"] == SHAPES[n], "masters %s: F32 %s" % (n, SHAPES[n]))
        H.check(tensor_bytes(ms, n) == master_bytes(tr, n), "masters %s: the file's bits" % n)
        H.check(ps[0][n]["dtype"] == param_dtype and ps[0][n]["shape"] == SHAPES[n], "params %s: %s" % (n, param_dtype))
        H.check(tensor_bytes(ps, n) == tensor_bytes(tr, "param/" + n), "params %s: the file's bits" % n)
        H.check(p32s[0][n]["dtype"] == "F32", "params --float32 %s: F32" % n)
        H.check(tensor_bytes(p32s, n) == widened(param_dtype, tensor_bytes(tr, "param/" + n)),
                "params --float32 %s: the parameters widened exactly" % n)

    # import the masters into the template.
    imp = os.path.join(d, "imported.safetensors")
    tool("import", m, "--like", template, "-o", imp)
    im = read_st(imp)
    H.check(in_file_order(im) == in_file_order(tp), "import keeps the template's tensors in its order")
    H.check(im[1]["mpopt"] == tp[1]["mpopt"] and im[1]["format"] == "mpopt-state",
            "import keeps the template's metadata")
    for key, e in im[0].items():
        kind, _, n = key.partition("/")
        H.check(e["dtype"] == tp[0][key]["dtype"], "%s keeps the template's dtype" % key)
        if kind in ("param", "master", "remainder"):
            # Parameters rounded by the tool (to nearest even; remainder16's, ties away) == by the optimizer.
            H.check(tensor_bytes(im, key) == tensor_bytes(tr, key), "%s: the trained file's bits" % key)
        else:
            H.check(tensor_bytes(im, key) == tensor_bytes(tp, key), "%s: the template's (fresh) bits" % key)
        if n in SHAPES:
            H.check(e["shape"] == SHAPES[n], "%s has shape %s" % (key, SHAPES[n]))
        if kind in ("exp_avg", "exp_avg_sq"):
            H.check(tensor_bytes(im, key).count(0) == len(tensor_bytes(im, key)), "%s is zero" % key)

    # The C++ side loads it (checksum, metadata, names, dtypes, shapes), saves it back unchanged,
    # and trains on from it.
    reloaded = os.path.join(d, "reloaded.safetensors")
    train(flags, "--load", imp, "--steps", "0", "--save", reloaded)
    re = read_st(reloaded)
    H.check(re[2] == im[2] and re[0] == im[0], "train_mlp --load, --save: the same tensors, bit for bit")
    H.check(json.loads(re[1]["mpopt"]) == json.loads(im[1]["mpopt"]), "train_mlp --load, --save: the same metadata")
    again = os.path.join(d, "masters_again.safetensors")
    tool("export", reloaded, again)
    H.check(same_file(again, m), "round trip: export(load(import(export))) == export, bytewise")
    train(flags, "--load", imp, "--steps", "20")  # exits nonzero unless the loss goes down

    # import the parameters in their own dtype: masters are the parameters widened.
    imp_p = os.path.join(d, "imported_params.safetensors")
    tool("import", p, "--like", template, "-o", imp_p)
    ip = read_st(imp_p)
    for n in NAMES:
        H.check(tensor_bytes(ip, "param/" + n) == tensor_bytes(tr, "param/" + n), "from params: param/%s bits" % n)
        H.check(master_bytes(ip, n) == tensor_bytes(p32s, n), "from params: the masters are the params widened")
    train(flags, "--load", imp_p, "--steps", "0")

    # zero_to_fp32's sharded output: a directory with model-0000k-of-00002.safetensors and the index.
    zdir = os.path.join(d, "zero_to_fp32")
    os.makedirs(zdir, exist_ok=True)
    shards = {"model-00001-of-00002.safetensors": NAMES[:2], "model-00002-of-00002.safetensors": NAMES[2:]}
    for f, names in shards.items():
        write_st(os.path.join(zdir, f), [(n, "F32", SHAPES[n], tensor_bytes(ms, n)) for n in names])
    with open(os.path.join(zdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(ms[2])},
                   "weight_map": {n: f for f, ns in shards.items() for n in ns}}, f)
    imp_z = os.path.join(d, "imported_zero.safetensors")
    tool("import", zdir, "--like", template, "-o", imp_z)
    H.check(same_file(imp_z, imp), "from a sharded zero_to_fp32 directory: the same file")

    # A wrapped model's names ("module.") and a buffer that is no parameter.
    wrapped = os.path.join(d, "wrapped.safetensors")
    write_st(wrapped, [("module." + n, "F32", SHAPES[n], tensor_bytes(ms, n)) for n in NAMES] +
             [("module.num_batches_tracked", "I64", [], struct.pack("<q", 7))])
    imp_w = os.path.join(d, "imported_wrapped.safetensors")
    refused(["import", wrapped, "--like", template, "-o", imp_w], "lacks 6 of the template's 6 tensors", imp_w)
    refused(["import", wrapped, "--like", template, "-o", imp_w, "--strip-prefix", "module."],
            "has 1 tensors the template does not: num_batches_tracked", imp_w)
    tool("import", wrapped, "--like", template, "-o", imp_w, "--strip-prefix", "module.", "--ignore-extra")
    H.check(same_file(imp_w, imp), "--strip-prefix, --ignore-extra: the same file")

    # Without numpy: the same bytes from info and export; import says what it needs.
    pure = os.path.join(d, "masters_pure.safetensors")
    H.check("checksum ok" in tool("info", trained, pure=True).stdout, "info without numpy")
    tool("export", trained, pure, pure=True)
    H.check(same_file(pure, m), "export without numpy: the same bytes")
    refused(["import", m, "--like", template, "-o", os.path.join(d, "x.safetensors")], "needs numpy", pure=True)
    return trained, template, m


def case_refusals(trained, template, masters):
    d = os.path.join(ARGS.workdir, "refusals")
    os.makedirs(d, exist_ok=True)
    out = os.path.join(d, "out.safetensors")
    ms = read_st(masters)
    refused(["import", masters, "--like", trained, "-o", out], "a template must be saved before the first step", out)

    def source_with(name, change):
        tensors = [(n, "F32", SHAPES[n], tensor_bytes(ms, n)) for n in NAMES]
        tensors = [t for t in (change(t) if t[0] == name else t for t in tensors) if t]
        path = os.path.join(d, "source.safetensors")
        write_st(path, tensors)
        return path
    src = source_with("fc1.weight", lambda t: (t[0], t[1], [32, 64], t[3]))
    refused(["import", src, "--like", template, "-o", out],
            "tensor 'fc1.weight': the source's shape is [32, 64], the template's [64, 32]", out)
    src = source_with("fc3.bias", lambda t: (t[0], t[1], [11], t[3] + b"\0\0\0\0"))
    refused(["import", src, "--like", template, "-o", out],
            "tensor 'fc3.bias': the source's shape [11] holds 11 elements", out)
    src = source_with("fc3.bias", lambda t: None)
    refused(["import", src, "--like", template, "-o", out], "lacks 1 of the template's 6 tensors: fc3.bias", out)
    src = source_with("fc2.bias", lambda t: (t[0], "I32", t[2], t[3]))
    refused(["import", src, "--like", template, "-o", out], "tensor 'fc2.bias' has dtype I32", out)
    refused(["import", trained, "--like", template, "-o", out], "is an mpopt checkpoint: export it", out)
    refused(["import", os.path.join(d, "nothing.safetensors"), "--like", template, "-o", out], "no such file", out)

    # A flipped bit in the data section; a file cut short; a file that is not an mpopt checkpoint.
    data = bytearray(open(trained, "rb").read())
    data[-5] ^= 0x10
    corrupt = os.path.join(d, "corrupt.safetensors")
    open(corrupt, "wb").write(data)
    refused(["export", corrupt, out], "checksum mismatch", out)
    refused(["info", corrupt], "checksum mismatch")
    refused(["import", masters, "--like", corrupt, "-o", out], "checksum mismatch", out)
    short = os.path.join(d, "short.safetensors")
    open(short, "wb").write(bytes(data[:len(data) // 2]))
    refused(["export", short, out], "truncated", out)
    refused(["export", masters, out], "not an mpopt checkpoint", out)
    refused(["export", trained, os.path.join(d, "out.npz")], "must end in .safetensors")


def case_zero2(template):
    """ZeRO-2 on two ranks: the file holds whole tensors with their shapes, like any other."""
    d = os.path.join(ARGS.workdir, "zero2")
    flags = ["--precision", "bf16", "--zero", "2"]
    trained, _ = make_checkpoints(d, flags, mpi=True)
    tr = read_st(trained)
    H.check(json.loads(tr[1]["mpopt"])["partition"] == "zero2", "saved under zero2")
    for n in NAMES:
        H.check(tr[0]["master/" + n]["shape"] == SHAPES[n] and tr[0]["exp_avg_sq/" + n]["shape"] == SHAPES[n],
                "zero2: master/ and exp_avg_sq/%s are whole, %s" % (n, SHAPES[n]))
    m = os.path.join(d, "masters.safetensors")
    tool("export", trained, m)
    ms = read_st(m)
    for n in NAMES:
        H.check(tensor_bytes(ms, n) == tensor_bytes(tr, "master/" + n), "zero2 masters %s: the file's bits" % n)
    # Imported into a single-process template of the same options, loaded on two ranks under zero2.
    imp = os.path.join(d, "imported.safetensors")
    tool("import", m, "--like", template, "-o", imp)
    reloaded = os.path.join(d, "reloaded.safetensors")
    train(flags, "--load", imp, "--steps", "0", "--save", reloaded, mpi=True)
    im, re = read_st(imp), read_st(reloaded)
    H.check(re[2] == im[2] and re[0] == im[0], "zero2 --load, --save: the same tensors, bit for bit")
    again = os.path.join(d, "masters_again.safetensors")
    tool("export", reloaded, again)
    H.check(same_file(again, m), "zero2 round trip: export == export, bytewise")


def case_safetensors_package(trained, masters, params32):
    try:
        import numpy as np
        from safetensors.numpy import load_file
    except ImportError:
        print("  the safetensors package is not installed: this cross-check is left out (the tool does not need it)")
        return
    tr = read_st(trained)
    loaded = load_file(masters)
    for n in NAMES:
        H.check(list(loaded[n].shape) == SHAPES[n], "safetensors.numpy reads masters %s as %s" % (n, SHAPES[n]))
        H.check(loaded[n].astype("<f4").tobytes() == tensor_bytes(tr, master_key(tr, n)),
                "safetensors.numpy: masters %s bits" % n)
    H.check(all(v.dtype == np.float32 for v in load_file(params32).values()),
            "safetensors.numpy reads --float32 params")


def case_conversions():
    """The tool's float32 -> F16 / BF16 rounding against references over a million bit patterns and
    every exponent's edges: numpy's own float16 cast (correctly rounded), and for BF16 the nearer of
    the two neighbours computed in float64 (ties to even; beyond the largest, inf as 2^128)."""
    import importlib.util
    import numpy as np
    spec = importlib.util.spec_from_file_location("mpopt_checkpoint", ARGS.tool)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(1)
    edges = (0, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x7FFFFF)
    edge_bits = [(e << 23) | m for e in range(256) for m in edges]
    edge_bits += [0x33000000, 0x33000001, 0x387FFFFF, 0x38800000, 0x477FEFFF, 0x477FF000, 0x7F7F7FFF, 0x7F7F8000]
    bits = np.concatenate([rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64), np.array(edge_bits, dtype=np.uint64)])
    bits = np.concatenate([bits, bits | (1 << 31)]).astype(np.uint32)
    x = bits.view(np.float32)
    nan = np.isnan(x)

    f16 = np.frombuffer(mod.float32_to("F16", x), dtype="<u2")
    with np.errstate(over="ignore"):
        ref16 = x.astype(np.float16).view(np.uint16)
    H.check(np.array_equal(f16[~nan], ref16[~nan]), "F16: as numpy's float16 cast, %d values" % (~nan).sum())
    H.check(np.array_equal(f16[nan], ((bits[nan] >> 16) & 0x8000) | 0x7E00 | ((bits[nan] >> 13) & 0x3FF)),
            "F16: a NaN keeps its sign and upper payload, quiet bit set")

    bf16 = np.frombuffer(mod.float32_to("BF16", x), dtype="<u2").astype(np.uint32)
    a = (bits & 0x7FFFFFFF).astype(np.uint64)
    lo = a & 0xFFFF0000
    hi = lo + 0x10000
    with np.errstate(invalid="ignore"):  # NaN lanes: compared separately below
        mag = a.astype(np.uint32).view(np.float32).astype(np.float64)
        lo_v = lo.astype(np.uint32).view(np.float32).astype(np.float64)
        hi_v = (hi & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
        hi_v = np.where(hi == 0x7F800000, 2.0 ** 128, hi_v)
        up = (hi_v - mag < mag - lo_v) | ((hi_v - mag == mag - lo_v) & ((lo >> 16) & 1 == 1))
    ref = (np.where(up, hi, lo) >> 16).astype(np.uint32) | ((bits >> 16) & 0x8000)
    ref = np.where(a >= 0x7F800000, (bits >> 16), ref)  # inf stays inf
    H.check(np.array_equal(bf16[~nan], ref[~nan]), "BF16: nearest, ties to even, %d values" % (~nan).sum())
    H.check(np.array_equal(bf16[nan], (bits[nan] >> 16) | 0x40),
            "BF16: a NaN keeps its sign and upper payload, quiet bit set")

    # Widening back: exact; a 16-bit NaN becomes a quiet float NaN with its payload.
    w16 = mod.to_float32("F16", f16.tobytes()).view(np.uint32)
    finite = ~np.isnan(f16.view(np.float16))
    H.check(np.array_equal(w16[finite], f16.view(np.float16)[finite].astype(np.float32).view(np.uint32)),
            "F16 -> F32: exact")
    h = f16[~finite].astype(np.uint32)
    H.check(np.array_equal(w16[~finite], ((h & 0x8000) << 16) | 0x7FC00000 | ((h & 0x3FF) << 13)),
            "F16 NaN -> F32: quiet")
    wb = mod.to_float32("BF16", bf16.astype("<u2").tobytes()).view(np.uint32)
    H.check(np.array_equal(wb, bf16 << 16), "BF16 -> F32: the bits shifted")


def case_quantized(state):
    d = os.path.join(ARGS.workdir, state)
    os.makedirs(d, exist_ok=True)
    q, f = os.path.join(d, "quantized.safetensors"), os.path.join(d, "fp32_state.safetensors")
    train(["--precision", "bf16", "--state", state, "--master", "remainder16"], "--steps", "25", "--save", q)
    train(["--precision", "bf16"], "--load", q, "--steps", "0", "--save", f)  # load() decodes into fp32 state
    w, o = os.path.join(d, "weights.safetensors"), os.path.join(d, "state.safetensors")
    tool("export", q, w, "--optimizer", o)
    H.check("state %s, master remainder16" % state in tool("info", q).stdout, "info names the storages")
    qs, fs, ws, os_ = read_st(q), read_st(f), read_st(w), read_st(o)
    H.check(json.loads(qs[1]["mpopt"])["state"] == state and json.loads(fs[1]["mpopt"])["state"] == "fp32",
            "the file is of %s state, its conversion of fp32" % state)
    H.check(sorted(os_[0]) == sorted(k + "/" + n for k in ("exp_avg", "exp_avg_sq") for n in NAMES),
            "the state export holds exp_avg and exp_avg_sq of every parameter")
    nonzero = 0
    for n in NAMES:
        H.check(qs[0]["exp_avg/" + n]["dtype"] == "U8" and fs[0]["exp_avg/" + n]["dtype"] == "F32",
                "exp_avg/%s: codes in one file, fp32 in the other" % n)
        for kind in ("exp_avg", "exp_avg_sq"):
            key = kind + "/" + n
            H.check(os_[0][key]["dtype"] == "F32" and os_[0][key]["shape"] == SHAPES[n], "%s: F32 %s" % (key, SHAPES[n]))
            H.check(tensor_bytes(os_, key) == tensor_bytes(fs, key), "%s: decoded as load() decodes it" % key)
            nonzero += sum(1 for (x,) in struct.iter_unpack("<f", tensor_bytes(os_, key)) if x != 0)
        H.check(tensor_bytes(ws, n) == tensor_bytes(fs, "master/" + n), "%s: the remainder16 masters joined" % n)
    H.check(nonzero > 0, "the decoded moments are not all zero")


def numpy_main():
    """Every case that runs on one process (all but ZeRO-2's)."""
    H.run_case("conversions: rounding to F16 and BF16, widening back", case_conversions)
    for state in ("blockwise8", "blockwise4", "fp8"):
        H.run_case("%s state: export decodes it as load() does" % state, case_quantized, state)
    results = {}
    for name, flags, dtype in CONFIGS:
        H.run_case("%s: export, import, load in C++, round trip" % name,
                   lambda *a: results.update({a[0]: case_config(*a)}), name, flags, dtype)
    if "bf16_lamb" in results:
        trained, template, masters = results["bf16_lamb"]
        H.run_case("refusals", case_refusals, trained, template, masters)
        H.run_case("the safetensors package reads the exports", case_safetensors_package, trained, masters,
                   os.path.join(ARGS.workdir, "bf16_lamb", "params32.safetensors"))
    print("== zero2 on two ranks: left out (--zero2 runs it)")


def zero2_main():
    bf16_template = os.path.join(ARGS.workdir, "bf16_adam_template.safetensors")
    H.run_case("zero2 on two ranks",
               lambda: (train(["--precision", "bf16"], "--steps", "0", "--save", bf16_template),
                        case_zero2(bf16_template)))


# --------------------------------------------------------------------------------------------
# The PyTorch cases.

def case_torch(name, flags, param_dtype):
    import torch
    d = os.path.join(ARGS.workdir, "torch_" + name)
    trained, template = make_checkpoints(d, flags)
    tr = read_st(trained)
    tdtype = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}[param_dtype]

    m_pt, p_pt = os.path.join(d, "masters.pt"), os.path.join(d, "params.pt")
    tool("export", trained, m_pt)
    tool("export", trained, p_pt, "--weights", "param")
    sd = torch.load(m_pt)
    H.check(list(sd) == NAMES, "masters.pt: the tensors in registration order")
    for n in NAMES:
        H.check(sd[n].dtype == torch.float32 and list(sd[n].shape) == SHAPES[n],
                "masters.pt %s: float32 %s" % (n, SHAPES[n]))
        H.check(sd[n].numpy().tobytes() == tensor_bytes(tr, master_key(tr, n)), "masters.pt %s: the file's bits" % n)
    ps = torch.load(p_pt)
    for n in NAMES:
        H.check(ps[n].dtype == tdtype and list(ps[n].shape) == SHAPES[n], "params.pt %s: %s" % (n, tdtype))
        bits = ps[n].view(torch.int16).numpy().tobytes() if param_dtype != "F32" else ps[n].numpy().tobytes()
        H.check(bits == tensor_bytes(tr, "param/" + n), "params.pt %s: the file's bits" % n)

    # The shapes are an nn.Module's: it loads the export strictly.
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 10)
    model = MLP()
    model.load_state_dict(sd, strict=True)
    H.check(torch.equal(model.fc2.weight.detach(), sd["fc2.weight"]),
            "nn.Module.load_state_dict(masters.pt, strict=True)")

    # The reverse: the module's state_dict saved by torch.save, as a file, as zero_to_fp32's
    # directory (pytorch_model.bin, or sharded with its index), wrapped under "module".
    reference = os.path.join(d, "imported_from_safetensors.safetensors")
    m_st = os.path.join(d, "masters.safetensors")
    tool("export", trained, m_st)
    tool("import", m_st, "--like", template, "-o", reference)
    src = os.path.join(d, "model.pt")
    torch.save(model.state_dict(), src)
    imp = os.path.join(d, "imported.safetensors")
    tool("import", src, "--like", template, "-o", imp)
    H.check(same_file(imp, reference), "from torch.save(state_dict()): the same file as from safetensors")
    train(flags, "--load", imp, "--steps", "0")
    zdir = os.path.join(d, "zero_to_fp32")
    os.makedirs(zdir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(zdir, "pytorch_model.bin"))
    tool("import", zdir, "--like", template, "-o", imp)
    H.check(same_file(imp, reference), "from zero_to_fp32's pytorch_model.bin: the same file")
    sdir = os.path.join(d, "zero_to_fp32_sharded")
    os.makedirs(sdir, exist_ok=True)
    state = model.state_dict()
    shards = {"pytorch_model-00001-of-00002.bin": NAMES[:3], "pytorch_model-00002-of-00002.bin": NAMES[3:]}
    for f, names in shards.items():
        torch.save({n: state[n] for n in names}, os.path.join(sdir, f))
    with open(os.path.join(sdir, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: f for f, ns in shards.items() for n in ns}}, f)
    tool("import", sdir, "--like", template, "-o", imp)
    H.check(same_file(imp, reference), "from a sharded pytorch_model.bin index: the same file")
    wrapped = os.path.join(d, "wrapped.pt")
    torch.save({"module": state, "global_steps": 12}, wrapped)
    p = tool("import", wrapped, "--like", template, "-o", imp)
    H.check(same_file(imp, reference) and "under 'module'" in p.stderr,
            "from {'module': state_dict}: the same file")

    # A pickle holding more than tensors: refused unless trusted.
    unsafe = os.path.join(d, "unsafe.pt")
    torch.save({"module": state, "args": argparse.Namespace(lr=1)}, unsafe)
    out = os.path.join(d, "unsafe_imported.safetensors")
    refused(["import", unsafe, "--like", template, "-o", out], "--trust-pickle", out)
    tool("import", unsafe, "--like", template, "-o", out, "--trust-pickle")
    H.check(same_file(out, reference), "--trust-pickle: the same file")

    # A 16-bit state_dict: parameters exact, masters widened.
    if param_dtype != "F32":
        half = os.path.join(d, "model_16bit.pt")
        torch.save({n: t.to(tdtype) for n, t in state.items()}, half)
        tool("import", half, "--like", template, "-o", imp)
        im = read_st(imp)
        for n in NAMES:
            H.check(tensor_bytes(im, "param/" + n) == state[n].to(tdtype).view(torch.int16).numpy().tobytes(),
                    "from a %s state_dict: param/%s bits" % (tdtype, n))
            H.check(tensor_bytes(im, "master/" + n) == state[n].to(tdtype).float().numpy().tobytes(),
                    "from a %s state_dict: master/%s widened" % (tdtype, n))
        train(flags, "--load", imp, "--steps", "0")


def torch_main():
    import torch
    print("checkpoint_tool: PyTorch %s under %s" % (torch.__version__, sys.executable))
    for name, flags, dtype in CONFIGS[:2]:
        H.run_case("%s: PyTorch export and import" % name, case_torch, name, flags, dtype)


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tool", required=True, help="tools/mpopt_checkpoint.py")
    p.add_argument("--train-mlp", required=True, help="examples/train_mlp (--save, --load)")
    p.add_argument("--mpirun", help="train_mlp is the MPI build: mpirun runs the ZeRO-2 case on two ranks")
    p.add_argument("--zero2", action="store_true", help="the ZeRO-2 case alone (needs --mpirun)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--torch", action="store_true", help="the PyTorch cases (skipped without PyTorch)")
    ARGS = p.parse_args()
    if ARGS.zero2 and not ARGS.mpirun:
        p.error("--zero2 needs --mpirun")
    for name in ("tool", "train_mlp", "workdir"):  # mpirun looks a relative path up in PATH
        if getattr(ARGS, name):
            setattr(ARGS, name, os.path.abspath(getattr(ARGS, name)))
    if ARGS.torch:
        ensure_modules(["numpy", "torch"], "PyTorch is optional and not installed by .ci/setup "
                       "(apt-get install python3-torch, or pip install torch, runs these cases)")
    else:
        ensure_modules(["numpy"], "apt-get install python3-numpy (.ci/setup does)")
    shutil.rmtree(ARGS.workdir, ignore_errors=True)
    os.makedirs(ARGS.workdir)
    torch_main() if ARGS.torch else zero2_main() if ARGS.zero2 else numpy_main()
    if H.failures:
        print("\n%d of %d checks failed:" % (len(H.failures), H.checks))
        for f in H.failures:
            print("  " + f.splitlines()[0])
        return 1
    print("\nall %d checks passed" % H.checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
