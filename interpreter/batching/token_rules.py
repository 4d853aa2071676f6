"""Per-op token-axis rules: which axis of each output holds the step's tokens, or a refusal.

A batched step packs several sessions' tokens one after another on the token axis (see
batch_step.py). That is exact only if no node lets one token's computation see another
token's values, except UpdateAndAttend, which splits the rows itself. Each op has one
small rule here: given where its inputs carry tokens (and their real shapes, from a lazy
probe step), it returns the token axis of each output or raises :class:`Mixing` naming
what would mix rows (a reduction over tokens, a slice of them, a reshape that merges them
with another axis, a size computed from the token count...). An op without a rule is
refused: a new op must say how it treats tokens before it can batch. The elementwise ops
share two rules, by their catalogue trait (schema/op_catalogue.py); the layout, creation,
symbolic and attention ops' rules are in token_rules_layout.py, loaded on first lookup.
"""

from mlxgraph.schema.errors import Error
from mlxgraph.schema.op_catalogue import Trait, entry, ops_with
from mlxgraph.schema.registry import LazyRegistry
from mlxgraph.schema.spec import FieldKind

VALUE = FieldKind.VALUE


class Mixing(Error):
    """A node would let one row's tokens reach another's (the message says how)."""


class NodeView:
    """One node seen by a rule: its inputs' token axes and shapes, attributes, outputs."""

    def __init__(self, node, shapes, values, axes, token_values):
        self.node = node
        self.shapes, self.values = shapes, values  # the probe step's shapes and numbers
        self.axes, self.token_values = axes, token_values
        self.slots = dict(node.tensor_reads)
        self.reads = {name: where for name, _, where in node.reads}

    def tok(self, name):
        """``(axis, per)`` of tensor input ``name``: its token axis, holding ``per``
        consecutive entries per token (None: absent, or it carries no tokens)."""
        slot = self.slots.get(name)
        return None if slot is None else self.axes.get(slot)

    def ax(self, name):
        """Token axis of tensor input ``name`` (None: absent, or it carries no tokens)."""
        t = self.tok(name)
        return None if t is None else t[0]

    def rank(self, name) -> int:
        """Rank of tensor input ``name``."""
        return len(self.shapes[self.slots[name]])

    def shape(self, name) -> tuple:
        """Shape of tensor input ``name`` in the probe step."""
        return self.shapes[self.slots[name]]

    def attr(self, name, default=None):
        """An attribute (or literal operand); ``default`` when absent or null."""
        v = self.node.fixed.get(name)
        return default if v is None else v

    def out_rank(self, i=0) -> int:
        """Rank of output ``i``."""
        return len(self.shapes[self.node.out_slots[i]])

    def out_shape(self, i=0) -> tuple:
        """Shape of output ``i`` in the probe step."""
        return self.shapes[self.node.out_slots[i]]

    def token_sizes(self, name) -> dict:
        """{position: c} for the entries of operand list ``name`` that hold c times the
        token count."""
        return {i: self.token_values[w][0] for i, (how, w) in enumerate(self.reads.get(name, ()))
                if how is VALUE and w in self.token_values}

    def mix(self, reason) -> Mixing:
        """A Mixing exception for this node."""
        return Mixing(reason)


def _norm(axis, rank) -> int:
    return axis % rank if rank else axis


def moved(tok, axis):
    """``tok`` with its axis moved to ``axis`` (None stays None)."""
    return None if tok is None else (axis, tok[1])


RULE_MODULES = ("token_rules_layout",)
RULES = LazyRegistry(__name__.rpartition(".")[0], RULE_MODULES)


def rule(*ops):
    """Register the token-axis rule of ``ops`` (op names).

    Raises:
        KeyError: an op the catalogue does not have. ValueError: an op with a rule already.
    """
    names = [entry(op).name for op in ops]

    def wrap(fn):
        for name in names:
            RULES.add(name, fn)
        return fn
    return wrap


def rules() -> dict:
    """Every op's token-axis rule by op name (loads the rule modules on first use)."""
    return RULES.table()


def broadcast(n: NodeView, names, out_rank=None):
    """Token axis of a broadcasting op's output; inputs without tokens must broadcast (size 1)
    along it, or each row would meet a different slice of them."""
    r = n.out_rank() if out_rank is None else out_rank
    found = None
    for name in names:
        t = n.tok(name)
        if t is not None:
            o = (t[0] + r - n.rank(name), t[1])
            if found not in (None, o):
                raise n.mix(f"{name}'s tokens meet another input's tokens on another axis")
            found = o
    if found is not None:
        for name in names:
            if name in n.slots and n.ax(name) is None:
                pos = found[0] - (r - n.rank(name))
                if pos >= 0 and n.shape(name)[pos] != 1:
                    raise n.mix(f"{name} varies along the token axis without carrying tokens")
    return found


@rule(*(op.name for op in ops_with(Trait.UNARY)))
def _unary(n):
    return [n.tok("x")]


@rule(*(op.name for op in ops_with(Trait.BINARY)))
def _binary(n):
    return [broadcast(n, ("a", "b"))]


@rule("Where")
def _where(n):
    return [broadcast(n, ("cond", "a", "b"))]


def _reduced(n, t, axes, keepdims, what):
    if t is None:
        return None
    if t[0] in axes:
        raise n.mix(f"{what} over the token axis")
    return t if keepdims else moved(t, t[0] - sum(1 for x in axes if x < t[0]))


@rule("Mean", "Sum", "Max")
def _reduce(n):
    r = n.rank("x")
    axes = {_norm(x, r) for x in n.attr("axes", ())} or set(range(r))
    return [_reduced(n, n.tok("x"), axes, n.attr("keepdims", False), "reduces")]


@rule("Argmax")
def _argmax(n):
    axis = n.attr("axis")
    axes = set(range(n.rank("x"))) if axis is None else {_norm(axis, n.rank("x"))}
    return [_reduced(n, n.tok("x"), axes, n.attr("keepdims", False) and axis is not None,
                     "takes an argmax")]


@rule("Softmax")
def _softmax(n):
    return [_reduced(n, n.tok("x"), {_norm(n.attr("axis", -1), n.rank("x"))}, True,
                     "normalises")]


@rule("TopK")
def _top_k(n):
    a = _reduced(n, n.tok("x"), {_norm(n.attr("axis", -1), n.rank("x"))}, True, "sorts")
    return [a, a]


@rule("RmsNorm", "LayerNorm")
def _norm_last(n):
    a = broadcast(n, ("x", "weight", "bias"))
    if a is not None and a[0] == n.out_rank() - 1:
        raise n.mix("normalises over the token axis")
    return [a]


@rule("Rope")
def _rope(n):
    a = broadcast(n, ("x", "cos", "sin"))
    if a is not None and a[0] == n.out_rank() - 1:
        raise n.mix("rotates along the token axis")
    return [a]


def _matmul(n, a_name, b_name):
    ta, tb, r = n.tok(a_name), n.tok(b_name), n.out_rank()
    ra, rb = n.rank(a_name), n.rank(b_name)
    found = None
    if ta is not None:
        if ra == 1 or ta[0] == ra - 1:
            raise n.mix(f"contracts {a_name}'s token axis")
        # A 1-D b drops a's last axis only: a's other axes keep their places.
        found = ta if rb == 1 else moved(ta, r - 2 if ta[0] == ra - 2 else ta[0] + r - ra)
    if tb is not None:
        if rb == 1 or tb[0] == rb - 2:
            raise n.mix(f"contracts {b_name}'s token axis")
        o = moved(tb, r - 1 if tb[0] == rb - 1 else tb[0] + r - rb)
        if found not in (None, o) or (found is not None and o[0] >= r - 2):
            raise n.mix("multiplies tokens by tokens")
        found = o
    return found


@rule("Matmul")
def _matmul_rule(n):
    return [_matmul(n, "a", "b")]


@rule("Addmm")
def _addmm(n):
    a = _matmul(n, "a", "b")
    b = broadcast(n, ("bias",))
    if None not in (a, b) and a != b:
        raise n.mix("bias tokens meet the product's tokens on another axis")
    if a is not None and "bias" in n.slots and b is None:
        # A bias without tokens must not vary along the product's token axis.
        pos = a[0] - (n.out_rank() - n.rank("bias"))
        if pos >= 0 and n.shape("bias")[pos] != 1:
            raise n.mix("its bias varies along the token axis without carrying tokens")
    return [a if a is not None else b]


def _weights_only(n, names):
    for name in names:
        if n.ax(name) is not None:
            raise n.mix(f"its {name} carries tokens")


@rule("Linear", "QuantizedLinear")
def _linear(n):
    _weights_only(n, ("weight", "bias", "scales", "biases"))
    t = n.tok("x")
    if t is not None and t[0] == n.rank("x") - 1:
        raise n.mix("contracts the token axis")
    return [t]


@rule("Embedding", "QuantizedEmbedding")
def _embedding(n):
    _weights_only(n, ("weight", "scales", "biases"))
    return [n.tok("indices")]


@rule("Gather")
def _gather(n):
    g = _norm(n.attr("axis", 0), n.rank("x"))
    tx, ti = n.tok("x"), n.tok("indices")
    if tx is not None and tx[0] == g:
        raise n.mix("gathers along the token axis")
    if None not in (tx, ti) and tx != ti:
        raise n.mix("x's and indices' tokens are on different axes")
    if tx is None and ti is not None and ti[0] != g and n.shape("x")[ti[0]] != 1:
        # Taken along an axis, x is cut to the indices' size on the others: token i of
        # the step would read x's entry i, its place in the packed step.
        raise n.mix("indexes an x without tokens that varies along the token axis")
    return [tx if tx is not None else ti]
