"""Crafted KV cache files, each sealed with mlxgraph's own writer (the seal is no secret).

``corpus(base, folder)`` turns one genuine cache file into named mutants: every field of
the session header given a wrong type, sign, size or relation, every tensor a wrong dtype,
rank, shape or name, the container itself broken, and files whose sizes claim tens of GB
(sparse on disk). ``run_case`` takes one file through every reader: ``mlxgraph cache
inspect``'s view, ``cache diff``'s comparison, ``session.restore``, ``program.restore`` and
``generate --prompt-cache``, and names anything that is not a documented refusal.
"""

import json
import struct
from pathlib import Path

import numpy as np

from mlxgraph.interpreter.cache.file import SEAL
from mlxgraph.interpreter.cache.safetensors_io import SafetensorsFile, write

# Bytes a sparse file claims: more than the process can allocate (refused from the header
# by every reader), and a size that fits (restores refuse it against the graph, unread).
GIANT, FITS = 40 << 30, 2 << 30


def _read(base):
    st = SafetensorsFile(base)
    tensors = {n: np.array(st.array(n)) for n in st.entries}
    dtypes = {n: d for n, (d, _) in st.entries.items() if d == "BF16"}
    return tensors, dict(st.metadata), dtypes


def _sealed(path, tensors, meta, dtypes, doc=None):
    meta = {k: v for k, v in meta.items() if k != SEAL}
    if doc is not None:
        meta["mlxgraph.session"] = doc if isinstance(doc, str) else json.dumps(doc)
    write(path, tensors, meta, {k: v for k, v in dtypes.items() if k in tensors}, seal=SEAL)


def _doc_mutants(doc):
    """(name, mutated doc) pairs: one field wrong each."""
    lid = next(iter(doc["layers"]))
    out = []

    def put(name, path, value):
        d = json.loads(json.dumps(doc))
        where = d
        for key in path[:-1]:
            where = where[key]
        if value is _DELETE:
            del where[path[-1]]
        else:
            where[path[-1]] = value
        out.append((name, d))

    for v in (-1, 1.5, "5", 10**30, True, None, 2**40):
        put(f"length={v!r}", ["length"], v)
    for key in ("capacity", "max_step"):
        for v in (0, -3, 2**40, "64", 1.0, None):
            put(f"policy.{key}={v!r}", ["policy", key], v)
    for key, values in {
        "kv_bits": (3, "8", -1, None),
        "kv_group_size": (48, "64", 0, None),
        "kv_dtype": ("int32", "float64", 5, ["float32"]),
        "preallocate": ("yes", 2),
        "windows": ([], {"x": 1}, {lid: -1}, {"1_0": 2}, {lid: 2**40}, "4", {lid: 1.5}),
    }.items():
        for v in values:
            put(f"policy.{key}={v!r}", ["policy", key], v)
    put("policy missing capacity", ["policy", "capacity"], _DELETE)
    put("policy extra key", ["policy", "evil"], 1)
    put("policy=list", ["policy"], [1, 2])
    # A preallocated policy whose capacity no machine holds (restore adopts the policy).
    d = json.loads(json.dumps(doc))
    d["policy"].update(preallocate=True, capacity=2**31 - 1)
    out.append(("policy preallocates 2**31 slots", d))
    for v in ("abc", [1.5], [-1], [0], [2**70], {"a": 1}, [True]):
        put(f"tokens={v!r}", ["tokens"], v)
    put("layers=list", ["layers"], [1])
    put("layers=str", ["layers"], "x")
    for bad_lid in ("abc", "00", " 0", "1_0", "-1", "99999999999999999999"):
        d = json.loads(json.dumps(doc))
        d["layers"][bad_lid] = d["layers"].pop(lid)
        out.append((f"layer id {bad_lid!r}", d))
    put("layer info=list", ["layers", lid], [])
    for key in ("kind", "length", "oldest", "batch", "dtype", "slots", "window", "modulus"):
        put(f"layer missing {key}", ["layers", lid, key], _DELETE)
        for v in (-1, 2**40, "1", 1.5, None, [1], 0):
            put(f"layer {key}={v!r}", ["layers", lid, key], v)
    for v in ("weird", "store", "ring", "flat"):
        put(f"layer kind={v!r}", ["layers", lid, "kind"], v)
    for v in ("float64", "uint32", "bfloat16", "float16", "int8"):
        put(f"layer dtype={v!r}", ["layers", lid, "dtype"], v)
    put("layer extra key", ["layers", lid, "evil"], 1)
    for v in ([], {"0": "x"}, {"x": 1}, "a"):
        put(f"approximations={v!r}", ["approximations"], v)
    put("doc extra key", ["evil"], 1)
    put("doc missing layers", ["layers"], _DELETE)
    return out


_DELETE = object()


def _tensor_mutants(tensors):
    """(name, tensors) pairs: one tensor wrong each."""
    out = []
    first = sorted(tensors)[0]
    arr = tensors[first]

    def swap(name, new):
        t = dict(tensors)
        if new is None:
            del t[first]
        else:
            t[first] = new
        out.append((name, t))

    swap("tensor missing", None)
    swap("tensor float16", arr.astype(np.float16))
    swap("tensor int64", arr.view(np.uint32).astype(np.int64) if arr.itemsize == 4 else
         arr.astype(np.int64))
    swap("tensor uint8", arr.view(np.uint8))
    swap("tensor rank 3", arr.reshape(arr.shape[0], arr.shape[1], -1))
    swap("tensor rank 5", arr[None])
    swap("tensor zero slots", arr[:, :, :0])
    swap("tensor one slot less", arr[:, :, :-1])
    swap("tensor batch 2", np.concatenate([arr, arr]))
    swap("tensor heads doubled", np.concatenate([arr, arr], axis=1))
    swap("tensor width doubled", np.concatenate([arr, arr], axis=3))
    swap("tensor width halved", np.ascontiguousarray(arr[..., : max(1, arr.shape[3] // 2)]))
    swap("tensor scalar", np.zeros((), arr.dtype))
    nan = arr.copy()
    if nan.dtype.kind == "f":
        nan[...] = np.nan
        swap("tensor all NaN", nan)
    t = dict(tensors)
    t["layer.999.keys"] = arr
    out.append(("extra tensor", t))
    t = dict(tensors)
    t["layer.0.keys.evil"] = arr
    out.append(("extra tensor suffix", t))
    return out


def _container_mutants(raw: bytes):
    """(name, bytes): the safetensors container broken (no valid seal needed)."""
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8 : 8 + n]
    out = [
        ("empty", b""),
        ("seven bytes", raw[:7]),
        ("header length 2**63", struct.pack("<Q", 1 << 63) + raw[8:]),
        ("header length past the end", struct.pack("<Q", len(raw)) + raw[8:]),
        ("truncated data", raw[:-5]),
        ("trailing bytes", raw + b"\0" * 8),
        ("flipped data byte", raw[:-9] + bytes([raw[-9] ^ 0x40]) + raw[-8:]),
        ("header not utf-8", raw[:8] + b"\xff" * n + raw[8 + n :]),
        ("header a list", _with_header(raw, b"[]")),
        ("header deep nesting", _with_header(raw, b"[" * 200_000 + b"]" * 200_000)),
        ("metadata deep nesting", _with_header(
            raw, b'{"__metadata__":' + b"[" * 100_000 + b"]" * 100_000 + b"}")),
        ("header a huge number", _with_header(raw, b'{"x":' + b"9" * 100_000 + b"}")),
        ("shape product overflow", _with_header(raw, json.dumps({
            "a": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 2**126]}}
        ).encode())),
        ("offsets negative", _with_header(raw, json.dumps({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}).encode())),
        ("dtype unknown", header.replace(b'"F32"', b'"F64"', 1)),
    ]
    out[-1] = ("dtype unknown", raw[:8] + out[-1][1] + raw[8 + n :])
    return out


def _with_header(raw: bytes, header: bytes) -> bytes:
    header += b" " * (-len(header) % 8)
    n = struct.unpack("<Q", raw[:8])[0]
    return struct.pack("<Q", len(header)) + header + raw[8 + n :]


def _giant(path, tensors, meta, dtypes, doc, size=None):
    """A sparse file whose first tensor claims ``size`` bytes (default: GIANT or twice what
    the process can allocate): the header is consistent, the seal is not, and reading it
    all would take minutes."""
    from mlxgraph.interpreter.memory import allocatable_bytes

    size = size or max(GIANT, 2 * (allocatable_bytes() or 0))
    first = sorted(tensors)[0]
    arr = tensors[first]
    per_slot = arr.nbytes // max(1, arr.shape[2])
    slots = size // max(1, per_slot)
    header, offset = {}, 0
    for name in sorted(tensors):
        a = tensors[name]
        shape = list(a.shape)
        if name == first:
            shape[2] = slots
        size = int(np.prod(shape)) * a.itemsize
        dtype = dtypes.get(name) or {"<f4": "F32", "<f2": "F16", "<u4": "U32"}[a.dtype.str]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    d = json.loads(json.dumps(doc))
    lid = first.split(".")[1]
    d["layers"][lid]["slots"] = slots
    d["layers"][lid]["modulus"] = max(slots, d["layers"][lid]["modulus"])
    header["__metadata__"] = {**meta, "mlxgraph.session": json.dumps(d), SEAL: "0" * 64}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def corpus(base, folder) -> list:
    """[(name, path)]: the mutants of the genuine cache file ``base``, written in ``folder``."""
    folder = Path(folder)
    tensors, meta, dtypes = _read(base)
    doc = json.loads(meta["mlxgraph.session"])
    out = []

    def emit(name, fill):
        path = folder / f"m{len(out):04d}.safetensors"
        fill(path)
        out.append((name, path))

    for name, d in _doc_mutants(doc):
        emit(name, lambda p, d=d: _sealed(p, tensors, meta, dtypes, d))
    for text in ("{", "[]", '"x"', "1", "[" * 100_000 + "]" * 100_000, "\ud800"):
        emit(f"session doc {text[:12]!r}", lambda p, t=text: _sealed(p, tensors, meta, dtypes, t))
    for key in ("mlxgraph.session", "mlxgraph.graph", "mlxgraph.format", "mlxgraph.version"):
        m = {k: v for k, v in meta.items() if k != key}
        emit(f"metadata missing {key}", lambda p, m=m: _sealed(p, tensors, m, dtypes))
    for name, t in _tensor_mutants(tensors):
        emit(name, lambda p, t=t: _sealed(p, t, meta, dtypes))
    for name, raw in _container_mutants(Path(base).read_bytes()):
        emit(name, lambda p, raw=raw: p.write_bytes(raw))
    emit("sparse 40 GB tensor", lambda p: _giant(p, tensors, meta, dtypes, doc))
    emit("sparse 40 GB, policy to match", lambda p: _giant_policy(p, tensors, meta, dtypes, doc))
    emit("sparse 2 GB (restores only)", lambda p: _giant(p, tensors, meta, dtypes, doc, FITS))
    return out


def _giant_policy(path, tensors, meta, dtypes, doc):
    """The sparse giant with a policy and layer info that claim to hold it."""
    d = json.loads(json.dumps(doc))
    d["policy"]["capacity"] = 2**31 - 1
    _giant(path, tensors, meta, dtypes, d)
