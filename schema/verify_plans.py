"""Plans for checking and decoding each table of the schema, compiled once from schema/spec.py.

A plan says, per field, where its vtable entry is, what kind of value it holds (scalar,
struct, string, table, union or a vector of those), its size and alignment, its default
(None for `= null`), the enum codes it may take and whether it must be present. The walk
in schema/verify_structure.py follows these plans; the schema model is read only here.
"""

import struct
from collections import namedtuple
from functools import cache

from mlxgraph.schema.spec import SCALAR_SIZES, load_schema

# How an unknown code of these enums or unions is named in messages.
CODE_NAMES = {"DType": "dtype", "OpNode": "op"}

_FMT = {"bool": "?", "byte": "b", "ubyte": "B", "int8": "b", "uint8": "B", "short": "h",
        "ushort": "H", "int16": "h", "uint16": "H", "int": "i", "uint": "I", "int32": "i",
        "uint32": "I", "float": "f", "float32": "f", "long": "q", "ulong": "Q", "int64": "q",
        "uint64": "Q", "double": "d", "float64": "d"}

# Field kinds.
SCALAR, STRUCT, STRING, TABLE, UNION, VSCALAR, VSTRUCT, VSTRING, VTABLE = range(9)


class FieldPlan:
    """How to check and decode one table field."""

    __slots__ = ("name", "vi", "kind", "size", "align", "unpack", "sub", "required", "enum")

    def __init__(self, name, vi, kind, size, align, fmt, sub, required, enum):
        self.name, self.vi, self.kind, self.size, self.align = name, vi, kind, size, align
        self.unpack = struct.Struct("<" + fmt).unpack_from if fmt else None
        self.sub, self.required, self.enum = sub, required, enum


class TablePlan:
    """How to check and decode one table: field plans, defaults and its record type."""

    def __init__(self, name):
        self.name = name
        self.fields = []
        self.defaults = []
        self.record = None
        self.entries = 2           # vtable entries worth reading (2 header + slots)
        self.vt_unpack = []        # entries -> unpack of that many uint16


class StructPlan:
    """A struct's layout: unpack, size, alignment, record type and enum members to check."""

    def __init__(self, spec, schema):
        fmt, pos = "<", 0
        self.enums = []
        for i, f in enumerate(spec.fields):
            if f.slot > pos:
                fmt += f"{f.slot - pos}x"
            ftype = schema.types.get(f.type)
            base = ftype.underlying if ftype is not None else f.type
            fmt += _FMT[base]
            pos = f.slot + SCALAR_SIZES[base]
            if ftype is not None:
                self.enums.append((i, f.name, _enum_info(ftype)))
        if spec.size > pos:
            fmt += f"{spec.size - pos}x"
        self.name, self.size, self.align = spec.name, spec.size, spec.align
        self.struct = struct.Struct(fmt)
        self.record = namedtuple(spec.name, [f.name for f in spec.fields])


def _enum_info(spec):
    return (f"{CODE_NAMES.get(spec.name, spec.name)} code", frozenset(spec.values.values()))


def _default(schema, f):
    """The value an absent scalar field reads as (None for `= null`)."""
    if f.default == "null":
        return None
    ftype = schema.types.get(f.type)
    if ftype is not None and ftype.kind == "enum":
        if f.default is None:
            return 0
        return ftype.values[f.default] if f.default in ftype.values else int(f.default)
    if f.type == "bool":
        return f.default == "true"
    if f.type in ("float", "double", "float32", "float64"):
        return float(f.default or 0)
    return int(float(f.default or 0))


@cache
def table_plans() -> dict:
    """Plans for every table of the packaged schema, by table name (cached)."""
    schema = load_schema()
    plans = {n: TablePlan(n) for n, t in schema.types.items() if t.kind == "table"}
    structs = {n: StructPlan(t, schema) for n, t in schema.types.items() if t.kind == "struct"}
    for name, plan in plans.items():
        spec = schema.types[name]
        for f in spec.fields:
            plan.fields.append(_field_plan(schema, plans, structs, name, f))
            plan.defaults.append(
                _default(schema, f) if schema.scalar_size(f.type) and not f.is_vector else None
            )
            plan.entries = max(plan.entries, 3 + f.slot)
        plan.record = namedtuple(name, [f.name for f in spec.fields])
        plan.vt_unpack = [struct.Struct(f"<{k}H").unpack_from for k in range(plan.entries + 1)]
    return plans


def _field_plan(schema, plans, structs, table, f) -> FieldPlan:
    required = f.required
    ftype = schema.types.get(f.type)
    vi = 2 + f.slot
    enum = _enum_info(ftype) if ftype is not None and ftype.kind == "enum" else None
    if ftype is not None and ftype.kind == "union":
        members = {code: plans[m] for m, code in ftype.values.items()}
        what = f"{CODE_NAMES.get(f.type, f.type)} code"
        return FieldPlan(f.name, vi, UNION, 4, 4, "", (members, what), required, None)
    base = ftype.underlying if enum else f.type
    if f.is_vector:
        if base in _FMT:
            return FieldPlan(
                f.name, vi, VSCALAR, 4, 4, "", (_FMT[base], SCALAR_SIZES[base]), required, enum
            )
        if f.type == "string":
            return FieldPlan(f.name, vi, VSTRING, 4, 4, "", None, required, None)
        if ftype.kind == "struct":
            return FieldPlan(f.name, vi, VSTRUCT, 4, 4, "", structs[f.type], required, None)
        return FieldPlan(f.name, vi, VTABLE, 4, 4, "", plans[f.type], required, None)
    if base in _FMT:
        size = SCALAR_SIZES[base]
        return FieldPlan(f.name, vi, SCALAR, size, size, _FMT[base], None, required, enum)
    if f.type == "string":
        return FieldPlan(f.name, vi, STRING, 4, 4, "", None, required, None)
    if ftype.kind == "struct":
        sp = structs[f.type]
        return FieldPlan(f.name, vi, STRUCT, sp.size, sp.align, "", sp, required, None)
    return FieldPlan(f.name, vi, TABLE, 4, 4, "", plans[f.type], required, None)
