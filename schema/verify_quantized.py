"""Checks of quantized-weight nodes (format 1.2): bits and group size in their domain, and
packed weights, scales and biases whose shapes and dtypes agree with each other and with
the node's input and output (the layout is in schema/mlxgraph.fbs). A file that fails
would make MLX's quantized ops read past a row or compute with a wrong group."""

from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import op_specs

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)


def _static(g, slot, field) -> list:
    dims = g.tensors[slot].shape
    if any(d.symbol != -1 for d in dims):
        raise GraphFormatError("a quantized weight's shape must be static", field=field)
    return [d.size for d in dims]


def _last_dim(g, slot):
    """The static size of a slot's last axis, or None (symbolic, or rank 0)."""
    dims = g.tensors[slot].shape
    return dims[-1].size if dims and dims[-1].symbol == -1 else None


def _check_node(g, op, t) -> None:
    if t.bits not in BITS:
        raise GraphFormatError(f"bits {t.bits} is not 4 or 8", field="bits")
    if t.group_size not in GROUP_SIZES:
        raise GraphFormatError(
            f"group_size {t.group_size} is not one of 32, 64, 128", field="group_size"
        )
    w = _static(g, t.weight, "weight")
    if g.tensors[t.weight].dtype != dtype_info("uint32").code or len(w) != 2:
        raise GraphFormatError("the packed weight must be uint32 of rank 2", field="weight")
    rows, cols = w[0], w[1] * 32 // t.bits
    want = [rows, cols // t.group_size]
    float_code = None
    for field in ("scales", "biases"):
        slot = getattr(t, field)
        code = g.tensors[slot].dtype
        if code is None or not dtype_info(code).is_float:
            raise GraphFormatError(f"{field} must have a floating dtype", field=field)
        if float_code is not None and code != float_code:
            raise GraphFormatError("scales and biases differ in dtype", field=field)
        float_code = code
        shape = _static(g, slot, field)
        if shape != want:
            raise GraphFormatError(
                f"{field} have shape {shape}; a packed weight {w} of {t.bits}-bit codes in "
                f"groups of {t.group_size} needs {want}",
                field=field,
            )
    if op.has(Trait.ROW_WISE):
        inner, outer = _last_dim(g, t.x), _last_dim(g, t.out)
        if inner is not None and inner != cols:
            raise GraphFormatError(
                f"x's last axis is {inner}; the weight's rows hold {cols} values", field="x"
            )
        if outer is not None and outer != rows:
            raise GraphFormatError(
                f"out's last axis is {outer}; the weight has {rows} rows", field="out"
            )
    elif _last_dim(g, t.out) not in (None, cols):
        raise GraphFormatError(
            f"out's last axis is {_last_dim(g, t.out)}; the weight's rows hold {cols} values",
            field="out",
        )


def check_quantized(g) -> None:
    """Check every quantized node of the decoded Graph record ``g``.

    Raises:
        GraphFormatError: the first fault found, naming the node and field.
    """
    specs = op_specs()
    for i, node in enumerate(g.chains[0].nodes):
        code, t = node.op
        op = entry(specs[code].name)
        if op.has(Trait.QUANTIZED):
            try:
                _check_node(g, op, t)
            except GraphFormatError as e:
                raise GraphFormatError(
                    e.reason, node=i, field=f"{specs[code].short_name}.{e.field}"
                ) from None
