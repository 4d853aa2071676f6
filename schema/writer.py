"""Write .mlxg files: the FlatBuffer first, then the 64-byte aligned constant segment.

The exporter builds a graph with :class:`GraphWriter` (slots, constants, nodes, metadata)
and calls :meth:`GraphWriter.write`. Nodes are encoded generically from the schema model
(schema/spec.py) through the generated bindings, so a new op needs no code here.
"""


import flatbuffers
import numpy as np

from mlxgraph.generated import mlxgraph_generated as fb
from mlxgraph.schema import encode
from mlxgraph.schema.atomic_write import write_atomically
from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import (
    ALIGNMENT,
    FILE_IDENTIFIER,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    MAX_FLATBUFFER_BYTES,
    align_up,
    content_hash,
)
from mlxgraph.schema.reader import read_file
from mlxgraph.schema.records import ModelInfo, NodeRecord, Operand, Provenance
from mlxgraph.schema.spec import FieldKind, op_spec
from mlxgraph.schema.verifier import verify_report


class GraphWriter:
    """Collects a graph and writes it as one .mlxg file.

    Slots are numbered in the order they are added. Constants are deduplicated by
    content: adding the same bytes with the same dtype and shape twice returns the
    first slot (tied embeddings are stored once).
    """

    def __init__(self, producer: str = "mlxgraph"):
        self.producer = producer
        self.metadata = ModelInfo()
        self.tensors = []        # (name, dtype code or None, shape entries)
        self.values = []         # names
        self.symbols = []        # (name, min, max, value slot)
        self._symbol_index = {}
        self.inputs = []         # (name, slot)
        self.outputs = []
        self.constants = []      # (slot, bytes-like, hash or None: write() computes it)
        self._by_content = {}    # (dtype code, shape, fingerprint) -> [(slot, bytes-like)]
        self._digests = {}       # slot -> hash computed for a comparison (add_constant)
        self.nodes = []          # NodeRecord

    # ------------------------------------------------------------------ slots
    def add_symbol(self, name: str, min_value: int = 0, max_value: int | None = None) -> int:
        """Declare a symbolic dim; returns the value slot that holds it at run time."""
        value_slot = self.add_value(name)
        self._symbol_index[name] = len(self.symbols)
        self.symbols.append((name, int(min_value), max_value, value_slot))
        return value_slot

    def add_value(self, name: str) -> int:
        """Declare a value slot (a runtime int); returns its index."""
        self.values.append(name)
        return len(self.values) - 1

    def add_tensor(self, name: str, dtype, shape) -> int:
        """Declare a tensor slot; returns its index.

        Args:
            name: a readable name (the fx node name).
            dtype: a dtype name ('float32') or code, or None when unknown.
            shape: entries of int (static), str (a declared symbol's name) or None (dynamic).
        Raises:
            KeyError: unknown dtype or symbol.
        """
        code = None if dtype is None else dtype_info(dtype).code
        for d in shape:
            if isinstance(d, str) and d not in self._symbol_index:
                raise KeyError(f"tensor {name}: unknown symbol {d!r}")
        self.tensors.append((name, code, tuple(shape)))
        return len(self.tensors) - 1

    def add_constant(self, name: str, array: np.ndarray, dtype=None) -> int:
        """Add a constant tensor; returns its tensor slot (shared when the content repeats).

        Args:
            name: slot name (parameter path).
            array: the data; for bfloat16 pass its uint16 bit pattern and dtype='bfloat16'.
            dtype: the dtype name when it differs from the array's (bfloat16).
        """
        dtype = dtype or str(array.dtype)
        info = dtype_info(dtype)
        data = np.ascontiguousarray(array).astype(info.numpy_storage, copy=False)
        # Same content means same dtype, shape and fingerprint; only then are the digests
        # compared (and computed). Others wait for write(): a float weight that quantizing
        # replaces is never hashed (blake2b of a 156M model's float32 weights: ~1.3 s).
        candidates = self._by_content.setdefault(
            (info.code, tuple(data.shape), _fingerprint(data)), [])
        digest = None
        if candidates:
            digest = _digest(data)
            for slot, other in candidates:
                if slot not in self._digests:
                    self._digests[slot] = _digest(other)
                if self._digests[slot] == digest:
                    return slot
        slot = self.add_tensor(name, dtype, data.shape)
        self.constants.append((slot, data, digest))
        candidates.append((slot, data))
        return slot

    def add_input(self, name: str, slot: int) -> None:
        """Name a tensor slot as a graph input."""
        self.inputs.append((name, slot))

    def add_output(self, name: str, slot: int) -> None:
        """Name a tensor slot as a graph output."""
        self.outputs.append((name, slot))

    def add_node(self, op: str, /, provenance: Provenance | None = None, **fields) -> NodeRecord:
        """Append a node to the main chain.

        Args:
            op: the op table name ('AddNode') or short name ('Add').
            provenance: where it came from.
            fields: the table's fields (see NodeRecord).
        Raises:
            KeyError: unknown op or field.
            ValueError: a required field is missing (the file would not load).
        """
        spec = op_spec(op)
        known = {f.name for f in spec.table.fields}
        unknown = set(fields) - known
        if unknown:
            raise KeyError(f"{spec.name} has no field(s) {sorted(unknown)}")
        missing = [f.name for f in spec.table.fields if f.required and fields.get(f.name) is None]
        if missing:
            raise ValueError(f"{spec.name} needs field(s) {missing}")
        record = NodeRecord(spec.name, dict(fields), provenance or Provenance())
        self.nodes.append(record)
        return record

    def drop_unread_constants(self) -> list:
        """Drop constants no node reads and no output names (after a rewrite such as
        quantization replaced their readers); returns the dropped slots. Their tensor
        slots stay declared (slot numbers never move) and are filled by nothing."""
        read = {slot for _, slot in self.outputs}
        for record in self.nodes:
            for f in op_spec(record.op).inputs:
                if f.kind is FieldKind.VALUE:
                    continue  # a value slot, not a tensor
                value = record.fields.get(f.name)
                for v in value if isinstance(value, list | tuple) else (value,):
                    if isinstance(v, Operand):
                        if v.kind == "tensor":
                            read.add(v.index)
                    elif v is not None:
                        read.add(v)
        dropped = [slot for slot, _, _ in self.constants if slot not in read]
        self.constants = [c for c in self.constants if c[0] in read]
        self._by_content = {k: [c for c in slots if c[0] in read]
                            for k, slots in self._by_content.items()}
        return dropped

    # ------------------------------------------------------------------ output
    def write(self, path, verify: bool = False) -> dict:
        """Write the file; returns {'bytes', 'flatbuffer_bytes', 'constant_bytes'} and, when
        verified, 'element_limit_needed': None, or the largest tensor of a step when that is
        more than the file's default element limit (loading then needs ``element_limit``).

        The file appears whole or not at all (schema/atomic_write.py).

        Args:
            path: where to write.
            verify: verify the written file (structure and semantics, not the hashes)
                before it takes ``path``'s place; an invalid file is deleted, never kept.
        Raises:
            ValueError: the FlatBuffer part would exceed 2 GiB.
            FileExistsError: ``path`` is a folder, device, FIFO or symlink (never replaced).
            OSError: the write failed; an old file at ``path`` is unchanged.
            GraphFormatError: ``verify`` and the written file is not a valid graph file
                (an old file at ``path`` is unchanged).
        """
        # Every digest the file records, those deferred by add_constant included.
        self.constants = [(slot, data, digest or self._digests.get(slot) or _digest(data))
                          for slot, data, digest in self.constants]
        # The root records where the constant segment starts, which depends on the size
        # of the FlatBuffer itself: build once to learn the size, then again for real
        # (the size does not depend on the offsets' values, only on their presence).
        probe = self._build(segment_offset=2**62, layout=None)
        segment_offset = align_up(len(probe))
        layout, cursor = [], segment_offset
        for slot, data, digest in self.constants:
            layout.append((slot, cursor, data.nbytes, digest))
            cursor = align_up(cursor + data.nbytes)
        segment_length = cursor - segment_offset
        buf = self._build(segment_offset, layout, segment_length)
        if len(buf) != len(probe):
            raise AssertionError("FlatBuffer size changed between passes")

        def fill(f):
            f.write(buf)
            f.write(b"\0" * (segment_offset - len(buf)))
            for (_, offset, nbytes, _), (_, data, _) in zip(layout, self.constants):
                assert f.tell() == offset
                if nbytes:  # (a view of zero elements cannot be cast to bytes)
                    f.write(memoryview(data).cast("B"))
                f.write(b"\0" * (align_up(offset + nbytes) - offset - nbytes))

        found = {}
        check = (lambda tmp: found.update(_verify_written(tmp, path))) if verify else None
        write_atomically(path, fill, check=check)
        return {"bytes": cursor, "flatbuffer_bytes": len(buf), "constant_bytes": segment_length,
                **found}

    def _build(self, segment_offset, layout, segment_length=2**62) -> bytes:
        b = flatbuffers.Builder(1 << 16)
        nodes = [encode.node(b, n) for n in self.nodes]
        chains = encode.chains(b, nodes)
        tensors_vec = encode.tensors(b, self.tensors, self._symbol_index)
        values_vec = encode.values(b, self.values)
        symbols_vec = encode.symbols(b, self.symbols)
        io_vecs = [encode.io_specs(b, field_name, entries)
                   for field_name, entries in (("inputs", self.inputs), ("outputs", self.outputs))]
        if layout is None:
            layout = [(slot, 2**62, data.nbytes, digest) for slot, data, digest in self.constants]
        consts_vec = encode.constants(b, layout)
        meta = encode.metadata(b, self.metadata)
        producer = b.CreateString(self.producer)

        fb.GraphStart(b)
        fb.GraphAddVersionMajor(b, FORMAT_MAJOR)
        fb.GraphAddVersionMinor(b, FORMAT_MINOR)
        fb.GraphAddProducer(b, producer)
        fb.GraphAddMetadata(b, meta)
        fb.GraphAddTensors(b, tensors_vec)
        fb.GraphAddValues(b, values_vec)
        fb.GraphAddSymbols(b, symbols_vec)
        fb.GraphAddInputs(b, io_vecs[0])
        fb.GraphAddOutputs(b, io_vecs[1])
        fb.GraphAddConstants(b, consts_vec)
        fb.GraphAddChains(b, chains)
        fb.GraphAddSegmentOffset(b, segment_offset)
        fb.GraphAddSegmentLength(b, segment_length)
        root = fb.GraphEnd(b)
        b.Finish(root, file_identifier=FILE_IDENTIFIER)
        out = b.Output()
        if len(out) > MAX_FLATBUFFER_BYTES:
            raise ValueError("graph structure exceeds 2 GiB")
        return bytes(out)


# Bytes from each end of a constant that, with its dtype and shape, decide whether its
# digest is compared with another's: different weights differ there.
_FINGERPRINT_BYTES = 4096


def _fingerprint(data: np.ndarray) -> bytes:
    """The first and last _FINGERPRINT_BYTES of ``data``'s bytes (all of a small one)."""
    if not data.size:
        return b""  # (a view of zero elements cannot be cast to bytes)
    raw = memoryview(data).cast("B")
    if len(raw) <= 2 * _FINGERPRINT_BYTES:
        return bytes(raw)
    return bytes(raw[:_FINGERPRINT_BYTES]) + bytes(raw[-_FINGERPRINT_BYTES:])


def _digest(data: np.ndarray) -> str:
    """content_hash of ``data``'s bytes."""
    return content_hash(data) if data.size else content_hash(b"")


def _verify_written(tmp, path) -> dict:
    """Verify the file just written at ``tmp`` (errors name ``path``; the caller deletes it).

    The element limit is a loader's policy, not a property of a valid file: the file is
    verified without it, and {'element_limit_needed'} says whether a default load would
    refuse it (then it is the largest step tensor, the ``element_limit`` to load it with).
    """
    data, size, constants = read_file(tmp)
    try:
        report = verify_report(data, path=path, size=size, constants=constants,
                               element_limit=_UNLIMITED)
        try:
            verify_report(data, path=path, size=size, constants=constants)
            needed = None
        except GraphFormatError:
            # (A slot whose size is only known at run time counts as the limit itself:
            # the loader checks it against whatever limit it is given.)
            needed = max((n for n in report.bounds.slot_elements if n < _UNLIMITED), default=0)
    finally:
        constants.close()
    return {"element_limit_needed": needed}


# Far past any machine's memory; below 2**63 so element counts stay exact integers.
_UNLIMITED = 2**62

__all__ = ["GraphWriter", "Operand", "Provenance", "ALIGNMENT"]
