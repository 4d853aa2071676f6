"""Batched steps (Program.step_batch): every row equals its session stepped alone, under
random schedules of sessions joining, leaving, forking, trimming and being rejected; and
the token-row analysis refuses graphs whose nodes would let one row see another."""

import mlx.core as mx
import numpy as np
import pytest
from synthetic_graphs import llama
from tiny_graph import VOCAB, build_tiny_graph
from token_mix_graphs import mix_graph

import mlxgraph
from mlxgraph.interpreter.batching.token_rows import Batching
from mlxgraph.interpreter.cache.kv_cache import CacheError

TOL = 1e-5
REFUSED = (mlxgraph.SessionError, CacheError)


def _tokens(rng, vocab, n):
    return mx.array(rng.integers(0, vocab, (1, n)).astype(np.int32))


class Pair:
    """A session stepped in batches and its twin stepped alone, with the same history."""

    def __init__(self, batched, solo):
        self.b, self.s = batched, solo

    def fork(self):
        return Pair(self.b.fork(), self.s.fork())


def _options(rng, program):
    """Random session options: flat or ring stores, small steps, sometimes a tight capacity."""
    windows = None if rng.random() < 0.5 else int(rng.choice([4, 6]))
    return {"capacity": int(rng.choice([24, 64])), "max_step": int(rng.choice([1, 2, 4])),
            "windows": windows}


def _run_schedule(program, vocab, seed, rounds):
    rng = np.random.default_rng(seed)
    pairs, counts = [], {"rows": 0, "batches": 0, "rejected": 0, "forks": 0, "trims": 0}
    for _ in range(rounds):
        r = rng.random()
        if r < 0.15 or len(pairs) < 2:
            opts = _options(rng, program)
            pairs.append(Pair(program.session(**opts), program.session(**opts)))
        elif r < 0.22:
            pairs.pop(int(rng.integers(len(pairs))))
        elif r < 0.3:
            pairs.append(pairs[int(rng.integers(len(pairs)))].fork())
            counts["forks"] += 1
        elif r < 0.38:
            p = pairs[int(rng.integers(len(pairs)))]
            n = int(rng.integers(0, 4))
            try:
                p.s.trim(n)
            except REFUSED:
                with pytest.raises(REFUSED):
                    p.b.trim(n)
                continue
            p.b.trim(n)
            counts["trims"] += 1
        else:
            chosen = [pairs[i] for i in rng.permutation(len(pairs))[:int(rng.integers(1, 6))]]
            sizes = [int(rng.choice([1, 1, 1, 2, 3, 5])) for _ in chosen]
            toks = [_tokens(rng, vocab, n) for n in sizes]
            rows = [(p.b, t, range(p.b.length, p.b.length + n))
                    for p, t, n in zip(chosen, toks, sizes)]
            lengths = [p.b.length for p in pairs]
            bad = rng.random() < 0.15
            if bad:  # one row asks for the wrong positions: the whole batch is refused
                j = int(rng.integers(len(rows)))
                s, t, _ = rows[j]
                rows[j] = (s, t, range(s.length + 1, s.length + 1 + t.shape[1]))
            try:
                got = program.step_batch(rows)
            except REFUSED:
                # Refused as a whole, nothing changed; and some row is refused alone too
                # (a flat store over capacity, misplaced positions).
                assert [p.b.length for p in pairs] == lengths
                alone = 0
                for p, t in zip(chosen, toks):
                    try:
                        p.s.fork().step(t, range(p.s.length, p.s.length + t.shape[1]))
                    except REFUSED:
                        alone += 1
                assert bad or alone
                counts["rejected"] += 1
                continue
            assert not bad
            want = [p.s.step(t, range(p.s.length, p.s.length + t.shape[1]))
                    for p, t in zip(chosen, toks)]
            mx.eval(got, want)
            for g, w in zip(got, want):
                assert g.shape == w.shape
                assert float(mx.abs(g - w).max()) <= TOL * max(1.0, float(mx.abs(w).max()))
            assert [p.b.length for p in pairs] == [p.s.length for p in pairs]
            counts["rows"] += len(rows)
            counts["batches"] += 1
    return counts


def test_random_batch_schedules_equal_solo_sessions_tiny_graph(tmp_path):
    """A sliding-window (ring) layer and a flat layer; rows of 1-5 tokens, sessions with
    flat and ring stores, forks, trims, over-capacity and misplaced rows refused whole."""
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path, windows=(3, 0))
    program = mlxgraph.load(path)
    assert program.batching.problem is None
    totals = [_run_schedule(program, VOCAB, seed, 70) for seed in range(3)]
    assert sum(c["batches"] for c in totals) > 60 and sum(c["rejected"] for c in totals) > 3
    assert sum(c["forks"] for c in totals) > 5 and sum(c["trims"] for c in totals) > 5


def test_random_batch_schedules_equal_solo_sessions_llama(tmp_path):
    """RoPE, RmsNorm, SwiGLU, GQA: each row's positions reach its own rotary embedding."""
    path = tmp_path / "llama.mlxg"
    llama(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64).write(path)
    program = mlxgraph.load(path)
    assert program.batching.problem is None
    counts = _run_schedule(program, 64, 7, 60)
    assert counts["batches"] > 20


def test_batched_lazy_bad_token_rewinds_only_its_own_session(tmp_path):
    """A sampler's lazy token outside the vocabulary in one row: that row's session is
    rewound at its next call, the others keep their step."""
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path)
    program = mlxgraph.load(path)
    a, b = program.session(), program.session()
    program.step_batch([(a, mx.array([[1, 2]]), range(2)), (b, mx.array([[3]]), range(1))])
    out = program.step_batch([(a, mx.array([[VOCAB + 5]]), [2]), (b, mx.array([[4]]), [1])])
    mx.eval(out)
    assert (a.length, b.length) == (3, 2)
    with pytest.raises(mlxgraph.SessionError, match="outside the vocabulary"):
        a.check()
    assert (a.length, b.length) == (2, 2)
    b.check()  # nothing pending against b


def test_step_batch_refuses_bad_rows(tmp_path):
    path = tmp_path / "tiny.mlxg"
    build_tiny_graph(path)
    program, other = mlxgraph.load(path), mlxgraph.load(path)
    a = program.session()
    with pytest.raises(mlxgraph.SessionError, match="at least one"):
        program.step_batch([])
    with pytest.raises(mlxgraph.SessionError, match="same session twice"):
        program.step_batch([(a, [[1]], [0]), (a, [[2]], [0])])
    with pytest.raises(mlxgraph.SessionError, match="not a session of this program"):
        program.step_batch([(a, [[1]], [0]), (other.session(), [[2]], [0])])
    with pytest.raises(mlxgraph.SessionError, match=r"shape \[1, 2\]"):
        program.step_batch([(a, [[1]], [0, 1]), (program.session(), [[2]], [0])])
    assert a.length == 0
    with pytest.raises(mlxgraph.SessionError, match=r"batched step of 65 tokens \(2 rows\) is "
                       r"more than the graph's largest step \(64 tokens\)"):
        program.step_batch([(a, [[1] * 40], range(40)), (program.session(), [[2] * 25], range(25))])
    assert a.length == 0


# ----------------------------------------------------------------- the token-row analysis

def _op(op, **fields):
    def middle(g, x, t_val):
        out = g.tensor("y", "float32", (1, "T", 8))
        g.node(op, x=x, out=out, **fields)
        return out
    return middle


def _cumulative(g, x, t_val):  # softmax over the tokens, then a product back
    s = g.tensor("s", "float32", (1, "T", 8))
    g.node("Softmax", x=x, out=s, axis=1)
    return s


def _blocks(g, x, t_val):  # [1, T, 8] -> [1, 8T] -> [1, T, 8]: each token's 8 entries stay
    flat = g.tensor("flat", "float32", (1, None))
    g.node("Reshape", x=x, out=flat, shape=[1, -1])
    back = g.tensor("back", "float32", (1, "T", 8))
    g.node("Reshape", x=flat, out=back, shape=[1, t_val, 8])
    return back


def _merged(g, x, t_val):  # [1, T, 8] -> [8, T] -> transposed -> [1, T, 8]: tokens mixed
    m = g.tensor("m", "float32", (8, "T"))
    g.node("Reshape", x=x, out=m, shape=[8, t_val])
    p = g.tensor("p", "float32", ("T", 8))
    g.node("Permute", x=m, out=p, perm=[1, 0])
    back = g.tensor("back", "float32", (1, "T", 8))
    g.node("Reshape", x=p, out=back, shape=[1, t_val, 8])
    return back


def _position_count(g, x, t_val):  # adds arange(T): a token's index inside the step
    r = g.tensor("r", "float32", ("T",))
    g.node("Arange", end=t_val, out=r, dtype=0)
    r3 = g.tensor("r3", "float32", (1, "T", 1))
    g.node("Reshape", x=r, out=r3, shape=[1, t_val, 1])
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Add", a=x, b=r3, out=y)
    return y


def _summed(g, x, t_val):  # the mean over the tokens added to every token
    m = g.tensor("m", "float32", (1, 1, 8))
    g.node("Mean", x=x, out=m, axes=[1], keepdims=True)
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Add", a=x, b=m, out=y)
    return y


def _heads(g, x, t_val):  # [1, T, 8] -> [1, T, 2, 4] -> [1, 2, T, 4] -> back: per token
    r = g.tensor("r", "float32", (1, "T", 2, 4))
    g.node("Reshape", x=x, out=r, shape=[1, t_val, 2, 4])
    p = g.tensor("p", "float32", (1, 2, "T", 4))
    g.node("Permute", x=r, out=p, perm=[0, 2, 1, 3])
    s = g.tensor("s", "float32", (1, 2, "T", 4))
    g.node("Softmax", x=p, out=s, axis=-1)
    b = g.tensor("b", "float32", (1, "T", 2, 4))
    g.node("Permute", x=s, out=b, perm=[0, 2, 1, 3])
    y = g.tensor("y", "float32", (1, "T", 8))
    g.node("Reshape", x=b, out=y, shape=[1, -1, 8])
    return y


@pytest.mark.parametrize("middle, reason", [
    (_cumulative, r"node 1 \(Softmax\) normalises over the token axis"),
    (_op("Slice", axis=1, start=0, end=1), r"node 1 \(Slice\) slices along the token axis"),
    (_merged, r"node 1 \(Reshape\) merges the token axis"),
    (_position_count, r"node 1 \(Arange\) reads the token count"),
    (_summed, r"node 1 \(Mean\) reduces over the token axis"),
])
def test_graphs_that_mix_tokens_are_refused_and_would_be_wrong(tmp_path, middle, reason):
    """Each graph is refused with its node and reason; forced to batch anyway, its rows
    differ from their solo runs (so the refusal is needed, not merely cautious)."""
    program = mix_graph(tmp_path, middle)
    assert program.batching.problem is not None
    assert __import__("re").search(reason, program.batching.problem), program.batching.problem
    rows = [(program.session(), mx.array([[1, 2, 3]]), range(3)),
            (program.session(), mx.array([[4, 5]]), range(2))]
    with pytest.raises(mlxgraph.SessionError, match="cannot step sessions together"):
        program.step_batch(rows)
    solo = [s.step(t, p) for s, t, p in [(program.session(), t, p) for _, t, p in rows]]
    program.__dict__["batching"] = Batching(None, {"logits": 1})  # force it
    forced = program.step_batch([(program.session(), t, p) for _, t, p in rows])
    assert any(a.shape != b.shape or not np.allclose(np.array(a), np.array(b), atol=1e-4)
               for a, b in zip(solo, forced))


@pytest.mark.parametrize("middle", [_heads, _blocks])
def test_per_token_layout_is_accepted_and_exact(tmp_path, middle):
    program = mix_graph(tmp_path, middle)
    assert program.batching.problem is None
    toks = [mx.array([[1, 2, 3]]), mx.array([[4]]), mx.array([[5, 6]])]
    solo = [program.session().step(t, range(t.shape[1])) for t in toks]
    got = program.step_batch([(program.session(), t, range(t.shape[1])) for t in toks])
    for a, b in zip(solo, got):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-6)


def test_every_op_has_a_batching_rule():
    """A new op must say how it treats tokens (token_rules.py) before graphs with it batch."""
    from mlxgraph.interpreter.batching.token_rules import rules
    from mlxgraph.schema.op_catalogue import OPS

    missing = sorted(op.name for op in OPS if op.name not in rules())
    assert missing == []
