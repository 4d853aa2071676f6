"""How a node runs: each node of a graph resolved once, at load, to a :class:`ResolvedNode`.

A resolved node holds its kernel (from the registry keyed by the union's op code), where
each input comes from, its attributes already read out of the FlatBuffer and converted,
and where its outputs go.
"""

from dataclasses import dataclass

from mlxgraph.interpreter.kernels import get_kernel
from mlxgraph.interpreter.mlx_dtypes import to_mx_dtype, widened
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.spec import op_spec

# How an input field is read at run time.
TENSOR, VALUE, LITERAL, TENSOR_LIST, OPERAND_LIST = range(5)


@dataclass(frozen=True)
class ResolvedNode:
    """A node ready to run: kernel, input plan, fixed keyword arguments, output plan."""

    index: int
    record: object          # the NodeRecord (for errors, observers, tools)
    fn: object
    needs_context: bool
    tensor_reads: tuple  # (field name, tensor slot): the common input, read on the fast path
    reads: tuple  # every other input: (field name, how, where), how in VALUE..OPERAND_LIST
    fixed: dict             # attributes and output-slot fields, passed as they are
    out_kind: str           # 'tensor' | 'tensors' | 'value'
    out_slots: tuple        # tensor or value slots written
    out_dtypes: tuple       # declared mx dtype per written tensor slot (None = keep)
    guard: tuple | None = None  # (index field, table field, axis, wrap negatives): clamp, flag
    limits: tuple = ()      # per written slot: most elements (tensors) or magnitude (a value)


def _operand_read(op):
    if op.kind == "tensor":
        return TENSOR, op.index
    if op.kind == "value":
        return VALUE, op.index
    return LITERAL, op.python_value()


def resolve_node(index, record, tensor_dtypes, path, widen=False) -> ResolvedNode:
    """Resolve node ``index`` (its NodeRecord) against the kernel registry.

    Raises:
        GraphFormatError: the op has no kernel in this version.
    """
    spec = op_spec(record.op)
    kernel = get_kernel(spec.name)
    if kernel is None:
        raise GraphFormatError(
            f"op {spec.short_name} has no kernel in this mlxgraph", path, index, "op"
        )
    reads, fixed = [], {}
    out_kind, out_slots = "tensor", ()
    for f in spec.table.fields:
        value = record.fields.get(f.name)
        if f.role == "in":
            if value is None:
                fixed[f.name] = None
            elif f.type == "Operand" and f.is_vector:
                reads.append((f.name, OPERAND_LIST, tuple(_operand_read(o) for o in value)))
            elif f.type == "Operand":
                how, where = _operand_read(value)
                if how == LITERAL:
                    fixed[f.name] = where
                else:
                    reads.append((f.name, how, where))
            elif f.is_vector:
                reads.append((f.name, TENSOR_LIST, tuple(value)))
            else:
                reads.append((f.name, TENSOR, value))
        elif f.role == "value_in":
            reads.append((f.name, VALUE, value))
        elif f.role in ("out", "value_out"):
            fixed[f.name] = value
            if f.role == "value_out":
                out_kind, out_slots = "value", (value,)
            elif f.is_vector:
                out_kind, out_slots = "tensors", tuple(value)
            else:
                out_slots = (value,)
        elif f.type == "DType":
            fixed[f.name] = None if value is None else widened(to_mx_dtype(value), widen)
        else:
            fixed[f.name] = value
    dtypes = tuple(tensor_dtypes[s] for s in out_slots) if out_kind != "value" else ()
    tensor_reads = tuple((name, where) for name, how, where in reads if how == TENSOR)
    other_reads = tuple(r for r in reads if r[1] != TENSOR)
    return ResolvedNode(
        index,
        record,
        kernel.fn,
        kernel.needs_context,
        tensor_reads,
        other_reads,
        fixed,
        out_kind,
        out_slots,
        dtypes,
    )
