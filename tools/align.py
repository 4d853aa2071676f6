"""Data flow of a node stream and the alignment of two streams, independent of slot numbers.

Every node input is resolved to its *source*: the node that last wrote the slot before
it (its index, output field and position), a constant, a graph input, a symbol or a
literal. A node's alignment key is its op, its attributes other than dtypes, and the kind of each
source (the producer's op and output field, looking through Casts; the constant's name
and shape; the input's name; the literal's value) - never a slot number, so two
numberings of one graph have equal key streams, and two precisions of one export differ
only by their Casts. The streams are aligned by unique-key anchors with difflib's
matching blocks in the gaps (near-linear here, never the quadratic edit-distance table);
runs left unmatched are aligned again on coarser keys (op and weights, then op alone),
which pairs a node whose attributes or producers changed.
"""

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher

from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.records import Operand
from mlxgraph.schema.spec import FieldKind
from mlxgraph.tools.node_text import attr_value, node_fields, short_name


@dataclass(frozen=True)
class Source:
    """Where a node input comes from.

    kind: 'node' (ref = (node index, output field, position)), 'const' (ref = constant
    index), 'input' (ref = input name), 'symbol' (ref = symbol name), 'literal' (ref =
    (operand kind, value)) or 'unset' (ref = slot; read before anything wrote it).
    """

    kind: str
    ref: object


class Flow:
    """The data flow of one graph's main chain.

    Attributes:
        graph: the GraphFile.
        inputs: per node, [(field name, position or None, Source)] in schema order.
        outputs: per node, [(field name, position or None, slot, is_value)].
        attrs: per node, ((field name, canonical value), ...).
        final: tensor slot -> Source of its last writer (or its constant/input).
    """

    def __init__(self, graph):
        self.graph = graph
        const_by_slot = {c.tensor: i for i, c in enumerate(graph.constants)}
        input_by_slot = {slot: name for name, slot in graph.inputs.items()}
        symbol_by_value = {s.value: s.name for s in graph.symbols if s.value is not None}
        writer, vwriter = {}, {}

        def tensor_source(slot):
            if slot in writer:
                return writer[slot]
            if slot in const_by_slot:
                return Source("const", const_by_slot[slot])
            if slot in input_by_slot:
                return Source("input", input_by_slot[slot])
            return Source("unset", slot)

        def value_source(slot):
            if slot in vwriter:
                return vwriter[slot]
            if slot in symbol_by_value:
                return Source("symbol", symbol_by_value[slot])
            return Source("unset", slot)

        def resolve(f, v):
            if isinstance(v, Operand):
                if v.kind == "tensor":
                    return tensor_source(v.index)
                if v.kind == "value":
                    return value_source(v.index)
                return Source("literal", (v.kind, v.python_value()))
            return value_source(v) if f.kind is FieldKind.VALUE else tensor_source(v)

        self.inputs, self.outputs, self.attrs, self.key_attrs = [], [], [], []
        for i, record in enumerate(graph.nodes):
            ins, outs, attrs, dtype_attrs = [], [], [], set()
            for f, v in node_fields(record):
                if f.kind.is_input:
                    if f.is_vector:
                        ins.extend((f.name, j, resolve(f, x)) for j, x in enumerate(v))
                    else:
                        ins.append((f.name, None, resolve(f, v)))
                elif f.kind.is_output:
                    is_value = f.kind is FieldKind.VALUE_OUT
                    items = enumerate(v) if f.is_vector else [(None, v)]
                    outs.extend((f.name, j, slot, is_value) for j, slot in items)
                else:
                    value = attr_value(f, v)
                    attrs.append((f.name, tuple(value) if isinstance(value, list) else value))
                    if f.type == "DType":
                        dtype_attrs.add(f.name)
            for name, j, slot, is_value in outs:
                (vwriter if is_value else writer)[slot] = Source("node", (i, name, j))
            self.inputs.append(ins)
            self.outputs.append(outs)
            self.attrs.append(tuple(attrs))
            self.key_attrs.append(tuple(a for a in attrs if a[0] not in dtype_attrs))
        self.final = {slot: tensor_source(slot) for slot in range(len(graph.tensors))}

    def op_family(self, i) -> str:
        """Node i's op for alignment: a quantized op counts as its float op (QuantizedLinear
        pairs with Linear), so a float graph and its quantized export align node for node."""
        op = self.graph.nodes[i].op
        float_op = entry(op).float_op
        return op if float_op is None else entry(float_op).table

    def source_key(self, src: Source):
        """A slot-free description of a source (used in alignment keys); looks through Casts."""
        if src.kind == "node":
            i, name, j = src.ref
            if entry(self.graph.nodes[i].op).has(Trait.DTYPE_ONLY) and self.inputs[i]:
                return self.source_key(self.inputs[i][0][2])
            return ("node", self.op_family(i), name, j)
        if src.kind == "const":
            c = self.graph.constants[src.ref]
            t = self.graph.tensors[c.tensor]
            return ("const", t.name, t.shape)
        return (src.kind, src.ref) if src.kind != "unset" else ("unset",)

    def keys(self) -> list:
        """The alignment key of every node."""
        return [
            (
                self.op_family(i),
                self.key_attrs[i],
                tuple((n, j, self.source_key(s)) for n, j, s in self.inputs[i]),
            )
            for i, rec in enumerate(self.graph.nodes)
        ]

    def weight_keys(self) -> list:
        """A coarser key: the op and its constant inputs (name and shape) only."""
        return [
            (self.op_family(i),
             tuple(self.source_key(s) for _, _, s in self.inputs[i] if s.kind == "const"))
            for i in range(len(self.graph.nodes))
        ]

    def describe(self, src: Source):
        """A source for reports: 'node 12 Linear.out', 'const model.w', 'input tokens', or a
        literal's value."""
        if src.kind == "node":
            i, name, j = src.ref
            return f"node {i} {short_name(self.graph.nodes[i].op)}.{name}" + (
                f"[{j}]" if j is not None else ""
            )
        if src.kind == "const":
            return f"const {self.graph.tensors[self.graph.constants[src.ref].tensor].name}"
        if src.kind == "literal":
            return src.ref[1]
        return f"{src.kind} {src.ref}"


def _intern(a_keys, b_keys):
    table = {}
    return (
        [table.setdefault(k, len(table)) for k in a_keys],
        [table.setdefault(k, len(table)) for k in b_keys],
    )


def _increasing(pairs) -> list:
    """The longest run of pairs increasing in both coordinates (pairs sorted by the first)."""
    tails, tail_idx, back = [], [], [None] * len(pairs)
    for n, (_, j) in enumerate(pairs):
        k = bisect_left(tails, j)
        back[n] = tail_idx[k - 1] if k else None
        if k == len(tails):
            tails.append(j)
            tail_idx.append(n)
        else:
            tails[k], tail_idx[k] = j, n
    out, n = [], tail_idx[-1] if tail_idx else None
    while n is not None:
        out.append(pairs[n])
        n = back[n]
    return out[::-1]


def _match(a, b, i1, i2, j1, j2, out, depth=0) -> None:
    """Append equal-key pairs of a[i1:i2] and b[j1:j2] to ``out``, in order.

    Patience-style: keys that occur once on each side are anchors (the longest run of
    them in order is kept); the gaps between anchors are matched the same way, and a gap
    with no unique key falls back to difflib's matching blocks. Anchors keep the cost
    near-linear on long, repetitive streams (a transformer's layers) where a matcher
    that searches for the longest common block revisits the same ranges again and again.
    """
    if i1 >= i2 or j1 >= j2:
        return
    count_a, count_b = Counter(a[i1:i2]), Counter(b[j1:j2])
    where_b = {b[j]: j for j in range(j1, j2) if count_b[b[j]] == 1}
    anchors = _increasing(
        [(i, where_b[a[i]]) for i in range(i1, i2) if count_a[a[i]] == 1 and a[i] in where_b]
    )
    if not anchors or depth > 32:
        matcher = SequenceMatcher(None, a[i1:i2], b[j1:j2], autojunk=False)
        for p, q, n in matcher.get_matching_blocks():
            out.extend(zip(range(i1 + p, i1 + p + n), range(j1 + q, j1 + q + n), strict=True))
        return
    pi, pj = i1, j1
    for i, j in anchors:
        _match(a, b, pi, i, pj, j, out, depth + 1)
        out.append((i, j))
        pi, pj = i + 1, j + 1
    _match(a, b, pi, i2, pj, j2, out, depth + 1)


def _levels(levels, lo_a, hi_a, lo_b, hi_b, out) -> None:
    """Pair a[lo_a:hi_a] with b[lo_b:hi_b] on the first key level, then each unmatched run
    on the next level; what the last level leaves is deleted (from a) and inserted (in b)."""
    ka, kb = levels[0]
    matched = []
    _match(ka, kb, lo_a, hi_a, lo_b, hi_b, matched)
    pi, pj = lo_a, lo_b
    for i, j in matched + [(hi_a, hi_b)]:
        if i > pi or j > pj:
            if len(levels) > 1 and i > pi and j > pj:
                _levels(levels[1:], pi, i, pj, j, out)
            else:
                out.extend((x, None) for x in range(pi, i))
                out.extend((None, y) for y in range(pj, j))
        if i < hi_a:
            out.append((i, j))
        pi, pj = i + 1, j + 1


def align(flow_a: Flow, flow_b: Flow) -> list:
    """Pair the nodes of two graphs.

    Three key levels, each applied to the runs the previous one left unmatched: the full
    key (op, attributes, sources); the op with its constant inputs (a node whose producer
    or attributes changed still pairs with the node reading the same weight); the op
    alone (a node whose weight changed too).

    Returns:
        [(a index or None, b index or None)] in stream order: pairs, deletions (b None)
        and insertions (a None).
    """
    levels = [
        _intern(flow_a.keys(), flow_b.keys()),
        _intern(flow_a.weight_keys(), flow_b.weight_keys()),
        _intern([flow_a.op_family(i) for i in range(len(flow_a.graph.nodes))],
                [flow_b.op_family(i) for i in range(len(flow_b.graph.nodes))]),
    ]
    out = []
    _levels(levels, 0, len(flow_a.graph.nodes), 0, len(flow_b.graph.nodes), out)
    return out
