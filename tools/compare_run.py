"""Run two programs on the same tokens and measure every aligned node's output difference.

Each step runs A, keeping every node's outputs (the session's observer hook), then runs B
and measures each of B's nodes that is paired with one of A's (tools/align.py) against
A's outputs, lazily; the step's measurements are evaluated together. Prefill feeds the
prompt; each decode step feeds both programs A's greedy token, so their inputs stay the
same even when B's predictions drift. Errors follow tools/numeric.py: max |a - b| and
that over max |a| (A is the reference), per node, the worst over outputs and steps.
"""

import mlx.core as mx

from mlxgraph.interpreter.mlx_dtypes import dtype_name
from mlxgraph.tools.numeric import least_precise, relative, tolerance

_INF = float("inf")


def _measure(a, b):
    """Lazy (max_abs, scale) of two outputs, or a host verdict for ints and mismatches."""
    if not isinstance(a, mx.array) or not isinstance(b, mx.array):
        same = (a == b) if not isinstance(a, mx.array) and not isinstance(b, mx.array) else False
        return (0.0 if same else _INF, float(abs(a)) if isinstance(a, (int, float)) else 0.0)
    if a.shape != b.shape:
        return (_INF, 0.0)
    af, bf = a.astype(mx.float32), b.astype(mx.float32)
    d = mx.abs(af - bf)
    both_nan = mx.logical_and(mx.isnan(af), mx.isnan(bf))
    d = mx.where(mx.logical_or(af == bf, both_nan), 0.0, d)   # equal infinities, NaN == NaN
    d = mx.where(mx.isnan(d), _INF, d)                         # NaN on one side only
    scale = mx.max(mx.where(mx.isinf(af) | mx.isnan(af), 0.0, mx.abs(af)))
    return (mx.max(d), scale)


def _logits(out):
    """The logits of a step's result (a graph with several outputs returns a dict)."""
    if isinstance(out, dict):
        return out["logits"] if "logits" in out else next(iter(out.values()))
    return out


def _dtype_name(x) -> str | None:
    """A node output's dtype name: a schema dtype for arrays, 'int' for a runtime int."""
    if isinstance(x, mx.array):
        return dtype_name(x.dtype)
    return "int" if isinstance(x, int) else None


class _Stats:
    """The worst error seen so far for one aligned node."""

    __slots__ = (
        "a",
        "b",
        "max_abs",
        "max_rel",
        "worst_step",
        "tol",
        "dtype_a",
        "dtype_b",
        "first_step",
        "note",
    )

    def __init__(self, a, b):
        self.a, self.b = a, b
        self.max_abs = self.max_rel = 0.0
        self.worst_step = self.first_step = None
        self.tol = 0.0
        self.dtype_a = self.dtype_b = None
        self.note = ""

    def add(self, step, max_abs, max_rel, tol, dtype_a, dtype_b, note):
        if (
            self.worst_step is None
            or max_rel > self.max_rel
            or (max_rel == self.max_rel and max_abs > self.max_abs)
        ):
            self.max_abs, self.max_rel, self.worst_step = max_abs, max_rel, step
            self.tol, self.dtype_a, self.dtype_b, self.note = tol, dtype_a, dtype_b, note
        if self.first_step is None and max_rel > tol:
            self.first_step = step


def precision(flow) -> list:
    """Per node, the least precise floating dtype its outputs depend on (None: no floats).

    Walks the data flow once: a node inherits the least precise of its outputs' dtypes,
    its constant and graph-input dtypes and its producers' precisions.
    """
    g = flow.graph
    const_dtype = [g.tensors[c.tensor].dtype for c in g.constants]
    out = []
    for i in range(len(g.nodes)):
        deps = [g.tensors[slot].dtype for _, _, slot, is_value in flow.outputs[i] if not is_value]
        for _, _, src in flow.inputs[i]:
            if src.kind == "node":
                deps.append(out[src.ref[0]])
            elif src.kind == "const":
                deps.append(const_dtype[src.ref])
        out.append(least_precise(deps))
    return out


def run_compare(
    prog_a,
    prog_b,
    pairs,
    prompt,
    steps,
    rtol=None,
    capacity=None,
    precision_a=None,
    precision_b=None,
) -> dict:
    """Run both programs and measure every aligned node.

    Args:
        prog_a, prog_b: loaded Programs (A is the reference).
        pairs: node pairs from tools.align.align.
        prompt: the prompt token ids.
        steps: greedy decode steps after the prefill.
        rtol: override of the floating relative tolerance (tools/numeric.RTOL otherwise).
        capacity: session capacity (default: prompt + steps).
        precision_a, precision_b: per node of each graph, the least precise dtype it
            depends on (:func:`precision`); widens the tolerance of float32 nodes
            downstream of float16 weights.
    Returns:
        {'tokens': [...], 'tokens_b': [...], 'nodes': {a index: _Stats},
         'first': (step, a index) or None}
    Raises:
        GraphRuntimeError, SessionError: a program failed to run.
    """
    a2b = {a: b for a, b in pairs if a is not None and b is not None}
    b2a = {b: a for a, b in a2b.items()}
    cap = capacity or (len(prompt) + steps + 1)
    sa, sb = prog_a.session(capacity=cap), prog_b.session(capacity=cap)
    stats = {a: _Stats(a, b) for b, a in b2a.items()}
    feed, pos, tokens, tokens_b = list(prompt), 0, [], []
    for step in range(steps + 1):
        kept = {}

        def keep(i, _record, outputs, kept=kept):
            kept[i] = outputs

        positions = list(range(pos, pos + len(feed)))
        tok = mx.array([feed], dtype=mx.int32)
        logits_a = sa.step(tok, positions, observer=keep)
        pending = []

        def measure(j, _record, outputs, kept=kept, pending=pending):
            i = b2a.get(j)
            if i is None or i not in kept:
                return
            outs_a = kept[i]
            if len(outs_a) != len(outputs):
                pending.append((i, _INF, 0.0, None, None, "output count differs"))
                return
            for k, (x, y) in enumerate(zip(outs_a, outputs, strict=True)):
                note = (
                    f"shape {tuple(x.shape)} vs {tuple(y.shape)}"
                    if (isinstance(x, mx.array) and isinstance(y, mx.array) and x.shape != y.shape)
                    else ""
                )
                m, s = _measure(x, y)
                pending.append(
                    (i, m, s, _dtype_name(x), _dtype_name(y), note or (f"output {k}" if k else ""))
                )

        logits_b = _logits(sb.step(tok, positions, observer=measure))
        logits_a = _logits(logits_a)
        next_a = mx.argmax(logits_a[0, -1])
        next_b = mx.argmax(logits_b[0, -1]) if logits_b.shape == logits_a.shape else next_a
        lazy = [x for p in pending for x in p[1:3] if isinstance(x, mx.array)]
        mx.eval(next_a, next_b, *lazy)
        for i, m, s, da, db, note in pending:
            m = float(m.item()) if isinstance(m, mx.array) else m
            s = float(s.item()) if isinstance(s, mx.array) else s
            up = (
                precision_a[i] if precision_a else None,
                precision_b[a2b[i]] if precision_b else None,
            )
            stats[i].add(
                step,
                m,
                relative(m, s) if m != _INF else _INF,
                tolerance(da, db, rtol, up),
                da,
                db,
                note,
            )
        pos += len(feed)
        tokens.append(int(next_a.item()))
        tokens_b.append(int(next_b.item()))
        feed = [tokens[-1]]
        del kept, pending
    diverged = [(s.first_step, a) for a, s in stats.items() if s.first_step is not None]
    return {
        "tokens": tokens,
        "tokens_b": tokens_b,
        "nodes": stats,
        "first": min(diverged) if diverged else None,
    }
