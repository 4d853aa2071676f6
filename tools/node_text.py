"""The canonical forms of a node: one line of text (for grep and git diff) and a JSON record.

Both are driven by the op specs read from the schema (schema/spec.py), so a new op prints
with no change here. The text form of node ``i`` is::

    12  Linear  x=%5:h weight=%3:model.q.weight -> out=%13:q  axis=1  # model.layers.0 linear_3
        aten.linear.default   (one line; wrapped here)

inputs (schema order) -> outputs, then attributes (each field's kind from
schema/spec.py), then the provenance (module path, fx node name, ATen target). Tensor
slots print as ``%slot:name``, value slots (runtime ints) as ``$slot:name``, literals as
numbers; enum attributes by name; 32-bit float attributes in their shortest float32 form.
"""

from functools import cache

import numpy as np

from mlxgraph.schema.dtypes import dtype_info, is_known_code
from mlxgraph.schema.records import Operand
from mlxgraph.schema.spec import load_schema, op_spec


@cache
def short_name(op: str) -> str:
    """'LinearNode' -> 'Linear'."""
    return op_spec(op).short_name


def node_fields(record):
    """The node's present fields in schema order as (FieldSpec, value); absent ones skipped."""
    fields = record.fields
    return [(f, fields[f.name]) for f in op_spec(record.op).fields
            if fields.get(f.name) is not None]


@cache
def _enum_names(type_name: str) -> dict | None:
    t = load_schema().types.get(type_name)
    if t is None or t.kind != "enum":
        return None
    return {code: name for name, code in t.values.items()}


def attr_value(f, value):
    """An attribute's value in canonical Python form (enums by name, float32 shortest)."""
    if f.type == "DType":
        return dtype_info(value).name if is_known_code(value) else f"dtype#{value}"
    names = _enum_names(f.type)
    if names is not None:
        return names.get(value, f"{f.type}#{value}")
    if f.type == "float":
        return [_f32(v) for v in value] if f.is_vector else _f32(value)
    if f.type == "bool":
        return bool(value)
    return list(value) if f.is_vector else value


def _f32(v) -> float:
    # the shortest decimal that reads back as the same float32 (1e-05, not 9.99999974e-06)
    return float(str(np.float32(v)))


def _scalar_text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(_scalar_text(x) for x in v) + "]"
    return str(v)


class SlotNames:
    """Tensor and value slot names of one graph, for printing references."""

    def __init__(self, graph):
        self.tensors = [t.name for t in graph.tensors]
        self.values = list(graph.values)

    def tensor(self, slot) -> str:
        """A tensor slot reference, ``%slot:name`` (``?`` for a slot the graph lacks)."""
        name = self.tensors[slot] if 0 <= slot < len(self.tensors) else "?"
        return f"%{slot}:{name}"

    def value(self, slot) -> str:
        """A value slot reference, ``$slot:name`` (``?`` for a slot the graph lacks)."""
        name = self.values[slot] if 0 <= slot < len(self.values) else "?"
        return f"${slot}:{name}"


def _ref_text(f, value, names: SlotNames) -> str:
    def one(v):
        if isinstance(v, Operand):
            if v.kind == "tensor":
                return names.tensor(v.index)
            if v.kind == "value":
                return names.value(v.index)
            return _scalar_text(v.python_value())
        return names.value(v) if f.kind.is_value else names.tensor(v)

    if f.is_vector:
        return "[" + ",".join(one(v) for v in value) + "]"
    return one(value)


def format_node(index: int, record, names: SlotNames, width: int = 0) -> str:
    """The canonical one-line text of node ``index`` (see the module docstring)."""
    ins, outs, attrs = [], [], []
    for f, value in node_fields(record):
        if f.kind.is_input:
            ins.append(f"{f.name}={_ref_text(f, value, names)}")
        elif f.kind.is_output:
            outs.append(f"{f.name}={_ref_text(f, value, names)}")
        else:
            attrs.append(f"{f.name}={_scalar_text(attr_value(f, value))}")
    p = record.provenance
    line = f"{index:>{width}}  {short_name(record.op)}  {' '.join(ins)} -> {' '.join(outs)}"
    if attrs:
        line += "  " + " ".join(attrs)
    prov = " ".join(x for x in (p.module_path, p.source, p.target) if x)
    return line + (f"  # {prov}" if prov else "")


def _ref_json(f, value, names: SlotNames):
    def one(v):
        if isinstance(v, Operand):
            if v.kind in ("tensor", "value"):
                table = names.tensors if v.kind == "tensor" else names.values
                return {
                    "kind": v.kind,
                    "slot": v.index,
                    "name": table[v.index] if 0 <= v.index < len(table) else None,
                }
            return {"kind": v.kind, "value": v.python_value()}
        kind = "value" if f.kind.is_value else "tensor"
        table = names.values if kind == "value" else names.tensors
        return {"kind": kind, "slot": v, "name": table[v] if 0 <= v < len(table) else None}

    return [one(v) for v in value] if f.is_vector else one(value)


def node_json(index: int, record, names: SlotNames) -> dict:
    """The node as a JSON-ready dict: index, op, inputs, outputs, attributes, provenance."""
    ins, outs, attrs = {}, {}, {}
    for f, value in node_fields(record):
        if f.kind.is_input:
            ins[f.name] = _ref_json(f, value, names)
        elif f.kind.is_output:
            outs[f.name] = _ref_json(f, value, names)
        else:
            attrs[f.name] = attr_value(f, value)
    p = record.provenance
    return {
        "index": index,
        "op": short_name(record.op),
        "inputs": ins,
        "outputs": outs,
        "attributes": attrs,
        "provenance": {"module_path": p.module_path, "source": p.source, "target": p.target},
    }
