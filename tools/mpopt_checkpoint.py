#!/usr/bin/env python3
"""mpopt_checkpoint: mpopt optimizer checkpoints to and from PyTorch state_dicts.

  mpopt_checkpoint.py info CHECKPOINT
  mpopt_checkpoint.py export CHECKPOINT OUT.safetensors|OUT.pt [--weights master|param] [--float32]
                             [--optimizer OPT.pt|OPT.safetensors]
  mpopt_checkpoint.py import SOURCE --like TEMPLATE -o OUT.safetensors [--strip-prefix P] [--ignore-extra]
                             [--optimizer OPT.pt [--optimizer-class AdamW|Adam]]

export writes the weights of an mpopt checkpoint (opt.save()) as a PyTorch state_dict, tensor name
-> tensor with the shape given to add(): the fp32 master weights (--weights master, the default;
a remainder16 master joined from the bf16 parameter and its remainder, exactly),
or the parameters in their own dtype (--weights param: F16, BF16 or F32; --float32 widens 16-bit
ones exactly, for readers without bfloat16 such as numpy and safetensors.numpy). OUT.safetensors
needs no PyTorch; OUT.pt (or .bin, .pth) is written with torch.save.

import writes an mpopt checkpoint that opt.load() accepts, with the weights of SOURCE and fresh
optimizer state. SOURCE is a state_dict of parameters: a .safetensors file, a torch.save file
(.pt, .bin, .pth: needs PyTorch), a sharded one's *.index.json, or the directory DeepSpeed's
zero_to_fp32 writes (model.safetensors or pytorch_model.bin, sharded or not). TEMPLATE is a
checkpoint the target optimizer saved before its first step (opt.finalize(); opt.save(path)): it
gives the policies, groups, options and tensor names, which the C++ side checks on load(). The
masters get SOURCE's values in fp32, the parameters those values rounded to nearest even into
their dtype (as the optimizer rounds its masters; a remainder16 template's, ties away from zero,
with the remainder that completes them); everything else is the template's.

--optimizer OPT.pt carries Adam's state (rule adam) too, as the state_dict() of torch.optim.AdamW
(of torch.optim.Adam where the weight decay is L2), written with torch.save. Parameters are numbered
group by group in the checkpoint's order (which `info` lists); each param group also lists them by
name under "param_names" (newer PyTorch's own key for named parameters; older versions keep it
unread), the order to build the optimizer's groups in. export writes each parameter's exp_avg and
exp_avg_sq in fp32 with its group's step (torch counts steps per parameter, mpopt per group), and
each group's lr (the last step's), betas, eps and weight_decay; where the checkpoint has a schedule,
initial_lr is the group's base rate, which an LRScheduler built with last_epoch=step-1 resumes from.
The schedule itself, the loss scale and the spike guard's windows have no place in a torch.optim
state_dict. It refuses other rules, bias_correction false and groups mixing the two kinds of decay.
--optimizer OPT.safetensors writes, without PyTorch, any rule's state buffers alone: <kind>/<name> in
fp32 with the parameter's shape, and each group's step (metadata group_steps). State quantized in
blocks (blockwise8, blockwise4, fp8) is decoded either way, code value times block scale in float32
as load() decodes it, with the maps written here from their definitions (docs/design.md).

import --optimizer OPT.pt takes Adam's state from such a state_dict instead of starting fresh (into a
template of fp32 or bf16 state: load() quantizes fp32 state into an optimizer that stores it in blocks). Its
param groups must be the template's groups, and their parameters its tensors in order: sizes, and
param_names where present, are checked. Every parameter of a group must be at the same step, which
becomes the group's step and the applied steps. lr, betas, eps and weight_decay replace the
template's options; its schedule and base rates stay (the schedule sets lr from the base rate at
every step), so lr counts only without a schedule. AMSGrad and maximize are refused, and so is
weight decay of the other kind than the template's: as a state_dict does not say which class wrote
it, --optimizer-class AdamW or Adam does, where there is weight decay. PyTorch 1.x's weights_only
loader reads no Python floats, which every optimizer state_dict holds: there, --trust-pickle.

The container (include/mpopt/detail/checkpoint/state_file.hpp) is read and written here with the standard
library; numpy converts between dtypes (needed by import and --float32) and speeds up the checksum.
Errors are printed as "mpopt_checkpoint: error: ..." with exit status 1, and no output is left.
"""

import argparse
import functools
import json
import math
import os
import signal
import struct
import sys

if os.environ.get("MPOPT_CHECKPOINT_NO_NUMPY"):  # the pure-Python paths, as without numpy (tests)
    np = None
else:
    try:
        import numpy as np
    except ImportError:
        np = None

FORMAT = "mpopt-state"
FORMAT_VERSION = "1"
MAX_HEADER = 100_000_000

# Bytes per element of every safetensors dtype; numpy's type for those this tool converts (BF16's
# bits as uint16: numpy has no bfloat16).
DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
NUMPY_TYPE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "U8": "u1"}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


class CheckpointError(Exception):
    """A problem with the input: reported as one line, exit status 1."""


def fail(message):
    raise CheckpointError(message)


def need_numpy(what):
    if np is None:
        fail(what + " needs numpy (pip install numpy, or apt-get install python3-numpy)")


def import_torch(what):
    try:
        import torch
    except ImportError:
        fail(what + " needs PyTorch (pip install torch, or apt-get install python3-torch); "
             "without it, use .safetensors files")
    return torch


def product(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def shape_text(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


# --------------------------------------------------------------------------------------------
# The checksum: MurmurHash64A, seed 0, fed incrementally (state_file.hpp's checksum64).

_M = 0xC6A4A7935BD1E995
_R = 47
_MASK = (1 << 64) - 1


class Murmur64A:
    def __init__(self, total_length):
        self.h = (total_length * _M) & _MASK
        self.pending = b""

    def update(self, data):
        data = memoryview(data).cast("B")
        if self.pending:
            take = 8 - len(self.pending)
            self.pending += bytes(data[:take])
            data = data[take:]
            if len(self.pending) < 8:
                return
            self._words(self.pending)
            self.pending = b""
        whole = len(data) // 8 * 8
        if whole:
            self._words(data[:whole])
        self.pending = bytes(data[whole:])

    def _words(self, buf):
        h = self.h
        if np is not None:  # the per-word mix vectorized; the fold into h is sequential
            k = np.frombuffer(buf, dtype="<u8").astype(np.uint64)
            k *= np.uint64(_M)
            k ^= k >> np.uint64(_R)
            k *= np.uint64(_M)
            for x in k.tolist():
                h = ((h ^ x) * _M) & _MASK
        else:
            for (x,) in struct.iter_unpack("<Q", buf):
                x = (x * _M) & _MASK
                x ^= x >> _R
                x = (x * _M) & _MASK
                h = ((h ^ x) * _M) & _MASK
        self.h = h

    def finish(self):
        h = self.h
        if self.pending:
            h ^= int.from_bytes(self.pending, "little")
            h = (h * _M) & _MASK
        h ^= h >> _R
        h = (h * _M) & _MASK
        h ^= h >> _R
        return h


# --------------------------------------------------------------------------------------------
# Reading a safetensors file (any, mpopt's or PyTorch's), tensor by tensor.

class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                prefix = f.read(8)
                if size < 8:
                    self._fail("truncated: %d bytes, less than the 8-byte header length" % size)
                n = int.from_bytes(prefix, "little")
                if n > MAX_HEADER:
                    self._fail("header length %d exceeds 100 MB: not a safetensors file" % n)
                if n > size - 8:
                    self._fail("truncated: header length %d but only %d bytes follow" % (n, size - 8))
                text = f.read(n)
        except OSError as e:
            fail("%s: cannot read: %s" % (path, e.strerror or e))
        try:
            header = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            self._fail("header is not valid JSON: %s" % e)
        if not isinstance(header, dict):
            self._fail("header is not a JSON object: not a safetensors file")
        self.data_start = 8 + n
        self.data_size = size - 8 - n
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            self._fail("__metadata__ must map strings to strings")
        self.metadata = meta
        entries = []
        for name, e in header.items():
            entries.append(self._entry(name, e))
        entries.sort(key=lambda e: (e[3], e[4]))  # by offset: file order
        cursor = 0
        for name, _, _, begin, end in entries:
            if begin != cursor:
                self._fail("tensor '%s' %s" % (name, "overlaps the previous tensor" if begin < cursor else
                                                "leaves a hole in the data section before it"))
            cursor = end
        if cursor != self.data_size:
            self._fail("%d bytes of the data section belong to no tensor (or the file is truncated)"
                       % (self.data_size - cursor))
        self.entries = {e[0]: e for e in entries}
        self.names = [e[0] for e in entries]

    def _fail(self, message):
        fail("%s: %s" % (self.path, message))

    def _entry(self, name, e):
        where = "tensor '%s': " % name
        if not isinstance(e, dict) or not {"dtype", "shape", "data_offsets"} <= e.keys():
            self._fail(where + "needs dtype, shape and data_offsets")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in DTYPE_SIZE:
            self._fail(where + "unknown dtype %r" % (dtype,))

        def natural(v):
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if not isinstance(shape, list) or not all(natural(d) for d in shape):
            self._fail(where + "shape %r must hold non-negative integers" % (shape,))
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(natural(v) for v in offsets):
            self._fail(where + "data_offsets %r must be two non-negative integers" % (offsets,))
        begin, end = offsets
        if begin > end:
            self._fail(where + "data_offsets %r end before they begin" % (offsets,))
        if end > self.data_size:
            self._fail("truncated or corrupt: " + where + "data_offsets %r run past the end of the data section "
                       "(%d bytes)" % (offsets, self.data_size))
        if product(shape) * DTYPE_SIZE[dtype] != end - begin:
            self._fail(where + "shape %s of %s does not match data_offsets %r" % (shape_text(shape), dtype, offsets))
        return (name, dtype, list(shape), begin, end)

    def dtype(self, name):
        return self.entries[name][1]

    def shape(self, name):
        return self.entries[name][2]

    def raw(self, name):
        """The tensor's bytes, as stored (little-endian)."""
        _, _, _, begin, end = self.entries[name]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.data_start + begin)
                data = f.read(end - begin)
        except OSError as e:
            fail("%s: cannot read: %s" % (self.path, e.strerror or e))
        if len(data) != end - begin:
            self._fail("read failed: the file shrank")
        return data

    def blocks(self, size=1 << 24):
        """The data section, in pieces."""
        with open(self.path, "rb") as f:
            f.seek(self.data_start)
            left = self.data_size
            while left:
                piece = f.read(min(size, left))
                if not piece:
                    self._fail("read failed: the file shrank")
                left -= len(piece)
                yield piece

    def float32(self, name):
        """The tensor as float32 numbers (a flat array); 16-bit floats widen exactly."""
        dtype = self.dtype(name)
        if dtype not in FLOAT_DTYPES:
            self._fail("tensor '%s' has dtype %s: a parameter must be floating point" % (name, dtype))
        return to_float32(dtype, self.raw(name))


class MpoptCheckpoint(SafetensorsFile):
    """A file opt.save() wrote: the container checked, the checksum verified, the metadata parsed."""

    def __init__(self, path, verify=True):
        super().__init__(path)
        md = self.metadata
        if md.get("format") != FORMAT:
            self._fail("not an mpopt checkpoint (its __metadata__.format is %r, not %r)" % (md.get("format"), FORMAT))
        if md.get("format_version") != FORMAT_VERSION:
            self._fail("unsupported format_version %r (this tool reads %r)"
                       % (md.get("format_version"), FORMAT_VERSION))
        for key in ("mpopt", "checksum"):
            if key not in md:
                self._fail("missing __metadata__.%s" % key)
        self.mpopt_text = md["mpopt"]
        if verify:
            try:
                text = self.mpopt_text.encode("utf-8")
            except UnicodeEncodeError:
                self._fail("__metadata__.mpopt is not valid UTF-8")
            h = Murmur64A(len(text) + self.data_size)
            h.update(text)
            for piece in self.blocks():
                h.update(piece)
            actual = "%016x" % h.finish()
            if actual != md["checksum"]:
                self._fail("checksum mismatch: header says %s, contents hash to %s (the file is corrupt)"
                           % (md["checksum"], actual))
        try:
            self.config = json.loads(self.mpopt_text)
            groups = self.config["groups"]
            self.tensors = []  # (name, elements), registration order
            for g in groups:
                for t in g["tensors"]:
                    name, size = t["name"], t["size"]
                    if not isinstance(name, str) or not isinstance(size, int) or isinstance(size, bool):
                        raise TypeError("tensor name or size")
                    self.tensors.append((name, size))
        except (ValueError, KeyError, TypeError) as e:
            self._fail("malformed optimizer metadata (__metadata__.mpopt): %s" % e)
        for name, size in self.tensors:
            key = "param/" + name
            if key not in self.entries:
                self._fail("tensor '%s' is missing" % key)
            if product(self.shape(key)) != size:
                self._fail("tensor '%s' has shape %s, the metadata says %d elements"
                           % (key, shape_text(self.shape(key)), size))

    def weight_key(self, name, weights):
        """The file's tensor with parameter `name`'s weights: its master, or the parameter itself."""
        if weights == "master" and "master/" + name in self.entries:
            return "master/" + name
        return "param/" + name  # fp32 precision has no masters: its parameters are the fp32 weights

    def has_master(self, name):
        return "master/" + name in self.entries or "remainder/" + name in self.entries

    def master_bytes(self, name):
        """A remainder16 parameter's fp32 masters, joined from its parameter and remainder."""
        return join_master(self.raw("param/" + name), self.raw("remainder/" + name))


# --------------------------------------------------------------------------------------------
# Conversions, bit for bit as include/mpopt/detail/lanes/float_bits.hpp does them (NaNs included).

def to_float32(dtype, data):
    """Little-endian bytes of `dtype` -> a flat float32 array; exact except from F64 (nearest even)."""
    need_numpy("converting %s to float32" % dtype)
    a = np.frombuffer(data, dtype=NUMPY_TYPE[dtype])
    if dtype == "F32":
        return a.astype(np.float32)
    if dtype == "F64":
        return a.astype(np.float32)  # the hardware conversion: nearest even, NaN quieted with its upper payload
    if dtype == "BF16":
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    # F16: numpy widens exactly; a NaN gets the quiet bit set, as the hardware (and mpopt) does.
    h = a.view(np.uint16).astype(np.uint32)
    out = a.astype(np.float32)
    nan = ((h & 0x7C00) == 0x7C00) & ((h & 0x03FF) != 0)
    if nan.any():
        bits = out.view(np.uint32)
        bits[nan] = ((h[nan] & 0x8000) << 16) | 0x7FC00000 | ((h[nan] & 0x03FF) << 13)
    return out


def join_master(param, remainder):
    """bf16 parameters and their 16-bit remainders (state precision remainder16) -> the fp32 masters'
    little-endian bytes: (param << 16) + remainder as 32-bit integers
    (include/mpopt/detail/math/remainder16.hpp)."""
    if np is None:
        n = len(param) // 2
        p, r = struct.unpack("<%dH" % n, param), struct.unpack("<%dh" % n, remainder)
        return struct.pack("<%dI" % n, *(((a << 16) + b) & 0xFFFFFFFF for a, b in zip(p, r)))
    p = np.frombuffer(param, dtype="<u2").astype(np.int64)
    r = np.frombuffer(remainder, dtype="<i2").astype(np.int64)
    return ((p << 16) + r).astype("<u4").tobytes()


def split_master(values):
    """fp32 masters -> (bf16 parameters, remainders) as bytes: the master rounded to nearest, a tie away
    from zero, and what its bits lack of the master's; a NaN master a quiet NaN parameter, remainder 0."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.int64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    param = np.where(nan, (u >> 16) | 0x0040, (u + 0x8000) >> 16)
    remainder = np.where(nan, 0, u - (param << 16))
    return param.astype("<u2").tobytes(), remainder.astype("<i2").tobytes()


def float32_to(dtype, values):
    """A float32 array -> little-endian bytes of `dtype` (F32, F16 or BF16), rounded to nearest even."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if dtype == "F32":
        return values.astype("<f4").tobytes()
    u = values.view(np.uint32).astype(np.int64)
    if dtype == "BF16":
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        out = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out = np.where(nan, (u >> 16) | 0x0040, out)
        return out.astype("<u2").tobytes()
    if dtype == "F16":
        sign = (u >> 16) & 0x8000
        a = u & 0x7FFFFFFF
        out = np.zeros_like(a)
        normal = (a >= 0x38800000) & (a < 0x477FF000)
        r = a - 0x38000000
        r = r + 0x0FFF + ((r >> 13) & 1)
        out = np.where(normal, r >> 13, out)
        sub = (a > 0x33000000) & (a < 0x38800000)  # binary16 subnormals: |x| / 2^-24 to an integer
        exp = np.where(sub, a >> 23, 112)
        sig = (a & 0x007FFFFF) | 0x00800000
        shift = 126 - exp
        q = sig >> shift
        rem = sig & ((np.int64(1) << shift) - 1)
        halfway = np.int64(1) << (shift - 1)
        q = q + ((rem > halfway) | ((rem == halfway) & ((q & 1) == 1)))
        out = np.where(sub, q, out)
        out = np.where(a >= 0x477FF000, 0x7C00, out)  # |x| >= 65520 overflows to inf
        out = np.where(a > 0x7F800000, 0x7E00 | ((a >> 13) & 0x03FF), out)
        return (out | sign).astype("<u2").tobytes()
    fail("cannot write parameters of dtype %s" % dtype)


# --------------------------------------------------------------------------------------------
# Writing a safetensors file: to OUT.tmp, renamed into place when complete (as save() does).

def write_safetensors(path, tensors, metadata):
    """tensors: (name, dtype, shape, produce) in file order; produce() returns the bytes. With
    metadata["mpopt"], the checksum of mpopt's container is computed and filled in."""
    mpopt = "mpopt" in metadata
    meta = dict(metadata)
    if mpopt:
        meta["checksum"] = "0" * 16
    header = {"__metadata__": meta}
    offset = 0
    for name, dtype, shape, _ in tensors:
        if name in header:
            fail("duplicate tensor name '%s'" % name)
        end = offset + product(shape) * DTYPE_SIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    try:
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        mpopt_bytes = meta["mpopt"].encode("utf-8") if mpopt else b""
    except UnicodeEncodeError as e:
        fail("%s: a tensor name or the metadata is not valid Unicode: %s" % (path, e))
    text += b" " * ((8 - len(text) % 8) % 8)  # the data section starts 8-byte aligned
    h = None
    if mpopt:
        # The field itself: __metadata__ comes first, and inside the "mpopt" string quotes are escaped.
        checksum_at = 8 + text.find(b'"checksum":"' + b"0" * 16 + b'"') + len(b'"checksum":"')
        h = Murmur64A(len(mpopt_bytes) + offset)
        h.update(mpopt_bytes)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for name, dtype, shape, produce in tensors:
                data = produce()
                expected = product(shape) * DTYPE_SIZE[dtype]
                if len(data) != expected:
                    fail("internal: tensor '%s' has %d bytes, its shape %s needs %d"
                         % (name, len(data), shape_text(shape), expected))
                if h:
                    h.update(data)
                f.write(data)
            if h:
                f.seek(checksum_at)
                f.write(b"%016x" % h.finish())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        fail("%s: cannot write: %s" % (e.filename or tmp, e.strerror or e))
    except BaseException:
        remove_quietly(tmp)
        raise


def remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


# --------------------------------------------------------------------------------------------
# State dicts to import: safetensors, torch.save files, sharded ones, zero_to_fp32's directory.

class SafetensorsSource:
    """Tensors from one or several .safetensors files (the shards of an index)."""

    def __init__(self, files):
        self.where = {}  # name -> its file
        for path in files:
            f = SafetensorsFile(path)
            if f.metadata.get("format") == FORMAT:
                fail("%s is an mpopt checkpoint: export it to a state_dict first (mpopt_checkpoint.py export)" % path)
            for name in f.names:
                if name in self.where:
                    fail("tensor '%s' is in both %s and %s" % (name, self.where[name].path, path))
                self.where[name] = f
        self.names = list(self.where)

    def describe(self, name):
        f = self.where[name]
        return f.dtype(name), f.shape(name)

    def float32(self, name):
        return self.where[name].float32(name)


TORCH_DTYPES = {}  # torch dtype -> safetensors name, filled when torch is imported


def torch_load(torch, path, trust_pickle, hint=None):
    """A torch.save file's object: tensors, numbers, strings and containers only, unless trusted."""
    try:
        try:  # (said either way: PyTorch 2.6 made weights_only=True the default)
            return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
        except TypeError:  # a torch before 1.13 has no weights_only
            return torch.load(path, map_location="cpu")
    except OSError as e:
        fail("%s: cannot read: %s" % (path, e.strerror or e))
    except Exception as e:  # pickle's and torch's own errors
        if trust_pickle:
            hint = ""
        elif not hint:
            hint = " (it may hold more than tensors: --trust-pickle loads any pickle, for files you trust)"
        fail("%s: torch.load failed: %s%s" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__, hint))


def torch_save(torch, obj, out):
    """torch.save to OUT.tmp, renamed into place when complete."""
    tmp = out + ".tmp"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, out)
    except OSError as e:
        remove_quietly(tmp)
        fail("%s: cannot write: %s" % (out, e.strerror or e))
    except BaseException:
        remove_quietly(tmp)
        raise


class TorchSource:
    """Tensors from torch.save files (pytorch_model.bin, model.pt, or the shards of an index)."""

    def __init__(self, files, trust_pickle):
        torch = import_torch("reading " + files[0])
        TORCH_DTYPES.update({torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                             torch.bfloat16: "BF16"})
        self.tensors = {}
        self.torch = torch
        for path in files:
            obj = self._load(path, trust_pickle)
            for name, t in self._state_dict(path, obj).items():
                if name in self.tensors:
                    fail("tensor '%s' is in two of the files (%s)" % (name, path))
                self.tensors[name] = t
        self.names = list(self.tensors)

    def _load(self, path, trust_pickle):
        return torch_load(self.torch, path, trust_pickle)

    def _state_dict(self, path, obj):
        torch = self.torch

        def tensors_only(d):
            return isinstance(d, dict) and d and all(isinstance(v, torch.Tensor) for v in d.values())
        if tensors_only(obj):
            return obj
        if isinstance(obj, dict):
            for key in ("state_dict", "module", "model"):  # the usual wrappers (DeepSpeed: "module")
                if tensors_only(obj.get(key)):
                    print("mpopt_checkpoint: %s: using the state_dict under '%s'" % (path, key), file=sys.stderr)
                    return obj[key]
        fail("%s: not a state_dict (a dict of tensor name -> tensor), nor one under 'state_dict', 'module' or 'model'"
             % path)

    def describe(self, name):
        t = self.tensors[name]
        return TORCH_DTYPES.get(t.dtype, str(t.dtype)), list(t.shape)

    def float32(self, name):
        t = self.tensors[name].detach().to("cpu").contiguous()
        dtype = TORCH_DTYPES.get(t.dtype)
        if dtype is None:
            fail("tensor '%s' has dtype %s: a parameter must be floating point" % (name, t.dtype))
        if dtype in ("F16", "BF16"):  # exact; numpy has no bfloat16
            return t.float().numpy().reshape(-1)
        return to_float32(dtype, t.numpy().tobytes())


TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def open_source(path, trust_pickle):
    """A state_dict to import, from a file, an index of shards or a directory."""
    if os.path.isdir(path):
        for name in ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                     "pytorch_model.bin"):
            if os.path.exists(os.path.join(path, name)):
                return open_source(os.path.join(path, name), trust_pickle)
        fail("%s: no model.safetensors, pytorch_model.bin or their .index.json (zero_to_fp32's output) in this "
             "directory" % path)
    if not os.path.exists(path):
        fail("%s: no such file" % path)
    if path.endswith(".index.json"):
        try:
            with open(path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            files = []
            for shard in weight_map.values():
                if shard not in files:
                    files.append(shard)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            fail("%s: not an index of shards with a weight_map: %s" % (path, e))
        files = [os.path.join(os.path.dirname(path), f) for f in files]
        if not files:
            fail("%s: the weight_map lists no files" % path)
        if all(f.endswith(".safetensors") for f in files):
            return SafetensorsSource(files)
        return TorchSource(files, trust_pickle)
    if path.endswith(".safetensors"):
        return SafetensorsSource([path])
    if path.endswith(TORCH_SUFFIXES):
        return TorchSource([path], trust_pickle)
    fail("%s: unknown kind of file (expected .safetensors, %s, *.index.json or a directory)"
         % (path, ", ".join(TORCH_SUFFIXES)))


# --------------------------------------------------------------------------------------------
# Adam's state to and from torch.optim: the state_dict() of torch.optim.AdamW (decoupled weight
# decay) or torch.optim.Adam (L2), parameters numbered group by group in the checkpoint's order.

ADAM_OPTIONS = ("lr", "beta1", "beta2", "eps", "weight_decay", "decoupled_weight_decay", "bias_correction")
ADAM_STATE = ("exp_avg", "exp_avg_sq")
# What PyTorch 1.13's state_dict() gives each param group besides lr, betas, eps, weight_decay and
# params (newer versions fill in the keys they added when they load one).
TORCH_GROUP_FLAGS = {
    "AdamW": {"amsgrad": False, "foreach": None, "maximize": False, "capturable": False},
    "Adam": {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
             "fused": False},
}


def require_adam(cfg, where):
    if cfg.get("rule") != "adam":
        fail("%s: rule %r: --optimizer converts Adam's state (rule adam) only, the state torch.optim's Adam and "
             "AdamW hold" % (where, cfg.get("rule")))


# State quantized in blocks (include/mpopt/state_precision.hpp): bits per code, elements per scale.
QUANTIZED_STATES = {"blockwise8": (8, 256), "blockwise4": (4, 128), "fp8": (8, 256)}


def require_unquantized(cfg, where):
    if cfg.get("state") in QUANTIZED_STATES:
        fail("%s: state %r is quantized in blocks (codes and scales): import --optimizer writes fp32 moments; use "
             "a template saved by the same optimizer with fp32 state (mpopt::fp32_state), which load() quantizes "
             "into this one's storage" % (where, cfg.get("state")))


def dynamic_values(is_signed, n):
    """bitsandbytes' dynamic map of n = 2^bits values as mpopt defines it (docs/design.md, "State
    precision"): decade 10^(i - (E-1)) for i < E = log2(n) - 1 exponent bits holds the midpoints of an even
    split of [0.1, 1] into 2^i parts (signed, each with its negative) or 2^(i+1) (unsigned); with 0 and 1.
    In double, rounded once to float32."""
    exponent_bits = n.bit_length() - 2
    v = [0.0, 1.0]
    for i in range(exponent_bits):
        parts = 1 << i if is_signed else 1 << (i + 1)
        decade = 1.0 / float(10 ** (exponent_bits - 1 - i))  # 10^-k, correctly rounded
        for j in range(parts):
            x = decade * (0.1 + 0.9 * (j + 0.5) / parts)
            v += [x, -x] if is_signed else [x]
    return sorted(v)


def e4m3_value(code):
    """fp8 E4M3FN: S.EEEE.MMM with bias 7, m * 2^-9 below the normals, S.1111.111 NaN."""
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    magnitude = m / 512.0 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -magnitude if code & 0x80 else magnitude


@functools.lru_cache(maxsize=None)  # once per storage and map, not once per tensor
def code_values(state, nonnegative):
    """The values of a quantized storage's codes, by code, as float32: the unsigned map for state the rule
    keeps non-negative."""
    if state == "fp8":
        values = [e4m3_value(c) for c in range(256)]
    elif state == "blockwise8":
        values = dynamic_values(not nonnegative, 256)
    else:  # blockwise4: the signed dynamic map, or k/16 for k = 1..16
        values = [(k + 1) / 16.0 for k in range(16)] if nonnegative else dynamic_values(True, 16)
    return np.array(values, dtype=np.float64).astype(np.float32)


def state_float32(c, kind, name, size):
    """State buffer `kind` of parameter `name` as float32: as saved (16-bit widened exactly), or decoded
    from its codes and its blocks' scales: code value times scale, in float32, as load() decodes it."""
    key = kind + "/" + name
    storage = c.config.get("state", "fp32")
    if key not in c.entries:
        fail("%s: tensor '%s' is missing" % (c.path, key))
    if storage not in QUANTIZED_STATES:
        if product(c.shape(key)) != size:
            fail("%s: tensor '%s' has shape %s, the parameter %d elements" % (c.path, key, shape_text(c.shape(key)),
                                                                              size))
        return c.float32(key).copy()  # writable, for torch.from_numpy
    need_numpy("decoding %s state" % storage)
    bits, block = QUANTIZED_STATES[storage]
    scale_key = kind + "_scale/" + name
    codes = np.frombuffer(c.raw(key), dtype=np.uint8)
    if bits == 4:  # two a byte, the even element in the low half
        codes = np.stack([codes & 0xF, codes >> 4], axis=1).reshape(-1)
    blocks = -(-size // block)
    if c.dtype(key) != "U8" or len(codes) < size or scale_key not in c.entries or c.dtype(scale_key) != "F32" \
            or product(c.shape(scale_key)) != blocks:
        fail("%s: %s state '%s' of %d elements needs U8 codes and %d F32 scales ('%s')"
             % (c.path, storage, key, size, blocks, scale_key))
    nonnegative = kind in c.config.get("nonnegative_state", [])
    scales = np.repeat(c.float32(scale_key), block)[:size]
    return code_values(storage, nonnegative)[codes[:size]] * scales


def torch_adam_class(cfg, where):
    """'AdamW' where the groups with weight decay decouple it, 'Adam' where they add it to the gradient
    (L2); refuses options torch.optim cannot run."""
    decoupled = set()
    for g, group in enumerate(cfg["groups"]):
        o = group["options"]
        unknown = sorted(set(o) - set(ADAM_OPTIONS))
        if unknown:
            fail("%s: group %d's option %s has no counterpart in torch.optim.Adam or AdamW" % (where, g, unknown[0]))
        if not o.get("bias_correction", True):
            fail("%s: group %d has bias_correction false: torch.optim.Adam and AdamW always correct the moments' "
                 "bias" % (where, g))
        if o.get("weight_decay", 0) != 0:
            decoupled.add(bool(o.get("decoupled_weight_decay", True)))
    if len(decoupled) > 1:
        fail("%s: some groups decay weights decoupled (AdamW), others as L2 (Adam): one torch.optim optimizer "
             "cannot do both" % where)
    return "Adam" if decoupled == {False} else "AdamW"


def torch_optimizer_state(c, torch):
    """The checkpoint's Adam state as torch.optim's state_dict(), and the class to load it into."""
    cfg = c.config
    require_adam(cfg, c.path)
    cls = torch_adam_class(cfg, c.path)
    scheduled = bool(cfg.get("lr_schedule"))
    state, groups, index = {}, [], 0
    for group in cfg["groups"]:
        o, step = group["options"], group["step"]
        params, names = [], []
        for t in group["tensors"]:
            name = t["name"]
            if step > 0:  # torch keeps no state for a parameter before its first step
                shape = c.shape("param/" + name)
                state[index] = {"step": torch.tensor(float(step), dtype=torch.float32)}
                for kind in ADAM_STATE:
                    state[index][kind] = torch.from_numpy(state_float32(c, kind, name, t["size"])).reshape(shape)
            params.append(index)
            names.append(name)
            index += 1
        pg = {"lr": o["lr"], "betas": (o["beta1"], o["beta2"]), "eps": o["eps"], "weight_decay": o["weight_decay"]}
        pg.update(TORCH_GROUP_FLAGS[cls])
        if scheduled:  # where an LRScheduler keeps the base rate; it needs it to resume (last_epoch >= 0)
            pg["initial_lr"] = group["base_lr"]
        pg["params"] = params
        pg["param_names"] = names  # newer PyTorch's own key for named parameters; older ones keep it unread
        groups.append(pg)
    return {"state": state, "param_groups": groups}, cls


class TorchAdamState:
    """A torch.optim.Adam/AdamW state_dict() checked against a template's groups: its moments by the
    template's tensor names, and the template's metadata with the steps and options replaced."""

    def __init__(self, path, template, optimizer_class, strip_prefix, trust_pickle):
        self.path = path
        self.torch = torch = import_torch("reading " + path)
        cfg = json.loads(template.mpopt_text)
        require_adam(cfg, template.path)
        require_unquantized(cfg, template.path)
        floats_refused = torch.__version__.split(".")[0] in ("0", "1")  # by torch.load(weights_only=True)
        sd = torch_load(torch, path, trust_pickle, hint=" (PyTorch %s's weights_only loader reads no Python floats, "
                        "which every optimizer state_dict holds: --trust-pickle loads it, for files you trust)"
                        % torch.__version__ if floats_refused else None)
        if not isinstance(sd, dict) or not isinstance(sd.get("state"), dict) or \
                not isinstance(sd.get("param_groups"), list):
            self._fail("not a torch.optim state_dict (a dict with 'state' and 'param_groups')")
        saved = sd["param_groups"]
        if len(saved) != len(cfg["groups"]) or not all(isinstance(g, dict) for g in saved):
            self._fail("%d param groups, the template %d: the groups must be the template's, in its order"
                       % (len(saved), len(cfg["groups"])))
        self.moments = {}  # template tensor name -> {kind: float32 values}
        steps = []
        for g, (pg, group) in enumerate(zip(saved, cfg["groups"])):
            step = self._group(g, pg, group, sd["state"], template, strip_prefix)
            self._options(g, pg, group, optimizer_class)
            group["step"] = step
            steps.append(step)
        cfg["applied_steps"] = max(steps, default=0)
        self.applied = cfg["applied_steps"]
        self.mpopt_text = json.dumps(cfg, separators=(",", ":"), ensure_ascii=False)

    def _fail(self, message):
        fail("%s: %s" % (self.path, message))

    def _group(self, g, pg, group, state, template, strip_prefix):
        """Group g's moments; returns its step, which all its parameters must share."""
        params, tensors = pg.get("params"), group["tensors"]
        if not isinstance(params, list) or len(params) != len(tensors):
            self._fail("param group %d has %s parameters, the template's group %d has %d" % (
                g, len(params) if isinstance(params, list) else "no list of", g, len(tensors)))
        names = pg.get("param_names")  # newer PyTorch's, or this tool's export
        if names is not None:
            wanted = [t["name"] for t in tensors]
            if not isinstance(names, list) or len(names) != len(wanted):
                self._fail("param group %d: param_names does not list its %d parameters" % (g, len(wanted)))
            names = [n[len(strip_prefix):] if strip_prefix and str(n).startswith(strip_prefix) else n for n in names]
            for i, (n, w) in enumerate(zip(names, wanted)):
                if n != w:
                    self._fail("param group %d names its parameter %d %r, the template's is '%s'" % (g, i, n, w))
        steps = {}
        for index, t in zip(params, tensors):
            s = state.get(index, {})
            if not isinstance(s, dict):
                self._fail("the state of parameter %r is not a dict" % (index,))
            extra = sorted(set(s) - {"step"} - set(ADAM_STATE))
            if extra:
                self._fail("parameter %r ('%s') has state '%s': only Adam's step, exp_avg and exp_avg_sq convert "
                           "(no AMSGrad)" % (index, t["name"], extra[0]))
            if not s:
                steps.setdefault(0, t["name"])
                continue
            if not {"step", *ADAM_STATE} <= set(s):
                self._fail("parameter %r ('%s') lacks step, exp_avg or exp_avg_sq" % (index, t["name"]))
            steps.setdefault(self._step(s["step"], index), t["name"])
            self.moments[t["name"]] = {k: self._values(s[k], k, index, t, template) for k in ADAM_STATE}
        if len(steps) > 1:
            (a, na), (b, nb) = sorted(steps.items())[:2]
            self._fail("param group %d: '%s' is at step %d, '%s' at step %d: mpopt keeps one step per group"
                       % (g, na, a, nb, b))
        return next(iter(steps), 0)

    def _step(self, step, index):
        torch = self.torch
        if isinstance(step, torch.Tensor):
            step = step.item() if step.numel() == 1 else None
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step < 0 or step != int(step):
            self._fail("parameter %r: step %r is not a whole number of steps" % (index, step))
        return int(step)

    def _values(self, tensor, kind, index, t, template):
        torch = self.torch
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            self._fail("parameter %r ('%s'): %s is not a floating-point tensor" % (index, t["name"], kind))
        shape = list(tensor.shape)
        registered = template.shape("param/" + t["name"])
        if product(shape) != t["size"] or (len(shape) > 1 and len(registered) > 1 and shape != registered):
            self._fail("parameter %r ('%s'): %s has shape %s, the template's tensor %s: are the groups' "
                       "parameters in the template's order?" % (index, t["name"], kind, shape_text(shape),
                                                               shape_text(registered)))
        return tensor.detach().to("cpu", torch.float32).contiguous().numpy().reshape(-1)

    def _options(self, g, pg, group, optimizer_class):
        """lr, betas, eps and weight decay from group g; what mpopt's Adam cannot follow is refused."""
        o = group["options"]
        for flag in ("amsgrad", "maximize"):
            if pg.get(flag):
                self._fail("param group %d has %s on: mpopt's Adam has no %s" % (g, flag, flag))
        if not o.get("bias_correction", True):
            self._fail("the template's group %d has bias_correction false; torch.optim's Adam corrects" % g)
        try:
            lr, (beta1, beta2), eps, wd = (pg["lr"], pg["betas"], pg["eps"], pg["weight_decay"])
            lr, beta1, beta2, eps, wd = (float(v) for v in (lr, beta1, beta2, eps, wd))  # a Tensor lr too
        except (KeyError, TypeError, ValueError) as e:
            self._fail("param group %d: lr, betas (two numbers), eps or weight_decay missing or not numbers (%s)"
                       % (g, e))
        if not all(math.isfinite(v) for v in (lr, beta1, beta2, eps, wd)):
            self._fail("param group %d: lr, betas, eps and weight_decay must be finite" % g)
        if wd != 0:
            decoupled = self._decoupled(g, pg, optimizer_class)
            if decoupled != o.get("decoupled_weight_decay", True):
                def kind(d):
                    return "AdamW's (decoupled)" if d else "Adam's (L2)"
                self._fail("param group %d's weight decay is %s, the template's group %d's %s" % (
                    g, kind(decoupled), g, kind(o.get("decoupled_weight_decay", True))))
        base = group.get("base_lr")
        if "initial_lr" in pg and base is not None and float(pg["initial_lr"]) != base:
            print("mpopt_checkpoint: note: param group %d's initial_lr is %r; the template's schedule scales its "
                  "own base rate, %r" % (g, pg["initial_lr"], base), file=sys.stderr)
        o.update(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd)

    def _decoupled(self, g, pg, optimizer_class):
        """Whether group g's weight decay is AdamW's: the state_dict says so only in some PyTorch versions."""
        said = pg.get("decoupled_weight_decay")
        if said is not None and optimizer_class and bool(said) != (optimizer_class == "AdamW"):
            self._fail("param group %d has decoupled_weight_decay %s, but --optimizer-class is %s"
                       % (g, said, optimizer_class))
        if said is not None:
            return bool(said)
        if not optimizer_class:
            self._fail("param group %d has weight decay, and the state_dict does not say whether it is AdamW's "
                       "(decoupled) or Adam's (L2): give --optimizer-class AdamW or Adam" % g)
        return optimizer_class == "AdamW"


# --------------------------------------------------------------------------------------------
# The commands.

def listing(names, most=8):
    names = list(names)
    shown = ", ".join(names[:most])
    return shown + (" and %d more" % (len(names) - most) if len(names) > most else "")


def cmd_info(args):
    c = MpoptCheckpoint(args.checkpoint)
    cfg = c.config
    print("%s: mpopt checkpoint, checksum ok" % args.checkpoint)
    print("  %s, %s, %s, %s" % tuple(cfg.get(k, "?") for k in ("precision", "loss_scaler", "partition", "rule")))
    print("  state %s, master %s" % (cfg.get("state", "fp32"), cfg.get("master", "fp32")))  # fp32: files before them
    print("  %s applied steps, %s skipped; scaler %s" % (cfg.get("applied_steps"), cfg.get("skipped_steps"),
                                                         json.dumps(cfg.get("scaler"))))
    if cfg.get("replicas"):
        print("  %s ranks' own copies: rank r's under rank/<r>/ (0/1 Adam between syncs); export takes rank 0's"
              % cfg["replicas"])
    guard = cfg.get("spike_guard")
    if isinstance(guard, dict):
        print("  spike guard windows: %d losses, %d gradient norms"
              % (len(guard.get("loss", [])), len(guard.get("norm", []))))
    registered = set(name for name, _ in c.tensors)
    kinds = {}  # parameter name -> the kinds of its tensors in the file (param, master, exp_avg, ...)
    for k in c.names:
        kind, _, name = k.partition("/")
        if name in registered:
            kinds.setdefault(name, []).append(kind)
    for g, group in enumerate(cfg["groups"]):
        print("  group %d: step %s, %s" % (g, group.get("step"), json.dumps(group.get("options"), sort_keys=True)))
        for t in group["tensors"]:
            param = "param/" + t["name"]
            print("    %-32s %-6s %-14s %s" % (t["name"], c.dtype(param), shape_text(c.shape(param)),
                                              " ".join(kinds.get(t["name"], []))))
    others = [k for k in c.names if k.partition("/")[2] not in registered]
    if others:
        print("  also: " + ", ".join("%s %s %s" % (k, c.dtype(k), shape_text(c.shape(k))) for k in others))
    return 0


def cmd_export(args):
    out = args.output
    torch_out = out.endswith(TORCH_SUFFIXES)
    if not torch_out and not out.endswith(".safetensors"):
        fail("%s: the output must end in .safetensors or %s" % (out, ", ".join(TORCH_SUFFIXES)))
    c = MpoptCheckpoint(args.checkpoint, verify=not args.no_verify)
    state_alone = args.optimizer and args.optimizer.endswith(".safetensors")
    torch = None
    if torch_out or (args.optimizer and not state_alone):
        torch = import_torch("writing " + (out if torch_out else args.optimizer))
        need_numpy("writing " + out)
    optimizer = OptimizerExport(args, c, torch) if args.optimizer else None  # checked before any file is written
    tensors = []
    for name, _ in c.tensors:
        key = c.weight_key(name, args.weights)
        dtype, shape = c.dtype(key), c.shape(key)
        if args.weights == "master" and "remainder/" + name in c.entries:
            tensors.append((name, "F32", shape, lambda name=name: c.master_bytes(name)))
        elif args.float32 and dtype != "F32":
            need_numpy("--float32")
            tensors.append((name, "F32", shape, lambda key=key, dtype=dtype: to_float32(dtype, c.raw(key)).tobytes()))
        else:
            tensors.append((name, dtype, shape, lambda key=key: c.raw(key)))
    if torch_out:
        state = {}
        for name, dtype, shape, produce in tensors:
            data = bytearray(produce())
            if dtype == "BF16":
                t = torch.frombuffer(data, dtype=torch.int16).view(torch.bfloat16)
            else:
                t = torch.from_numpy(np.frombuffer(data, dtype=NUMPY_TYPE[dtype]).copy())
            state[name] = t.reshape(shape).clone()
        torch_save(torch, state, out)
    else:
        write_safetensors(out, tensors, {"format": "pt"})  # "pt": what PyTorch-side readers expect
    what = "fp32 masters" if args.weights == "master" else "parameters" + (" as float32" if args.float32 else "")
    print("mpopt_checkpoint: wrote %d tensors (%s) to %s" % (len(tensors), what, out), file=sys.stderr)
    if optimizer:
        optimizer.write(weights=out)
    return 0


class OptimizerExport:
    """export --optimizer: a torch.optim state_dict written with torch.save, or (OPT.safetensors)
    every state buffer alone in fp32. Everything is checked at construction, before either file is
    written; write() leaves both files or neither."""

    def __init__(self, args, c, torch):
        self.c, self.torch, self.path = c, torch, args.optimizer
        if os.path.abspath(self.path) == os.path.abspath(args.output):
            fail("%s: the weights and the optimizer state need two files" % self.path)
        self.alone = self.path.endswith(".safetensors")
        if self.alone:
            self.state = state_tensors(c)
        else:
            self.state, self.cls = export_optimizer_checks(args, c, torch)

    def write(self, weights):
        try:
            if self.alone:
                steps = json.dumps([g["step"] for g in self.c.config["groups"]])
                write_safetensors(self.path, self.state, {"format": "pt", "group_steps": steps})
            else:
                torch_save(self.torch, self.state, self.path)
        except BaseException:
            remove_quietly(weights)
            raise
        if self.alone:
            print("mpopt_checkpoint: wrote %s: %d state tensors in fp32" % (self.path, len(self.state)),
                  file=sys.stderr)
        else:
            report_optimizer_export(self.c, self.state, self.cls, self.path)


def state_tensors(c):
    """export --optimizer OPT.safetensors: every state buffer of every parameter, in fp32 (decoded where
    quantized), as <kind>/<name> with the parameter's shape."""
    registered = dict(c.tensors)
    tensors = []
    for key in c.names:
        kind, _, name = key.partition("/")
        if name in registered and kind not in ("param", "master", "remainder", "rank") and not kind.endswith("_scale"):
            tensors.append((key, "F32", c.shape("param/" + name),
                            lambda k=kind, n=name: state_float32(c, k, n, registered[n]).tobytes()))
    return tensors


def export_optimizer_checks(args, c, torch):
    """export --optimizer: the state_dict to write, and its torch.optim class, once all is checked."""
    if not args.optimizer.endswith(TORCH_SUFFIXES):
        fail("%s: the optimizer state is written with torch.save (it must end in %s) or alone in fp32 (.safetensors)"
             % (args.optimizer, ", ".join(TORCH_SUFFIXES)))
    if args.weights == "param" and any(c.has_master(n) for n, _ in c.tensors):
        fail("--optimizer with --weights param: Adam's moments belong to the fp32 masters, which torch must "
             "continue from: export those (--weights master, the default)")
    return torch_optimizer_state(c, torch)


def report_optimizer_export(c, state, cls, out):
    cfg = c.config
    steps = sorted(set(g["step"] for g in cfg["groups"]))
    print("mpopt_checkpoint: wrote %s: torch.optim.%s state_dict, %d param groups, step %s; build the optimizer "
          "with the groups in this order, each one's parameters as its param_names list them"
          % (out, cls, len(state["param_groups"]), "/".join(str(s) for s in steps)), file=sys.stderr)
    left = []
    if cfg.get("lr_schedule"):
        left.append("the learning-rate schedule (%s; each group's lr is its last step's, initial_lr its base: "
                    "an LRScheduler built with last_epoch=%d sets the next)"
                    % (cfg["lr_schedule"].get("type"), max(steps) - 1))
    if cfg.get("loss_scaler") not in (None, "no_scaling"):
        left.append("the loss scale (%s)" % json.dumps(cfg.get("scaler")))
    guard = cfg.get("spike_guard")
    if isinstance(guard, dict) and (guard.get("loss") or guard.get("norm")):
        left.append("the spike guard's windows")
    if left:
        print("mpopt_checkpoint: not in a torch.optim state_dict: " + "; ".join(left), file=sys.stderr)


def output_shape(name, template_shape, source_shape):
    """The shape import writes: the template's where it has one of other than one dimension (the
    registered shape load() checks), else the source's; they must agree where both have one."""
    if product(source_shape) != product(template_shape):
        fail("tensor '%s': the source's shape %s holds %d elements, the template's %s %d"
             % (name, shape_text(source_shape), product(source_shape), shape_text(template_shape),
                product(template_shape)))
    if len(template_shape) != 1 and len(source_shape) != 1 and list(template_shape) != list(source_shape):
        fail("tensor '%s': the source's shape is %s, the template's %s"
             % (name, shape_text(source_shape), shape_text(template_shape)))
    return list(template_shape) if len(template_shape) != 1 else list(source_shape)


def cmd_import(args):
    need_numpy("import")
    t = MpoptCheckpoint(args.like)
    if args.optimizer_class and not args.optimizer:
        fail("--optimizer-class says which torch.optim class wrote --optimizer's file: give that too")
    cfg = t.config
    steps = [cfg.get("applied_steps"), cfg.get("skipped_steps")] + [g.get("step") for g in cfg["groups"]]
    if any(s != 0 for s in steps):
        fail("%s: saved after %s applied and %s skipped steps: a template must be saved before the first step "
             "(opt.finalize(); opt.save(path)), so that its optimizer state is fresh"
             % (args.like, cfg.get("applied_steps"), cfg.get("skipped_steps")))
    source = open_source(args.source, args.trust_pickle)
    by_name = {}
    for n in source.names:
        mine = n[len(args.strip_prefix):] if args.strip_prefix and n.startswith(args.strip_prefix) else n
        if mine in by_name:
            fail("%s: tensors '%s' and '%s' both become '%s'" % (args.source, by_name[mine], n, mine))
        by_name[mine] = n
    wanted = [name for name, _ in t.tensors]
    missing = [n for n in wanted if n not in by_name]
    if missing:
        fail("%s lacks %d of the template's %d tensors: %s (it has: %s)%s" % (
            args.source, len(missing), len(wanted), listing(missing), listing(by_name),
            "" if args.strip_prefix else "; --strip-prefix removes a prefix such as 'module.'"))
    wanted_set = set(wanted)
    extra = [n for n in by_name if n not in wanted_set]
    if extra and not args.ignore_extra:
        fail("%s has %d tensors the template does not: %s (--ignore-extra leaves them out)" % (
            args.source, len(extra), listing(extra)))

    shapes = {}
    for name in wanted:
        dtype, shape = source.describe(by_name[name])
        if dtype not in FLOAT_DTYPES:
            fail("tensor '%s' has dtype %s in %s: a parameter must be floating point"
                 % (by_name[name], dtype, args.source))
        shapes[name] = output_shape(name, t.shape("param/" + name), shape)
    adam = TorchAdamState(args.optimizer, t, args.optimizer_class, args.strip_prefix, args.trust_pickle) \
        if args.optimizer else None

    cache = {}  # the source's values for a parameter, between its param/ and master/ tensors

    def values(name):
        if name not in cache:
            cache.clear()
            cache[name] = source.float32(by_name[name])
        return cache[name]

    sizes = dict(t.tensors)
    tensors = []
    for key in t.names:
        kind, _, name = key.partition("/")
        if name in sizes and product(t.shape(key)) == sizes[name]:  # one of the parameter's tensors
            if "remainder/" + name in t.entries and kind in ("param", "remainder"):  # remainder16
                dtype = "BF16" if kind == "param" else "I16"
                tensors.append((key, dtype, shapes[name], lambda n=name, i=int(kind != "param"): split_master(values(n))[i]))
                continue
            if kind == "param":
                dtype = t.dtype(key)
                tensors.append((key, dtype, shapes[name], lambda n=name, d=dtype: float32_to(d, values(n))))
                continue
            if kind == "master":
                tensors.append((key, "F32", shapes[name], lambda n=name: float32_to("F32", values(n))))
                continue
            if adam and name in adam.moments and kind in ADAM_STATE:
                tensors.append((key, t.dtype(key), shapes[name],
                                lambda n=name, k=kind, d=t.dtype(key): float32_to(d, adam.moments[n][k])))
                continue
            tensors.append((key, t.dtype(key), shapes[name], lambda k=key: t.raw(k)))  # fresh state
        else:
            tensors.append((key, t.dtype(key), t.shape(key), lambda k=key: t.raw(k)))
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "mpopt": adam.mpopt_text if adam else t.mpopt_text}
    write_safetensors(args.output, tensors, meta)
    left_out = " (%d left out)" % len(extra) if extra else ""
    state = ("Adam's state at step %d from %s, the rest" % (adam.applied, args.optimizer) if adam
             else "fresh optimizer state")
    print("mpopt_checkpoint: wrote %s: %d tensors from %s%s, %s from %s"
          % (args.output, len(wanted), args.source, left_out, state, args.like), file=sys.stderr)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    sub = p.add_subparsers(dest="command", metavar="{info,export,import}")
    sub.required = True

    s = sub.add_parser("info", help="policies, steps, groups, tensors and shapes of a checkpoint; checks its checksum")
    s.add_argument("checkpoint")
    s.set_defaults(run=cmd_info)

    s = sub.add_parser("export", help="an mpopt checkpoint's weights -> a PyTorch state_dict (.safetensors or .pt); "
                                      "with --optimizer, Adam's state -> a torch.optim state_dict")
    s.add_argument("checkpoint")
    s.add_argument("output", help="OUT.safetensors (no PyTorch needed) or OUT.pt / .bin / .pth (torch.save)")
    s.add_argument("--weights", choices=("master", "param"), default="master",
                   help="the fp32 masters (default; the parameters where the precision is fp32) or the parameters "
                        "in their own dtype")
    s.add_argument("--float32", action="store_true",
                   help="widen 16-bit parameters to float32 (exact): for readers without bfloat16")
    s.add_argument("--no-verify", action="store_true", help="skip the checksum (faster on large files)")
    s.add_argument("--optimizer", metavar="OPT.pt|OPT.safetensors",
                   help="also Adam's state as a torch.optim.AdamW (or Adam, for L2 weight decay) state_dict(), "
                        "written with torch.save: each parameter's exp_avg, exp_avg_sq and step (its group's), each "
                        "group's lr, betas, eps and weight_decay, and param_names: the order to build the groups "
                        "in. Rule adam only. OPT.safetensors: any rule's state buffers alone, <kind>/<name> in fp32, "
                        "no PyTorch needed. Quantized state is decoded")
    s.set_defaults(run=cmd_export)

    s = sub.add_parser("import",
                       help="a PyTorch or DeepSpeed state_dict -> an mpopt checkpoint with fresh optimizer state, "
                            "or with --optimizer, a torch.optim Adam/AdamW state_dict's")
    s.add_argument("source", help=".safetensors, .pt/.bin/.pth, *.index.json, or zero_to_fp32's output directory")
    s.add_argument("--like", required=True, metavar="TEMPLATE",
                   help="a checkpoint of the target optimizer saved before its first step "
                        "(opt.finalize(); opt.save(path))")
    s.add_argument("-o", "--output", required=True, help="the mpopt checkpoint to write (.safetensors)")
    s.add_argument("--strip-prefix", default="", metavar="P", help="remove P from the source's names (e.g. 'module.')")
    s.add_argument("--ignore-extra", action="store_true",
                   help="leave out the source's tensors the template does not have")
    s.add_argument("--trust-pickle", action="store_true",
                   help="torch.load without weights_only: for .pt files holding more than tensors, that you trust")
    s.add_argument("--optimizer", metavar="OPT.pt",
                   help="Adam's state from a torch.optim.AdamW or Adam state_dict() (torch.save) instead of fresh "
                        "state: its param groups are the template's groups, their parameters the template's tensors "
                        "in order. Moments, steps (one per group), lr, betas, eps and weight_decay come from it; "
                        "the template's schedule and base rates stay, so lr matters only without a schedule")
    s.add_argument("--optimizer-class", choices=("AdamW", "Adam"),
                   help="the torch.optim class that saved --optimizer's file, where it has weight decay: AdamW's is "
                        "decoupled, Adam's L2; it must be the template's kind")
    s.set_defaults(run=cmd_import)

    args = p.parse_args(argv)
    try:
        return args.run(args)
    except CheckpointError as e:
        print("mpopt_checkpoint: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    if hasattr(signal, "SIGPIPE"):  # `... | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
