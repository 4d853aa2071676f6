"""What exporter/quantize.py needs beyond one Linear or Embedding at a time: the rows of a
table of more than two axes (a mixture-of-experts layer's ``[E, out, in]`` expert weights,
picked per token by expert id) as a QuantizedEmbedding then a Reshape, and the list of
every weight that stays float, with why.
"""

import math

from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.records import NodeRecord, Operand
from mlxgraph.schema.spec import FieldKind, op_spec


def table_refusal(writer, node, group_size: int) -> str | None:
    """Why an Embedding of a table of rank > 2 cannot be quantized exactly, or None.

    Its rows flattened ([E, A, B] as [E, A * B]) quantize in groups along B alone when B is
    a multiple of the group size, so each dequantized row is what quantizing the table's
    [A, B] matrices would store; one axis of ids keeps the Reshape back a plain -1.
    """
    shape = writer.tensors[node.fields["weight"]][2]
    if shape[-1] % group_size:
        return f"its last axis {shape[-1]} is not a multiple of {group_size}"
    if len(writer.tensors[node.fields["indices"]][2]) != 1:
        return "ids of more than one axis"
    return None


def quantized_table_nodes(writer, node, table_op: str, fields: dict) -> list:
    """A QuantizedEmbedding of the flattened rows into a new slot, then a Reshape into the
    Embedding's own output (its shape: the ids' axis, then the table's other axes)."""
    out = node.fields["out"]
    name, code, out_shape = writer.tensors[out]
    rest = [int(d) for d in writer.tensors[node.fields["weight"]][2][1:]]
    rows = writer.add_tensor(f"{name}_rows", dtype_info(code).name,
                             [out_shape[0], math.prod(rest)])
    gather = NodeRecord(table_op, dict(fields, out=rows), node.provenance)
    shape = [Operand.literal(-1)] + [Operand.literal(d) for d in rest]
    reshape = NodeRecord("ReshapeNode", {"x": rows, "out": out, "shape": shape}, node.provenance)
    return [gather, reshape]


def _reads(record):
    """(field name, tensor slot) of each tensor a node reads."""
    for f in op_spec(record.op).inputs:
        if f.kind is FieldKind.VALUE:
            continue
        value = record.fields.get(f.name)
        for v in value if isinstance(value, list | tuple) else (value,):
            if isinstance(v, Operand):
                if v.kind == "tensor":
                    yield f.name, v.index
            elif v is not None:
                yield f.name, v


def float_weights(writer, reasons: dict) -> list:
    """'name (why)' for each float constant of two or more axes that a node still reads,
    in slot order: ``reasons[slot]`` where the quantizer said why, else the ops reading
    it (none has a quantized form)."""
    constants = {slot for slot, _, _ in writer.constants}
    readers = {}
    for record in writer.nodes:
        if entry(record.op).has(Trait.QUANTIZED):
            continue
        for _, slot in _reads(record):
            if slot in constants:
                readers.setdefault(slot, set()).add(record.op.removesuffix("Node"))
    listed = []
    for slot in sorted(readers):
        name, code, shape = writer.tensors[slot]
        if len(shape) < 2 or code is None or not dtype_info(code).is_float:
            continue
        why = reasons.get(slot) or f"read by {', '.join(sorted(readers[slot]))}: no quantized form"
        listed.append(f"{name} ({why})")
    return listed


__all__ = ["table_refusal", "quantized_table_nodes", "float_weights"]
