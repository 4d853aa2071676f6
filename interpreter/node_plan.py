"""How a node runs: each node of a graph resolved once, at load, to a :class:`ResolvedNode`.

A resolved node holds its kernel (from the registry keyed by the union's op code), where
each input comes from, its attributes already read out of the FlatBuffer and converted,
and where its outputs go.
"""

from dataclasses import dataclass

from mlxgraph.interpreter.kernels import get_kernel
from mlxgraph.interpreter.mlx_dtypes import to_mx_dtype, widened
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.spec import FieldKind, op_spec

# An Operand's source: a tensor slot, a value slot, or a literal (kept as a Python number).
_OPERAND_SOURCES = {"tensor": FieldKind.TENSOR, "value": FieldKind.VALUE}


@dataclass(frozen=True)
class ResolvedNode:
    """A node ready to run: kernel, input plan, fixed keyword arguments, output plan."""

    index: int
    record: object          # the NodeRecord (for errors, observers, tools)
    fn: object
    needs_context: bool
    tensor_reads: tuple     # (field name, tensor slot): the common input, on the fast path
    reads: tuple            # every other input: (field name, FieldKind, where); see below
    fixed: dict             # attributes (and literal operands), passed as they are
    out_kind: FieldKind     # OUT, OUT_LIST or VALUE_OUT
    out_slots: tuple        # tensor or value slots written
    out_dtypes: tuple       # declared mx dtype per written tensor slot (None = keep)
    guard: tuple | None = None  # (index field, table field, axis, wrap negatives): clamp, flag
    limits: tuple = ()      # per written slot: most elements (tensors) or magnitude (a value)


# reads: (name, VALUE, value slot), (name, TENSOR_LIST, (tensor slots)) or
# (name, OPERAND_LIST, ((TENSOR | VALUE | ATTR, slot or literal), ...)).


def _operand_read(op) -> tuple:
    """(FieldKind.TENSOR or VALUE, slot), or (FieldKind.ATTR, the literal's Python value)."""
    kind = _OPERAND_SOURCES.get(op.kind)
    return (kind, op.index) if kind is not None else (FieldKind.ATTR, op.python_value())


def resolve_node(index, record, tensor_dtypes, path, widen=False, device=None,
                 variant=None) -> ResolvedNode:
    """Resolve node ``index`` (its NodeRecord) against the kernel registry, taking the op's
    ``variant`` (a load option's, kernels/__init__.py) or else its variant for the
    ``device`` plan ("cpu" or "gpu") where it has one.

    The kernel will receive the op's inputs and attributes by field name, never its
    output fields: where the outputs go is the session's business.

    Raises:
        GraphFormatError: the op has no kernel in this version.
    """
    spec = op_spec(record.op)
    kernel = get_kernel(spec.name, device, variant)
    if kernel is None:
        raise GraphFormatError(
            f"op {spec.short_name} has no kernel in this mlxgraph", path, index, "op"
        )
    tensor_reads, reads, fixed = [], [], {}
    out_kind, out_slots = FieldKind.OUT, ()
    for f in spec.fields:
        value, kind = record.fields.get(f.name), f.kind
        if kind.is_output:
            out_kind = kind
            out_slots = tuple(value) if kind is FieldKind.OUT_LIST else (value,)
        elif value is None and kind.is_input:
            fixed[f.name] = None  # an optional input left out
        elif kind is FieldKind.TENSOR:
            tensor_reads.append((f.name, value))
        elif kind is FieldKind.OPERAND:
            how, where = _operand_read(value)
            if how is FieldKind.TENSOR:
                tensor_reads.append((f.name, where))
            elif how is FieldKind.VALUE:
                reads.append((f.name, how, where))
            else:
                fixed[f.name] = where
        elif kind is FieldKind.OPERAND_LIST:
            reads.append((f.name, kind, tuple(_operand_read(o) for o in value)))
        elif kind in (FieldKind.TENSOR_LIST, FieldKind.VALUE):
            reads.append((f.name, kind, tuple(value) if f.is_vector else value))
        elif f.type == "DType":
            fixed[f.name] = None if value is None else widened(to_mx_dtype(value), widen)
        else:
            fixed[f.name] = value
    dtypes = () if out_kind is FieldKind.VALUE_OUT else tuple(tensor_dtypes[s] for s in out_slots)
    return ResolvedNode(index, record, kernel.fn, kernel.needs_context, tuple(tensor_reads),
                        tuple(reads), fixed, out_kind, out_slots, dtypes)
