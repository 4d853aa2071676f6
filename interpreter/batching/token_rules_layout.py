"""Token-axis rules of the layout, creation, symbolic and attention ops (see token_rules.py)."""

from math import prod

from mlxgraph.interpreter.batching.token_rules import NodeView, _norm, moved, rule
from mlxgraph.schema.enums import SymOp


@rule("Reshape")
def _reshape(n: NodeView):
    t, sizes = n.tok("x"), n.token_sizes("shape")
    if t is None:
        if sizes:
            raise n.mix("sizes a tensor without tokens by the token count")
        return [None]
    (a, per), src, out = t, n.shape("x"), n.out_shape()
    before, inner = prod(src[:a]), prod(src[a + 1:])
    # In row-major order each token owns per * inner consecutive entries after the first
    # `before` split. The output keeps them apart only on an axis j starting at the same
    # split, whose entries each lie inside one token's block: it then holds per' entries
    # per token. Anything else merges tokens with another axis.
    for j in range(len(out)):
        inner_out = prod(out[j + 1:])
        if (prod(out[:j]) == before and out[j] * inner_out == src[a] * inner
                and out[j] > 1 and (per * inner) % inner_out == 0):
            new = (j, per * inner // inner_out)
            break
    else:
        raise n.mix("merges the token axis with another axis")
    if any(i != j or c != new[1] for i, c in sizes.items()):
        raise n.mix("sizes an axis by the token count that does not hold the tokens")
    return [new]


@rule("Permute")
def _permute(n):
    t = n.tok("x")
    if t is None:
        return [None]
    perm = [_norm(p, n.rank("x")) for p in n.attr("perm", ())]
    return [moved(t, perm.index(t[0]))]


def _sized(n, sizes):
    """The token axis of a new tensor sized by the token count (at most one axis)."""
    if len(sizes) > 1:
        raise n.mix("sizes two axes by the token count")
    return next(iter(sizes.items()), None)


@rule("Expand")
def _expand(n):
    t, sizes, r = n.tok("x"), n.token_sizes("shape"), n.out_rank()
    if t is None:
        return [_sized(n, sizes)]
    at = moved(t, t[0] + r - n.rank("x"))
    if any((i, c) != at for i, c in sizes.items()):
        raise n.mix("sizes an axis by the token count that does not hold the tokens")
    return [at]


@rule("Full")
def _full(n):
    return [_sized(n, n.token_sizes("shape"))]


@rule("Arange")
def _arange(n):
    # A range up to the token count is refused where it reads the count (token_rows.py).
    return [None]


@rule("SymSize")
def _sym_size(n):
    # A size is (c, d): c times the token count plus d; the token axis's size is (per, 0).
    t = n.tok("x")
    return [(t[1], 0) if t is not None and _norm(n.attr("axis", 0), n.rank("x")) == t[0]
            else None]


@rule("SymArith")
def _sym_arith(n):
    # Multiples of the token count stay known (an expert axis of T * k entries); any other
    # arithmetic on it gives a number packing would change: allowed to exist, refused
    # wherever it is read (token_rows.py).
    a, b = _sym_operand(n, "a"), _sym_operand(n, "b")
    if a is None and b is None:
        return [None]
    op = n.attr("op", 0)
    if op == SymOp.mul and isinstance(b, int) and isinstance(a, tuple) and a[1] == 0:
        return [(a[0] * b, 0)]
    if op == SymOp.mul and isinstance(a, int) and isinstance(b, tuple) and b[1] == 0:
        return [(b[0] * a, 0)]
    return ["derived"]


def _sym_operand(n, name):
    """(c, d) for a token multiple, an int for a number that does not depend on the tokens,
    None when absent, "derived" for anything else computed from the token count."""
    if name in n.reads:
        return n.token_values.get(n.reads[name], n.values[n.reads[name]])
    if name in n.slots:
        return "derived"  # a tensor operand: refused by the kernel anyway
    v = n.attr(name)
    return v if isinstance(v, int) else None


def _along(n, what):
    t = n.tok("x")
    if t is not None and _norm(n.attr("axis", 0), n.rank("x")) == t[0]:
        raise n.mix(f"{what} along the token axis")
    return t


@rule("Slice")
def _slice(n):
    return [_along(n, "slices")]


@rule("Select")
def _select(n):
    t = _along(n, "selects")
    if n.ax("index") is not None:
        raise n.mix("selects by an index that carries tokens")
    return [None if t is None else moved(t, t[0] - (_norm(n.attr("axis", 0), n.rank("x")) < t[0]))]


@rule("Split")
def _split(n):
    return [_along(n, "splits")] * len(n.node.out_slots)


@rule("Concat")
def _concat(n):
    slots = n.reads["inputs"]
    found = {n.axes.get(s) for s in slots}
    if found == {None}:
        return [None]
    if len(found) != 1:
        raise n.mix("joins tensors with and without tokens (or tokens on different axes)")
    (t,) = found
    if _norm(n.attr("axis", 0), n.out_rank()) == t[0]:
        raise n.mix("joins along the token axis")
    return [t]


@rule("Squeeze")
def _squeeze(n):
    t, shape = n.tok("x"), n.shape("x")
    if t is None:
        return [None]
    picked = {_norm(x, len(shape)) for x in n.attr("axes", ())} or set(range(len(shape)))
    if t[0] in picked:
        # A row of one token has a token axis of size 1: alone, it would be squeezed.
        raise n.mix("may squeeze the token axis (size 1 in a one-token step)")
    dropped = [x for x in picked if shape[x] == 1]
    return [moved(t, t[0] - sum(1 for x in dropped if x < t[0]))]


@rule("Unsqueeze")
def _unsqueeze(n):
    t = n.tok("x")
    if t is None:
        return [None]
    at = _norm(n.attr("axis", 0), n.rank("x") + 1)
    return [moved(t, t[0] + (at <= t[0]))]


@rule("UpdateAndAttend")
def _update_and_attend(n):
    for name in ("q", "k", "v"):
        if n.tok(name) != (2, 1) or n.rank(name) != 4:
            raise n.mix(f"its {name} does not carry one token per entry on axis 2 of "
                        "[B, H, T, D]")
    if n.ax("sinks") is not None:
        raise n.mix("its sinks carry tokens")
    # ALiBi's slopes (format 1.3) are a static attribute: no tokens. Each row's distances
    # come from its own store in the kernel, so its bias is its solo step's.
    return [(2, 1)]


@rule("CausalConv")
def _causal_conv(n):
    # Like UpdateAndAttend, the kernel splits the rows itself: each row convolves its own
    # tokens after its own session's state (kernels/state.py).
    if n.tok("x") != (2, 1) or n.rank("x") != 3:
        raise n.mix("its x does not carry one token per entry on axis 2 of [B, C, T]")
    for name in ("weight", "bias"):
        if n.ax(name) is not None:
            raise n.mix(f"its {name} carries tokens")
    return [(2, 1)]


@rule("SsdScan", "SelectiveScan")  # (the same inputs: Mamba-2's and Mamba-1's scans)
def _scan(n):
    # The kernel splits the rows itself: each row scans from its own session's state.
    for name in ("x", "dt", "b", "c"):
        if n.tok(name) != (1, 1):
            raise n.mix(f"its {name} does not carry one token per entry on axis 1")
    for name in ("a", "d", "dt_bias"):
        if n.ax(name) is not None:
            raise n.mix(f"its {name} carries tokens")
    return [(1, 1)]


@rule("GatedDelta")
def _gated_delta(n):
    # The kernel splits the rows itself: each row runs from its own session's state.
    for name in ("q", "k", "v", "g", "beta"):
        if n.tok(name) != (1, 1):
            raise n.mix(f"its {name} does not carry one token per entry on axis 1")
    return [(1, 1)]
