"""FlatBuffer encoders for the parts of a graph file, used by :class:`GraphWriter`.

Each function builds one part with the generated bindings and returns its offset. The
order in which the writer calls them fixes the file's bytes, so they never reorder work.
"""

from mlxgraph.generated import mlxgraph_generated as fb
from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.records import NodeRecord
from mlxgraph.schema.spec import FieldKind, load_schema, op_spec, upper_camel
from mlxgraph.schema.tokenizer_files import join_extra

_PREPEND_INT = {1: "PrependInt8", 2: "PrependInt16", 4: "PrependInt32", 8: "PrependInt64"}


def _fn(name: str):
    return getattr(fb, name)


def vector(b, table: str, field_name: str, offsets: list) -> int:
    """A vector of table offsets for ``table.field_name``."""
    _fn(f"{table}Start{upper_camel(field_name)}Vector")(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def chains(b, nodes: list) -> int:
    """The graph's chains: one, 'main', holding every node."""
    chain_name = b.CreateString("main")
    fb.ChainStartNodesVector(b, len(nodes))
    for off in reversed(nodes):
        b.PrependUOffsetTRelative(off)
    nodes_vec = b.EndVector()
    fb.ChainStart(b)
    fb.ChainAddName(b, chain_name)
    fb.ChainAddNodes(b, nodes_vec)
    chain = fb.ChainEnd(b)
    return vector(b, "Graph", "chains", [chain])


def tensors(b, entries: list, symbol_index: dict) -> int:
    """The tensor slots: (name, dtype code or None, shape entries) each."""
    out = []
    for name, code, shape in entries:
        n = b.CreateString(name)
        fb.TensorSlotStartShapeVector(b, len(shape))
        for d in reversed(shape):
            if isinstance(d, str):
                fb.CreateDim(b, -1, symbol_index[d])
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
        out.append(fb.TensorSlotEnd(b))
    return vector(b, "Graph", "tensors", out)


def values(b, names: list) -> int:
    """The value slots, by name."""
    out = []
    for name in names:
        n = b.CreateString(name)
        fb.ValueSlotStart(b)
        fb.ValueSlotAddName(b, n)
        out.append(fb.ValueSlotEnd(b))
    return vector(b, "Graph", "values", out)


def symbols(b, entries: list) -> int:
    """The symbolic dims: (name, min, max or None, value slot) each."""
    out = []
    for name, lo, hi, slot in entries:
        n = b.CreateString(name)
        fb.SymbolStart(b)
        fb.SymbolAddName(b, n)
        fb.SymbolAddMin(b, lo)
        if hi is not None:
            fb.SymbolAddMax(b, int(hi))
        fb.SymbolAddValue(b, slot)
        out.append(fb.SymbolEnd(b))
    return vector(b, "Graph", "symbols", out)


def io_specs(b, field_name: str, entries: list) -> int:
    """The graph's ``inputs`` or ``outputs``: (name, tensor slot) each."""
    out = []
    for name, slot in entries:
        n = b.CreateString(name)
        fb.IOSpecStart(b)
        fb.IOSpecAddName(b, n)
        fb.IOSpecAddTensor(b, slot)
        out.append(fb.IOSpecEnd(b))
    return vector(b, "Graph", field_name, out)


def constants(b, layout: list) -> int:
    """The constants: (tensor slot, offset, length, content hash) each."""
    out = []
    for slot, offset, nbytes, digest in layout:
        h = b.CreateString(digest)
        fb.ConstantStart(b)
        fb.ConstantAddTensor(b, slot)
        fb.ConstantAddOffset(b, offset)
        fb.ConstantAddLength(b, nbytes)
        fb.ConstantAddHash(b, h)
        out.append(fb.ConstantEnd(b))
    return vector(b, "Graph", "constants", out)


def metadata(b, m) -> int:
    """The ModelMetadata table of a :class:`ModelInfo`."""
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
        fb.LayerCacheAddAttentionChunk(b, lc.attention_chunk)
        fb.LayerCacheAddValuesInKeys(b, lc.values_in_keys)  # false: not written (format 1.2)
        layers.append(fb.LayerCacheEnd(b))
    layers_vec = vector(b, "ModelMetadata", "layers", layers)
    extra = []
    # The embedded tokenizer files ride in extra (schema/tokenizer_files.py).
    for k, v in sorted(join_extra(m.extra, m.tokenizer_files or {}).items()):
        ko, vo = b.CreateString(str(k)), b.CreateString(str(v))
        fb.KeyValueStart(b)
        fb.KeyValueAddKey(b, ko)
        fb.KeyValueAddValue(b, vo)
        extra.append(fb.KeyValueEnd(b))
    extra_vec = vector(b, "ModelMetadata", "extra", extra)
    states_vec = _states(b, m.states) if m.states else None
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
    if states_vec is not None:  # absent in a graph without recurrent state (as before 1.3)
        fb.ModelMetadataAddStates(b, states_vec)
    return fb.ModelMetadataEnd(b)


def _states(b, states) -> int:
    """The StateLayer tables (format 1.3) of StateLayerInfo records."""
    out = []
    for st in states:
        fb.StateLayerStartShapeVector(b, len(st.shape))
        for d in reversed(st.shape):
            b.PrependInt64(int(d))
        shape = b.EndVector()
        fb.StateLayerStart(b)
        fb.StateLayerAddLayerId(b, st.layer_id)
        fb.StateLayerAddShape(b, shape)
        fb.StateLayerAddDtype(b, dtype_info(st.dtype).code)
        out.append(fb.StateLayerEnd(b))
    return vector(b, "ModelMetadata", "states", out)


def _scalar_vector(b, spec_name: str, f, items) -> int:
    """A vector field of scalars or Operand structs."""
    _fn(f"{spec_name}Start{f.accessor}Vector")(b, len(items))
    for item in reversed(list(items)):
        if f.kind is FieldKind.OPERAND_LIST:
            fb.CreateOperand(b, item.kind_code, item.index, item.number)
        elif f.type in ("float", "double"):
            (b.PrependFloat32 if f.type == "float" else b.PrependFloat64)(item)
        else:
            getattr(b, _PREPEND_INT[load_schema().scalar_size(f.type)])(item)
    return b.EndVector()


def node(b, record: NodeRecord) -> int:
    """One Node: the op table (encoded generically from the schema model) and provenance."""
    spec = op_spec(record.op)
    name = spec.name
    # Offsets (vectors, strings) must be created before the table starts.
    vectors = {}
    for f in spec.table.fields:
        value = record.fields.get(f.name)
        if value is not None and f.is_vector:
            vectors[f.name] = _scalar_vector(b, name, f, value)
    _fn(f"{name}Start")(b)
    for f in spec.table.fields:
        value = record.fields.get(f.name)
        if value is None:
            continue
        add = _fn(f"{name}Add{f.accessor}")
        if f.is_vector:
            add(b, vectors[f.name])
        elif f.kind is FieldKind.OPERAND:
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
