"""The safetensors container, written and read with numpy only (no torch, no new dependency).

Layout (https://github.com/huggingface/safetensors): 8 bytes little-endian header length
``N``, then ``N`` bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets"}, ...,
"__metadata__": {str: str}}``, then the data section, each tensor's bytes at its offsets.

The reader is strict, because a cache file may come from a stranger: the header is
bounded, every entry is checked (known dtype, shape of non-negative ints, offsets that
match the shape), the tensors tile the data section exactly (no gaps, overlaps or
trailing bytes), and the data is read only when asked for, a tensor or a bounded piece at
a time, never memory-mapped (a mapped file truncated by another process kills the reader
with SIGBUS).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct

import numpy as np

from mlxgraph.schema.atomic_write import write_atomically
from mlxgraph.schema.errors import Error
from mlxgraph.schema.file_source import open_regular

MAX_HEADER_BYTES = 16 << 20
_DTYPES = {
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "U32": "<u4",
    "U16": "<u2",
    "I32": "<i4",
    "I64": "<i8",
    "U8": "u1",
}


class SafetensorsError(Error, ValueError):
    """The file is not a well-formed safetensors file (the message says what is wrong)."""


def write(
    path, tensors: dict, metadata: dict, st_dtypes: dict | None = None, seal: str | None = None
) -> None:
    """Write ``tensors`` ({name: ndarray}) and string ``metadata`` as one safetensors file.

    Args:
        path: where to write (replaced atomically, schema/atomic_write.py: an exclusive
            temporary file beside it, synced, then renamed; nothing left on failure).
        tensors: C-contiguous-able numpy arrays of a dtype in the table above.
        metadata: {str: str}.
        st_dtypes: {name: safetensors dtype} where the numpy dtype is ambiguous (BF16 bits).
        seal: a metadata key to store a SHA-256 of everything else in the file under
            (see ``SafetensorsFile.seal_matches``).
    Raises:
        FileExistsError: ``path`` is a folder, symlink, device, FIFO or socket.
        OSError: the file cannot be written.
    """
    header, offset = {}, 0
    arrays = []
    for name in sorted(tensors):
        arr = np.asarray(tensors[name], order="C")   # (ascontiguousarray makes 0-d 1-d)
        st = (st_dtypes or {}).get(name) or next(
            k for k, v in _DTYPES.items() if np.dtype(v) == arr.dtype
        )
        header[name] = {
            "dtype": st,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    meta = dict(metadata)
    if seal:
        digest = _sealed_digest(meta, header)
        for arr in arrays:
            digest.update(_raw_bytes(arr))
        meta[seal] = digest.hexdigest()
    header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned

    def fill(f):
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for arr in arrays:
            f.write(_raw_bytes(arr))

    write_atomically(path, fill)


def _raw_bytes(arr: np.ndarray) -> memoryview:
    """A contiguous array's bytes; also for zero-size arrays, which memoryview.cast refuses."""
    return memoryview(arr.reshape(-1).view(np.uint8))


class SafetensorsFile:
    """A checked safetensors file: ``metadata``, ``entries`` ({name: (dtype, shape)}),
    ``size`` (the file's bytes), ``array(name)`` (a read-only numpy copy of one tensor).

    Only the header is read here: the data is read when asked for, a tensor at a time
    (``array``) or streamed in bounded pieces (``seal_matches``), so a file whose header
    claims tens of GB costs nothing until a caller has checked those sizes. Every later
    read first checks the file is still the one whose header was checked (device, inode,
    size and modification time), so a file changed in between is refused, not mixed.
    """

    def __init__(self, path):
        self.path = path
        fd, st = open_regular(path)   # a FIFO or device would block or never end
        self._identity = _identity(st)
        with os.fdopen(fd, "rb") as f:
            size = self.size = st.st_size
            if size < 8:
                raise SafetensorsError(f"truncated: {size} bytes, not even a header length")
            (n,) = struct.unpack("<Q", _read_exact(f, 0, 8))
            if n > MAX_HEADER_BYTES:
                raise SafetensorsError(
                    f"header length {n} is over the {MAX_HEADER_BYTES}-byte limit")
            if 8 + n > size:
                raise SafetensorsError(f"truncated: the header needs {n} bytes, the file has "
                                       f"{size - 8} after its length")
            header = _parse_header(_read_exact(f, 8, n))
        self.metadata = header.pop("__metadata__")
        self._start = 8 + n
        self.entries, self._offsets = {}, {}
        self.data_bytes = self._check_layout(header)
        if self._start + self.data_bytes != size:
            what = "truncated" if self._start + self.data_bytes > size else "trailing bytes"
            raise SafetensorsError(f"{what}: the tensors need {self.data_bytes} data bytes, "
                                   f"the file has {size - self._start}")

    def _check_layout(self, header: dict) -> int:
        """Fill entries/offsets; the tensors must tile the data section. Returns its size."""
        spans = []
        for name, entry in header.items():
            dtype, shape, (begin, end) = _entry(name, entry)
            spans.append((begin, end, name))
            self.entries[name] = (dtype, shape)
            self._offsets[name] = begin
        spans.sort()
        at = 0
        for begin, end, name in spans:
            if begin != at:
                raise SafetensorsError(
                    f"tensor {name!r} starts at {begin}, expected {at} (gap or overlap)"
                )
            at = end
        return at

    def _open_same(self):
        """The file opened again, refused unless it is still the one whose header was read."""
        fd, st = open_regular(self.path)
        if _identity(st) != self._identity:
            os.close(fd)
            raise SafetensorsError("the file changed since its header was read; read it again")
        return os.fdopen(fd, "rb")

    def seal_matches(self, seal: str) -> bool:
        """Whether metadata[seal] is the SHA-256 of the rest of the file (False if absent).
        Reads the data in pieces of 16 MiB: memory stays bounded whatever the file's size."""
        meta = dict(self.metadata)
        stored = meta.pop(seal, None)
        if stored is None:
            return False
        header = {
            name: {
                "dtype": d,
                "shape": list(s),
                "data_offsets": [self._offsets[name], self._offsets[name] + self.nbytes(name)],
            }
            for name, (d, s) in self.entries.items()
        }
        digest = _sealed_digest(meta, header)
        piece = bytearray(min(1 << 24, self.data_bytes))
        with self._open_same() as f:
            for at in range(0, self.data_bytes, len(piece) or 1):
                n = min(len(piece), self.data_bytes - at)
                if n != len(piece):
                    piece = bytearray(n)
                f.seek(self._start + at)
                if f.readinto(piece) != n:
                    raise SafetensorsError("the file changed while its seal was checked")
                digest.update(piece)
        return digest.hexdigest() == stored

    def nbytes(self, name: str) -> int:
        """The bytes tensor ``name`` takes in the file."""
        dtype, shape = self.entries[name]
        return math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` read from the file as a read-only numpy array (BF16 as uint16 bits).

        Raises:
            KeyError: no such tensor. SafetensorsError: the file changed, or its bytes do
                not fit in memory. OSError: the read fails.
        """
        dtype, shape = self.entries[name]
        n = self.nbytes(name)
        try:
            buf = bytearray(n)
        except MemoryError:
            raise SafetensorsError(f"tensor {name!r}: {n} bytes do not fit in memory") from None
        with self._open_same() as f:
            f.seek(self._start + self._offsets[name])
            if f.readinto(buf) != n:
                raise SafetensorsError("the file changed while it was read")
        return np.frombuffer(memoryview(buf).toreadonly(), dtype=np.dtype(_DTYPES[dtype])
                             ).reshape(shape)


def _identity(st) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_exact(f, offset: int, n: int) -> bytearray:
    """``n`` bytes at ``offset``, or SafetensorsError if the file ends first (it shrank)."""
    buf = bytearray(n)
    f.seek(offset)
    got = f.readinto(buf)
    if got != n:
        raise SafetensorsError(f"changed while being read: {got} of {n} bytes at {offset}")
    return buf


def _parse_header(raw) -> dict:
    """The JSON header as a dict with a checked ``__metadata__`` ({str: str})."""
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError(f"header is not JSON ({e})") from None
    except RecursionError:
        raise SafetensorsError("header is not JSON (nested too deeply)") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    meta = header.setdefault("__metadata__", {})
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise SafetensorsError("__metadata__ must map strings to strings")
    return header


def _sealed_digest(meta: dict, header: dict):
    """SHA-256 started on the metadata (less the seal) and the tensor table, canonically."""
    table = {
        name: [e["dtype"], list(e["shape"]), list(e["data_offsets"])]
        for name, e in header.items()
        if name != "__metadata__"
    }
    canonical = json.dumps(
        {"metadata": meta, "tensors": table}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode())


def _entry(name, entry):
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(
            f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets"
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in _DTYPES:
        raise SafetensorsError(f"tensor {name!r}: dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise SafetensorsError(
            f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r}"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise SafetensorsError(
            f"tensor {name!r}: data_offsets must be [begin, end], got {offsets!r}"
        )
    want = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if offsets[1] - offsets[0] != want:
        raise SafetensorsError(
            f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} {dtype} "
            f"({want} bytes)"
        )
    return dtype, tuple(shape), offsets
