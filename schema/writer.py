"""Write .mlxg files: the FlatBuffer first, then the 64-byte aligned constant segment.

The exporter builds a graph with :class:`GraphWriter` (slots, constants, nodes, metadata)
and calls :meth:`GraphWriter.write`. Nodes are encoded generically from the schema model
(schema/spec.py) through the generated bindings, so a new op needs no code here.
"""

import hashlib
import os
from pathlib import Path

import flatbuffers
import numpy as np

from mlxgraph.generated import mlxgraph_generated as fb
from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.format import ALIGNMENT, FILE_IDENTIFIER, FORMAT_MAJOR, FORMAT_MINOR, align_up
from mlxgraph.schema.records import ModelInfo, NodeRecord, Operand, Provenance
from mlxgraph.schema.spec import load_schema, op_spec, upper_camel


def content_hash(data) -> str:
    """The hex blake2b-128 digest a Constant records for its bytes."""
    return hashlib.blake2b(memoryview(data).cast("B"), digest_size=16).hexdigest()


def _fn(name: str):
    return getattr(fb, name)


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
        self.constants = []      # (slot, bytes-like, hash)
        self._by_content = {}
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
        digest = content_hash(data) if data.size else content_hash(b"")
        key = (digest, info.code, tuple(data.shape))
        if key in self._by_content:
            return self._by_content[key]
        slot = self.add_tensor(name, dtype, data.shape)
        self.constants.append((slot, data, digest))
        self._by_content[key] = slot
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
        """
        spec = op_spec(op)
        known = {f.name for f in spec.table.fields}
        unknown = set(fields) - known
        if unknown:
            raise KeyError(f"{spec.name} has no field(s) {sorted(unknown)}")
        record = NodeRecord(spec.name, dict(fields), provenance or Provenance())
        self.nodes.append(record)
        return record

    # ------------------------------------------------------------------ output
    def write(self, path) -> dict:
        """Write the file; returns {'bytes', 'flatbuffer_bytes', 'constant_bytes'}.

        Raises:
            ValueError: the FlatBuffer part would exceed 2 GiB.
        """
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
        path = Path(path)
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            f.write(buf)
            f.write(b"\0" * (segment_offset - len(buf)))
            for (_, offset, nbytes, _), (_, data, _) in zip(layout, self.constants):
                assert f.tell() == offset
                f.write(memoryview(data).cast("B"))
                f.write(b"\0" * (align_up(offset + nbytes) - offset - nbytes))
        os.replace(tmp, path)
        return {"bytes": cursor, "flatbuffer_bytes": len(buf), "constant_bytes": segment_length}

    def _build(self, segment_offset, layout, segment_length=2**62) -> bytes:
        b = flatbuffers.Builder(1 << 16)
        s = b.CreateString
        nodes = [self._node(b, n) for n in self.nodes]
        chain_name = s("main")
        fb.ChainStartNodesVector(b, len(nodes))
        for off in reversed(nodes):
            b.PrependUOffsetTRelative(off)
        nodes_vec = b.EndVector()
        fb.ChainStart(b)
        fb.ChainAddName(b, chain_name)
        fb.ChainAddNodes(b, nodes_vec)
        chain = fb.ChainEnd(b)
        chains = self._vector(b, "Graph", "chains", [chain])

        tensors = []
        for name, code, shape in self.tensors:
            n = s(name)
            fb.TensorSlotStartShapeVector(b, len(shape))
            for d in reversed(shape):
                if isinstance(d, str):
                    fb.CreateDim(b, -1, self._symbol_index[d])
                elif d is None:
                    fb.CreateDim(b, -1, -2)
                else:
                    fb.CreateDim(b, int(d), -1)
            shape_vec = b.EndVector()
            fb.TensorSlotStart(b)
            fb.TensorSlotAddName(b, n)
            if code is not None:
                fb.TensorSlotAddDtype(b, code)
            fb.TensorSlotAddShape(b, shape_vec)
            tensors.append(fb.TensorSlotEnd(b))
        tensors_vec = self._vector(b, "Graph", "tensors", tensors)

        values = []
        for name in self.values:
            n = s(name)
            fb.ValueSlotStart(b)
            fb.ValueSlotAddName(b, n)
            values.append(fb.ValueSlotEnd(b))
        values_vec = self._vector(b, "Graph", "values", values)

        symbols = []
        for name, lo, hi, slot in self.symbols:
            n = s(name)
            fb.SymbolStart(b)
            fb.SymbolAddName(b, n)
            fb.SymbolAddMin(b, lo)
            if hi is not None:
                fb.SymbolAddMax(b, int(hi))
            fb.SymbolAddValue(b, slot)
            symbols.append(fb.SymbolEnd(b))
        symbols_vec = self._vector(b, "Graph", "symbols", symbols)

        io_vecs = []
        for field_name, entries in (("inputs", self.inputs), ("outputs", self.outputs)):
            offs = []
            for name, slot in entries:
                n = s(name)
                fb.IOSpecStart(b)
                fb.IOSpecAddName(b, n)
                fb.IOSpecAddTensor(b, slot)
                offs.append(fb.IOSpecEnd(b))
            io_vecs.append(self._vector(b, "Graph", field_name, offs))

        consts = []
        for slot, offset, nbytes, digest in layout or [(c[0], 2**62, c[1].nbytes, c[2]) for c in self.constants]:
            h = s(digest)
            fb.ConstantStart(b)
            fb.ConstantAddTensor(b, slot)
            fb.ConstantAddOffset(b, offset)
            fb.ConstantAddLength(b, nbytes)
            fb.ConstantAddHash(b, h)
            consts.append(fb.ConstantEnd(b))
        consts_vec = self._vector(b, "Graph", "constants", consts)
        meta = self._metadata(b)
        producer = s(self.producer)

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
        if len(out) > 2**31 - 1:
            raise ValueError("graph structure exceeds 2 GiB")
        return bytes(out)

    @staticmethod
    def _vector(b, table: str, field_name: str, offsets: list) -> int:
        _fn(f"{table}Start{upper_camel(field_name)}Vector")(b, len(offsets))
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    def _metadata(self, b) -> int:
        m = self.metadata
        arch = b.CreateString(m.architecture or "")
        tok = b.CreateString(m.tokenizer or "")
        fb.ModelMetadataStartEosTokenIdsVector(b, len(m.eos_token_ids))
        for t in reversed(m.eos_token_ids):
            b.PrependInt64(int(t))
        eos = b.EndVector()
        layers = []
        for lc in m.layers:
            fb.LayerCacheStart(b)
            fb.LayerCacheAddLayerId(b, lc.layer_id)
            fb.LayerCacheAddKvHeads(b, lc.kv_heads)
            fb.LayerCacheAddHeadDim(b, lc.head_dim)
            fb.LayerCacheAddVHeadDim(b, lc.v_head_dim)
            fb.LayerCacheAddSlidingWindow(b, lc.sliding_window)
            layers.append(fb.LayerCacheEnd(b))
        layers_vec = self._vector(b, "ModelMetadata", "layers", layers)
        extra = []
        for k, v in sorted(m.extra.items()):
            ko, vo = b.CreateString(str(k)), b.CreateString(str(v))
            fb.KeyValueStart(b)
            fb.KeyValueAddKey(b, ko)
            fb.KeyValueAddValue(b, vo)
            extra.append(fb.KeyValueEnd(b))
        extra_vec = self._vector(b, "ModelMetadata", "extra", extra)
        fb.ModelMetadataStart(b)
        fb.ModelMetadataAddArchitecture(b, arch)
        fb.ModelMetadataAddNumLayers(b, m.num_layers)
        fb.ModelMetadataAddVocabSize(b, m.vocab_size)
        fb.ModelMetadataAddHiddenSize(b, m.hidden_size)
        fb.ModelMetadataAddMaxContext(b, m.max_context)
        fb.ModelMetadataAddEosTokenIds(b, eos)
        fb.ModelMetadataAddBosTokenId(b, m.bos_token_id)
        fb.ModelMetadataAddLayers(b, layers_vec)
        fb.ModelMetadataAddTokenizer(b, tok)
        fb.ModelMetadataAddExtra(b, extra_vec)
        return fb.ModelMetadataEnd(b)

    def _node(self, b, record: NodeRecord) -> int:
        schema = load_schema()
        spec = op_spec(record.op)
        name = spec.name
        # Offsets (vectors, strings) must be created before the table starts.
        vectors = {}
        for f in spec.table.fields:
            value = record.fields.get(f.name)
            if value is None or not f.is_vector:
                continue
            camel = f.accessor
            _fn(f"{name}Start{camel}Vector")(b, len(value))
            for item in reversed(list(value)):
                if f.type == "Operand":
                    fb.CreateOperand(b, item.kind_code, item.index, item.number)
                else:
                    size = schema.scalar_size(f.type)
                    prepend = {1: b.PrependInt8, 2: b.PrependInt16, 4: b.PrependInt32, 8: b.PrependInt64}[size]
                    if f.type in ("float", "double"):
                        prepend = b.PrependFloat32 if f.type == "float" else b.PrependFloat64
                    prepend(item)
            vectors[f.name] = b.EndVector()
        _fn(f"{name}Start")(b)
        for f in spec.table.fields:
            value = record.fields.get(f.name)
            if value is None:
                continue
            add = _fn(f"{name}Add{f.accessor}")
            if f.is_vector:
                add(b, vectors[f.name])
            elif f.type == "Operand":
                add(b, fb.CreateOperand(b, value.kind_code, value.index, value.number))
            elif f.type in ("float", "double"):
                add(b, float(value))
            elif f.type == "bool":
                add(b, bool(value))
            else:
                add(b, int(value))
        table = _fn(f"{name}End")(b)
        prov = record.provenance
        src, mod, tgt = (b.CreateString(x) for x in (prov.source, prov.module_path, prov.target))
        fb.ProvenanceStart(b)
        fb.ProvenanceAddSource(b, src)
        fb.ProvenanceAddModulePath(b, mod)
        fb.ProvenanceAddTarget(b, tgt)
        prov_off = fb.ProvenanceEnd(b)
        fb.NodeStart(b)
        fb.NodeAddOpType(b, spec.code)
        fb.NodeAddOp(b, table)
        fb.NodeAddProvenance(b, prov_off)
        return fb.NodeEnd(b)


__all__ = ["GraphWriter", "Operand", "Provenance", "content_hash", "ALIGNMENT"]
