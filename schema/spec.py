"""The field model of schema/mlxgraph.fbs, read from the .fbs itself at import time.

The .fbs is the single source of truth: every field of every table gets its
:class:`FieldKind` here, once (a tensor read or written, a list of them, a value slot, an
Operand, an attribute), and whether it is required. The program, the verifier, the
generic reader and writer, node text and alignment all use this model, so adding an op
means adding its table to the .fbs (and a kernel and a lowering), nothing here.
"""

from dataclasses import dataclass
from enum import Enum
from functools import cache, cached_property
from pathlib import Path

from mlxgraph.schema.idl import SCALAR_SIZES, FieldSpec, Schema, TypeSpec, parse_idl, upper_camel

SCHEMA_PATH = Path(__file__).with_name("mlxgraph.fbs")


class FieldKind(Enum):
    """What a table field is to a node: an input, an output or an attribute."""

    TENSOR = "tensor"                # (in) int: a tensor slot the op reads
    TENSOR_LIST = "tensor list"      # (in) [int]
    OPERAND = "operand"              # Operand (in): a tensor slot, a value slot or a literal
    OPERAND_LIST = "operand list"    # [Operand] (in)
    VALUE = "value"                  # (value_in) int: a value slot (runtime int) the op reads
    OUT = "out"                      # (out) int: the tensor slot the op writes
    OUT_LIST = "out list"            # (out) [int]
    VALUE_OUT = "value out"          # (value_out) int: the value slot the op writes
    ATTR = "attribute"               # anything else: a static attribute

    @property
    def is_input(self) -> bool:
        """Read by the op (tensor, value or operand, one or a list)."""
        return self in _INPUTS

    @property
    def is_output(self) -> bool:
        """Written by the op."""
        return self in _OUTPUTS

    @property
    def is_value(self) -> bool:
        """A value slot (runtime int), read or written."""
        return self in (FieldKind.VALUE, FieldKind.VALUE_OUT)


_INPUTS = frozenset({FieldKind.TENSOR, FieldKind.TENSOR_LIST, FieldKind.OPERAND,
                     FieldKind.OPERAND_LIST, FieldKind.VALUE})
_OUTPUTS = frozenset({FieldKind.OUT, FieldKind.OUT_LIST, FieldKind.VALUE_OUT})


def field_kind(f: FieldSpec) -> FieldKind:
    """The kind the .fbs gives a field: its (in)/(out)/(value_in)/(value_out) attribute,
    its type (Operand) and whether it is a vector.

    Raises:
        ValueError: a combination the model has no kind for (a value-slot vector).
    """
    attrs, many = f.attributes, f.is_vector
    if "out" in attrs:
        return FieldKind.OUT_LIST if many else FieldKind.OUT
    if "value_out" in attrs or "value_in" in attrs:
        if many:
            raise ValueError(f"field {f.name}: value-slot lists are not supported")
        return FieldKind.VALUE_OUT if "value_out" in attrs else FieldKind.VALUE
    if "in" in attrs or f.type == "Operand":
        if f.type == "Operand":
            return FieldKind.OPERAND_LIST if many else FieldKind.OPERAND
        return FieldKind.TENSOR_LIST if many else FieldKind.TENSOR
    return FieldKind.ATTR


def field_required(f: FieldSpec) -> bool:
    """Present in every valid table: marked (required), or an ``= null`` scalar that is
    neither (optional) nor (nullable). A deprecated field is never required."""
    attrs = f.attributes
    if "deprecated" in attrs:
        return False
    nullable = "optional" in attrs or "nullable" in attrs
    return "required" in attrs or (f.default == "null" and not nullable)


def parse_schema(text: str) -> Schema:
    """Parse schema text and derive every field's kind and whether it is required.

    Raises:
        ValueError: the text uses IDL the parser does not cover, or a field the model has
            no kind for.
    """
    schema = parse_idl(text)
    for t in schema.types.values():
        for f in t.fields:
            f.kind, f.required = field_kind(f), field_required(f)
    return schema


@cache
def load_schema() -> Schema:
    """Parse the packaged mlxgraph.fbs (cached).

    Raises:
        ValueError: the schema uses IDL this parser does not cover.
    """
    return parse_schema(SCHEMA_PATH.read_text())


@dataclass(frozen=True)
class OpSpec:
    """One op: its union code, its table, and its fields by kind (deprecated ones left out)."""

    name: str            # e.g. 'UpdateAndAttendNode'
    code: int            # the OpNode union code
    table: TypeSpec

    @property
    def short_name(self) -> str:
        """The op name without the 'Node' suffix, e.g. 'UpdateAndAttend'."""
        return self.name[:-4] if self.name.endswith("Node") else self.name

    @cached_property
    def fields(self) -> tuple:
        """Every live field, in schema order."""
        return tuple(f for f in self.table.fields if "deprecated" not in f.attributes)

    @cached_property
    def inputs(self) -> tuple:
        """The fields the op reads, in schema order."""
        return tuple(f for f in self.fields if f.kind.is_input)

    @cached_property
    def outputs(self) -> tuple:
        """The fields the op writes, in schema order."""
        return tuple(f for f in self.fields if f.kind.is_output)

    @cached_property
    def attributes(self) -> tuple:
        """The static attributes, in schema order."""
        return tuple(f for f in self.fields if f.kind is FieldKind.ATTR)


@cache
def op_specs() -> dict:
    """All ops by union code."""
    schema = load_schema()
    union = schema.types["OpNode"]
    return {code: OpSpec(name, code, schema.types[name]) for name, code in union.values.items()}


@cache
def op_codes() -> dict:
    """Union code by op table name ('AddNode') and by short name ('Add')."""
    out = {}
    for code, spec in op_specs().items():
        out[spec.name] = code
        out[spec.short_name] = code
    return out


def op_spec(op: str) -> OpSpec:
    """The OpSpec of an op by table name ('AddNode') or short name ('Add').

    Raises:
        KeyError: the schema has no such op.
    """
    return op_specs()[op_codes()[op]]


__all__ = ["SCALAR_SIZES", "FieldKind", "FieldSpec", "OpSpec", "Schema", "TypeSpec",
           "field_kind", "load_schema", "op_codes", "op_spec", "op_specs", "parse_schema",
           "upper_camel"]
