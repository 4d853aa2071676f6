"""What one step of a graph may cost, and the values its attributes may hold.

A file that is structurally sound can still ask for a tensor of 2**60 elements, square a
runtime integer forty times, attend with a NaN scale or index past its embedding table.
These checks run after the semantic ones (schema/verify_semantics.py), on the same
decoded records, and bound every step of a file that passes:

- every tensor slot's declared shape, with each symbol at its maximum, has at most
  ``element_limit`` elements (default: a few times the constants plus the KV cache and the
  logits at the model's max context, within [2**24, 2**31 - 1]; a load option raises it), and no dim
  exceeds 2**31 - 1 (MLX's dims are 32-bit);
- every runtime integer (value slot) has a magnitude bound derived from the symbols'
  bounds through SymSize / SymArith (interval arithmetic), under 2**62; the interpreter
  checks each computed value against it;
- the literal shapes of Full, Reshape and Expand and the length of Arange stay within
  ``element_limit``;
- ``metadata.vocab_size`` is positive and at most the rows of every embedding the ``tokens``
  input feeds;
- attributes hold values in their domain (a finite positive attention scale, finite
  non-negative norm epsilons, ...);
- no node writes a tensor slot a graph input or a constant fills.
"""

import math
from dataclasses import dataclass

from mlxgraph.schema.enums import OperandKind, SymOp
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Bound, Trait, entry
from mlxgraph.schema.spec import FieldKind, op_specs

MAX_DIM = 2**31 - 1
MIN_ELEMENT_LIMIT = 2**24
MAX_DEFAULT_ELEMENT_LIMIT = 2**31 - 1
MAX_VALUE = 2**62
_ALLOWANCE = 4  # the default limit: this many times the constants plus the KV cache


@dataclass(frozen=True)
class StepBounds:
    """What the interpreter checks at run time, computed once at verification.

    Attributes:
        element_limit: the most elements any tensor of a step may have.
        slot_elements: per tensor slot, the most elements its declared shape allows
            (symbols at their maximum), or ``element_limit`` when a dim is unknown.
        value_magnitude: per value slot, the largest magnitude its runtime int may take.
    """

    element_limit: int
    slot_elements: tuple
    value_magnitude: tuple


def _finite(v):
    return v is None or math.isfinite(v)


def _positive(v):
    return v is None or (math.isfinite(v) and v > 0)


def _non_negative(v):
    return v is None or (math.isfinite(v) and v >= 0)


def _not_nan(v):
    return v is None or not math.isnan(v)


def _at_least_zero(v):
    return v is None or v >= 0


# The tests an attribute check names (schema/op_catalogue.py's Check.test). Fields a table
# lacks are skipped, so checks of fields appended later (format 1.1) sit there too.
ATTRIBUTE_TESTS = {
    "positive": _positive,
    "finite": _finite,
    "non_negative": _non_negative,
    "not_nan": _not_nan,
    "at_least_zero": _at_least_zero,
    "at_least_one": lambda v: v is None or v >= 1,
}


def default_element_limit(g) -> int:
    """A few times what a legitimate step at the max context holds, clamped: the constants'
    elements, the KV cache, and the logits of a step of max-context tokens (a 32k-vocabulary
    model prefilling 4k tokens produces 131M logits, more than its weights)."""
    constants = sum(math.prod(d.size for d in g.tensors[c.tensor].shape) for c in g.constants or ())
    per_step = 0
    meta = g.metadata
    if meta is not None:
        context = min(max(meta.max_context, 0), MAX_DIM)
        for lc in meta.layers or ():
            width = lc.head_dim + (0 if lc.values_in_keys else lc.v_head_dim)
            per_step += lc.kv_heads * width * context
        per_step += context * min(max(meta.vocab_size, 0), MAX_DIM)
    return max(MIN_ELEMENT_LIMIT,
               min(_ALLOWANCE * (constants + per_step), MAX_DEFAULT_ELEMENT_LIMIT))


def check_bounds(g, fixed_slots: set, element_limit=None) -> StepBounds:
    """Bound the cost of a step and check attribute values; see the module docstring.

    Args:
        g: the Graph record (already checked by verify_semantics).
        fixed_slots: tensor slots filled by graph inputs and constants.
        element_limit: the most elements a tensor may have (None: the default).
    Raises:
        GraphFormatError: the first fault found (without the file name).
    """
    limit = default_element_limit(g) if element_limit is None else int(element_limit)
    symbols = g.symbols or ()
    sym_max = [limit if s.max is None else min(s.max, limit) for s in symbols]
    slots, dims = _slot_elements(g, sym_max, limit)
    values = [0] * len(g.values or ())
    for s, m in zip(symbols, sym_max):
        values[s.value] = max(abs(s.min), m)
    nodes = g.chains[0].nodes
    specs = op_specs()
    for i, node in enumerate(nodes):
        code, t = node.op
        op = entry(specs[code].name)
        try:
            _check_attributes(op, t)
            _check_writes(specs[code], t, fixed_slots)
            if op.bound is Bound.ARITH:
                values[t.out] = _arith_bound(t, values)
            elif op.bound is Bound.AXIS:
                shape = dims[t.x]
                axis = t.axis if t.axis is not None else 0
                values[t.out] = shape[axis] if -len(shape) <= axis < len(shape) else limit
            elif op.sizes_from_operands:
                _check_shape(t.shape, values, limit,
                             skip_minus_one=op.bound is Bound.SHAPE_OR_KEEP)
            elif op.bound is Bound.RANGE:
                _check_arange(t, values, limit)
        except GraphFormatError as e:
            raise GraphFormatError(
                e.reason, node=i, field=f"{specs[code].short_name}.{e.field}"
            ) from None
    _check_vocab(g, nodes, specs)
    for i, e in enumerate(g.inputs):
        if any(d.symbol == -2 for d in g.tensors[e.tensor].shape):
            raise GraphFormatError(
                "a graph input's dims must be static or symbols (a dynamic dim without a "
                "symbol cannot be bound)",
                field=f"inputs[{i}]",
            )
    return StepBounds(limit, tuple(slots), tuple(values))


def _slot_elements(g, sym_max, limit) -> tuple:
    """Per slot: the most elements, and the most each dim may be (``limit`` when unknown)."""
    out, dims = [], []
    for i, t in enumerate(g.tensors):
        count, unknown, sizes = 1, False, []
        for j, d in enumerate(t.shape):
            if d.symbol == -1:
                size = d.size
            elif d.symbol >= 0:
                size = sym_max[d.symbol]
            elif d.size >= 0:
                size = d.size
            else:
                unknown = True
                sizes.append(limit)
                continue
            sizes.append(size)
            if size > MAX_DIM:
                raise GraphFormatError(
                    f"dim {size} is larger than {MAX_DIM} (MLX dims are 32-bit)",
                    field=f"tensors[{i}].shape[{j}]",
                )
            count *= size
        if count > limit:
            raise GraphFormatError(
                f"shape allows {count} elements (symbols at their maximum), more than the "
                f"limit of {limit} for this file",
                field=f"tensors[{i}].shape",
            )
        out.append(limit if unknown else count)
        dims.append(sizes)
    return out, dims


def _check_attributes(op, t) -> None:
    for check in op.checks:
        v = getattr(t, check.field, None)
        if not ATTRIBUTE_TESTS[check.test](v):
            raise GraphFormatError(f"{v} is not {check.what}", field=check.field)


def _check_writes(spec, t, fixed_slots) -> None:
    # (A node may write a symbol's value slot: exporters recompute T with SymSize.)
    for i, f in enumerate(spec.table.fields):
        if f.kind not in (FieldKind.OUT, FieldKind.OUT_LIST) or t[i] is None:
            continue
        for s in t[i] if f.kind is FieldKind.OUT_LIST else (t[i],):
            if s in fixed_slots:
                raise GraphFormatError(
                    f"writes tensor slot {s}, which a graph input or a constant fills", field=f.name
                )


def _magnitude(o, values) -> int:
    """The largest magnitude an Operand may have (tensors: 0, they are refused at run time)."""
    if o is None:
        return 0
    if o.kind == OperandKind.value:
        return values[o.index]
    if o.kind in (OperandKind.int_, OperandKind.float_, OperandKind.bool_):
        return math.ceil(abs(o.number)) if math.isfinite(o.number) else MAX_VALUE + 1
    return 0


def _arith_bound(t, values) -> int:
    a, b = _magnitude(t.a, values), _magnitude(t.b, values)
    op = t.op
    if op in (SymOp.add, SymOp.sub):
        bound = a + b
    elif op == SymOp.mul:
        bound = a * b
    elif op == SymOp.floordiv:
        bound = a  # |a // b| <= |a| for any nonzero int b
    elif op == SymOp.mod:
        bound = b  # |a % b| < |b|
    else:  # min, max, neg
        bound = max(a, b) if op != SymOp.neg else a
    if bound > MAX_VALUE:
        raise GraphFormatError(
            f"this runtime integer may reach {_short(bound)}, more than {_short(MAX_VALUE)} "
            "(from the symbols' bounds)",
            field="out",
        )
    return bound


def _short(n: int) -> str:
    return str(n) if n < 10**15 else f"~2**{n.bit_length() - 1}"


def _check_shape(shape, values, limit, skip_minus_one) -> None:
    count = 1
    for j, o in enumerate(shape or ()):
        if o.kind == OperandKind.int_ and o.number == -1 and skip_minus_one:
            continue  # Reshape infers it from x's size; Expand keeps x's size
        m = _magnitude(o, values)
        if m > MAX_DIM:
            raise GraphFormatError(
                f"size {_short(m)} is larger than {MAX_DIM}", field=f"shape[{j}]"
            )
        count *= m
    if count > limit:
        raise GraphFormatError(
            f"a shape of up to {_short(count)} elements, more than the limit of {limit}",
            field="shape",
        )


def _check_arange(t, values, limit) -> None:
    span = _magnitude(t.start, values) + _magnitude(t.end, values)
    step = t.step
    float_step = step is not None and step.kind == OperandKind.float_
    if float_step and math.isfinite(step.number) and step.number != 0:
        count = span / abs(step.number)
    else:
        count = span  # an int step has magnitude >= 1 (0 is refused at run time)
    if count > limit:
        raise GraphFormatError(
            f"up to {_short(int(count))} elements, more than the limit of {limit}", field="end"
        )


def _check_vocab(g, nodes, specs) -> None:
    tokens = next((e.tensor for e in g.inputs if e.name == b"tokens"), None)
    if tokens is None:
        return
    vocab = g.metadata.vocab_size if g.metadata is not None else 0
    for i, node in enumerate(nodes):
        code, t = node.op
        if not entry(specs[code].name).has(Trait.EMBEDDING) or t.indices != tokens:
            continue
        shape = g.tensors[t.weight].shape
        rows = shape[0].size if shape and shape[0].symbol == -1 else None
        # Ids are checked against vocab_size, so a table at least that long is safe: a
        # second table of the tokens may be longer (Gemma 4's per-layer embeddings).
        if rows is None or not 0 < vocab <= rows:
            raise GraphFormatError(
                f"metadata.vocab_size {vocab} is not within the "
                f"{rows if rows is not None else '?'} rows of an embedding the tokens feed: "
                "the vocabulary check on token ids would admit ids past its table",
                node=i,
                field=f"{specs[code].short_name}.weight",
            )
