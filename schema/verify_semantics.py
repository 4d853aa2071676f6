"""Semantic checks of a structurally verified graph, on the records verify_structure decodes.

What a well-formed FlatBuffer can still get wrong: slot indices out of range, a node
reading a slot nothing has defined yet, graph outputs never written, dims naming unknown
symbols, constants outside the segment, misaligned, of the wrong length or overlapping,
and (deep) constant bytes that do not match their hash. Each check raises
GraphFormatError with the node index (main chain) and the field at fault.
"""

import hashlib
import math
from functools import cache

from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.enums import OperandKind
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import ALIGNMENT
from mlxgraph.schema.spec import FieldKind, op_specs

_HEX = frozenset(b"0123456789abcdef")
_HASH_PIECE = 1 << 24  # deep verification reads a constant 16 MiB at a time
_OPERANDS = (FieldKind.OPERAND, FieldKind.OPERAND_LIST)
_LISTS = (FieldKind.TENSOR_LIST, FieldKind.OPERAND_LIST, FieldKind.OUT_LIST)


@cache
def _op_slots() -> dict:
    """Per op code: (table name, inputs, outputs), from the field model. An entry is
    (field index into the decoded table, name, is an Operand, is a list, slot kind), the
    kind's facts unpacked once so the per-node loop only reads booleans."""
    out = {}
    for code, spec in op_specs().items():
        ins, outs = [], []
        for i, f in enumerate(spec.table.fields):
            entry = (i, f.name, f.kind in _OPERANDS, f.kind in _LISTS,
                     "value" if f.kind.is_value else "tensor")
            if f.kind.is_input:
                ins.append(entry)
            elif f.kind.is_output:
                outs.append(entry)
        out[code] = (spec.name, tuple(ins), tuple(outs))
    return out


def check_graph(g, constants, deep: bool) -> set:
    """Run every semantic check on the decoded Graph record ``g``.

    Args:
        g: the Graph record from verify_structure.Walker.
        constants: reads the file's constant bytes (``.read(offset, length)``) for hashes.
        deep: also hash every constant's bytes.
    Returns:
        The tensor slots graph inputs and constants fill.
    Raises:
        GraphFormatError: the first fault found (without the file name).
    """
    nt, nv, ns = len(g.tensors), len(g.values or ()), len(g.symbols or ())
    for i, s in enumerate(g.symbols or ()):
        _slot(s.value, nv, "value", None, f"symbols[{i}].value")
        if s.min < 0 or (s.max is not None and s.max < s.min):
            raise GraphFormatError(
                f"symbol bounds [{s.min}, {s.max}] are invalid", field=f"symbols[{i}]"
            )
    for i, t in enumerate(g.tensors):
        for j, d in enumerate(t.shape):
            if (
                d.symbol >= ns
                or d.symbol < -2
                or (d.symbol == -1 and d.size < 0)
                or (d.symbol == -2 and d.size < -1)
            ):
                raise GraphFormatError(
                    f"dim (size {d.size}, symbol {d.symbol}) is invalid (the graph has {ns} "
                    "symbols)",
                    field=f"tensors[{i}].shape[{j}]",
                )
    inputs = _io(g.inputs, nt, "inputs")
    _io(g.outputs, nt, "outputs")
    const_slots = _constants(g, constants, deep)
    both = inputs & const_slots
    if both:
        raise GraphFormatError(
            f"tensor slot {min(both)} is both a graph input and a constant", field="inputs"
        )
    if g.metadata is not None:
        _layers(g.metadata.layers or ())
    if not g.chains:
        raise GraphFormatError(
            "the graph has no chain (chains[0] is the main chain)", field="chains"
        )
    tdef = bytearray(nt)
    for slot in inputs | const_slots:
        tdef[slot] = 1
    vdef = bytearray(nv)
    for s in g.symbols or ():
        vdef[s.value] = 1
    for c, chain in enumerate(g.chains):
        defined = _chain(chain.nodes, bytearray(tdef), bytearray(vdef), c)
        if c == 0:
            for o in g.outputs:
                if not defined[o.tensor]:
                    raise GraphFormatError(
                        f"output {o.name.decode('utf-8', 'replace')!r} (tensor slot {o.tensor}) "
                        "is never defined",
                        field="outputs",
                    )
    return inputs | const_slots


def _slot(v, n, kind, node, field):
    if not 0 <= v < n:
        raise GraphFormatError(
            f"{kind} slot {v} out of range (the graph has {n} {kind} slots)", node=node, field=field
        )


def _io(entries, nt, field) -> set:
    names, slots = set(), set()
    for i, e in enumerate(entries):
        _slot(e.tensor, nt, "tensor", None, f"{field}[{i}].tensor")
        if e.name in names:
            raise GraphFormatError(
                f"name {e.name.decode('utf-8', 'replace')!r} appears twice", field=f"{field}[{i}]"
            )
        names.add(e.name)
        slots.add(e.tensor)
    return slots


def _layers(layers) -> None:
    seen = set()
    for i, lc in enumerate(layers):
        if lc.layer_id in seen:
            raise GraphFormatError(
                f"layer_id {lc.layer_id} appears twice", field=f"metadata.layers[{i}]"
            )
        seen.add(lc.layer_id)
        sizes = (lc.kv_heads, lc.head_dim, lc.v_head_dim)
        if min(sizes) < 1 or min(lc.sliding_window, lc.attention_chunk) < 0:
            raise GraphFormatError("cache geometry must be positive", field=f"metadata.layers[{i}]")
        if lc.values_in_keys and lc.v_head_dim > lc.head_dim:
            # Format 1.3 (latent attention): the values are a prefix of each stored key row.
            raise GraphFormatError(
                f"values_in_keys: v_head_dim {lc.v_head_dim} is wider than the keys' head_dim "
                f"{lc.head_dim}", field=f"metadata.layers[{i}]")


def _constants(g, constants, deep) -> set:
    """Check every constant; returns the tensor slots they fill."""
    seg_start, seg_end = g.segment_offset, g.segment_offset + g.segment_length
    shapes = g.tensors
    slots, spans = set(), {}
    for i, c in enumerate(g.constants or ()):
        where = f"constants[{i}]"
        _slot(c.tensor, len(shapes), "tensor", None, f"{where}.tensor")
        if c.tensor in slots:
            raise GraphFormatError(
                f"tensor slot {c.tensor} is filled by two constants", field=where
            )
        slots.add(c.tensor)
        t = shapes[c.tensor]
        if t.dtype is None or any(d.symbol != -1 for d in t.shape):
            raise GraphFormatError(
                f"constant tensor slot {c.tensor} needs a dtype and a static shape", field=where
            )
        want = dtype_info(t.dtype).itemsize * math.prod(d.size for d in t.shape)
        if c.length != want:
            raise GraphFormatError(
                f"length {c.length} != {want} bytes of its slot's shape and dtype",
                field=f"{where}.length",
            )
        if c.offset % ALIGNMENT:
            raise GraphFormatError(
                f"offset {c.offset} is not {ALIGNMENT}-byte aligned", field=f"{where}.offset"
            )
        if c.offset < seg_start or c.offset + c.length > seg_end:
            raise GraphFormatError(
                f"bytes [{c.offset}, {c.offset + c.length}) lie outside the constant segment "
                f"[{seg_start}, {seg_end})",
                field=f"{where}.offset",
            )
        if len(c.hash) != 32 or not _HEX.issuperset(c.hash):
            raise GraphFormatError(
                "hash is not 32 lowercase hex digits (blake2b-128)", field=f"{where}.hash"
            )
        # Constants at the same offset share bytes (identical content stored once).
        prev = spans.get(c.offset)
        if prev is None or c.length > prev[0]:
            spans[c.offset] = (c.length, i)
        if deep and _hash_range(constants, c.offset, c.length) != c.hash.decode():
            raise GraphFormatError("bytes do not match their hash", field=f"{where}.hash")
    end, last = seg_start, None
    for offset in sorted(spans):
        length, i = spans[offset]
        if offset < end:
            raise GraphFormatError(
                f"bytes overlap constants[{last}]", field=f"constants[{i}].offset"
            )
        if length:
            end, last = offset + length, i
    return slots


def _hash_range(constants, offset: int, length: int) -> str:
    """writer.content_hash of the bytes [offset, offset + length), read in bounded pieces."""
    h = hashlib.blake2b(digest_size=16)
    for start in range(offset, offset + length, _HASH_PIECE):
        h.update(constants.read(start, min(_HASH_PIECE, offset + length - start)))
    return h.hexdigest()


def _chain(nodes, tdef, vdef, c) -> bytearray:
    """Check one chain's nodes in order; returns the tensor slots defined at its end."""
    ops = _op_slots()
    for i, node in enumerate(nodes):
        code, t = node.op
        name, ins, outs = ops[code]
        where = (i, "") if c == 0 else (None, f"chains[{c}].nodes[{i}].")
        try:
            for idx, fname, operand, many, kind in ins:
                v = t[idx]
                if v is None:
                    continue
                defs = vdef if kind == "value" else tdef
                for j, item in enumerate(v if many else (v,)):
                    f = f"{fname}[{j}]" if many else fname
                    if operand:
                        _operand(item, tdef, vdef, f)
                        continue
                    _slot(item, len(defs), kind, None, f)
                    if not defs[item]:
                        raise GraphFormatError(_undefined(kind, item), field=f)
            for idx, fname, _, many, kind in outs:
                v = t[idx]
                if v is None:
                    continue
                defs = vdef if kind == "value" else tdef
                for j, s in enumerate(v if many else (v,)):
                    _slot(s, len(defs), kind, None, f"{fname}[{j}]" if many else fname)
                    defs[s] = 1
        except GraphFormatError as e:
            raise GraphFormatError(
                e.reason, node=where[0], field=f"{where[1]}{name}.{e.field}"
            ) from None
    return tdef


def _undefined(kind: str, slot: int) -> str:
    by = (
        "a graph input, a constant or an earlier node"
        if kind == "tensor"
        else "a symbol or an earlier node"
    )
    return f"{kind} slot {slot} is read before anything defines it ({by})"


def _operand(o, tdef, vdef, field) -> None:
    if o.kind == OperandKind.tensor or o.kind == OperandKind.value:
        defs, kind = (tdef, "tensor") if o.kind == OperandKind.tensor else (vdef, "value")
        _slot(o.index, len(defs), kind, None, field)
        if not defs[o.index]:
            raise GraphFormatError(_undefined(kind, o.index), field=field)
    elif o.kind == OperandKind.int_ and not (math.isfinite(o.number) and o.number == int(o.number)):
        raise GraphFormatError(f"integer literal {o.number} is not an integer", field=field)
    elif o.kind == OperandKind.bool_ and o.number not in (0.0, 1.0):
        raise GraphFormatError(f"bool literal {o.number} is not 0 or 1", field=field)
