"""The hostile-file corpus: every way of attack the issue lists, as a crafted file or call,
each ending in a documented error type with the process intact.

Refusals at load need no evaluation and run here. Cases that evaluate (a wrong index, a
shape the file lies about) run in a subprocess (`_isolated`), so a regression that
crashes MLX fails its test instead of killing the suite.
"""

import subprocess
import sys
import textwrap

import hostile_graphs as hg
import pytest
from tool_helpers import run_cli

import mlxgraph
from mlxgraph.schema.errors import GraphFormatError


@pytest.mark.parametrize(
    "name, data, match",
    [
        (
            "vocab 1e6 > rows",
            lambda: hg.embedding_of_tokens(vocab=1_000_000),
            "vocab_size 1000000 is not within the 4 rows",
        ),
        (
            "vocab unknown",
            lambda: hg.embedding_of_tokens(vocab=0),
            "vocab_size 0 is not within the 4 rows",
        ),
        ("Full 2**30 x 2**30", lambda: hg.full_of([2**30, 2**30]), "more than the limit"),
        ("Full 700M", lambda: hg.full_of([700_000_000]), "more than the limit"),
        ("Full dim past 32 bits", lambda: hg.full_of([2**40]), "larger than"),
        (
            "Reshape huge",
            lambda: hg.reshape_or_expand_to("Reshape", [2**20, 2**20]),
            "more than the limit",
        ),
        (
            "Expand huge",
            lambda: hg.reshape_or_expand_to("Expand", [2**16, 2**16, 8]),
            "more than the limit",
        ),
        ("40 squarings", lambda: hg.squarings(40), "may reach"),
        ("constant (0, 2**40)", lambda: hg.constant_of_shape((0, 2**40)), "larger than"),
        ("unnamed dynamic input", hg.unnamed_dynamic_input, "dynamic dim without a symbol"),
        (
            "scale NaN",
            lambda: hg.attribute("UpdateAndAttend", scale=float("nan")),
            "scale: nan is not finite and > 0",
        ),
        ("scale 0", lambda: hg.attribute("UpdateAndAttend", scale=0.0), "is not finite and > 0"),
        (
            "softcap NaN",
            lambda: hg.attribute("UpdateAndAttend", scale=0.5, softcap=float("nan")),
            "softcap: nan is not finite and >= 0",
        ),
        (
            "softcap negative",
            lambda: hg.attribute("UpdateAndAttend", scale=0.5, softcap=-30.0),
            "softcap: -30.0 is not finite and >= 0",
        ),
        (
            "eps negative",
            lambda: hg.attribute("RmsNorm", eps=-1e-6),
            "RmsNorm.eps: -9.99.* is not finite and >= 0",
        ),
        ("eps inf", lambda: hg.attribute("RmsNorm", eps=float("inf")), "is not finite and >= 0"),
        ("clamp NaN", lambda: hg.attribute("Clamp", min=float("nan")), "not NaN"),
        (
            "writes a constant",
            lambda: hg.writes_fixed_slot("constant"),
            "which a graph input or a constant fills",
        ),
        (
            "writes an input",
            lambda: hg.writes_fixed_slot("input"),
            "which a graph input or a constant fills",
        ),
    ],
)
def test_refused_at_load(name, data, match):
    with pytest.raises(GraphFormatError, match=match):
        mlxgraph.load(data())


def test_default_limit_admits_a_long_prefill_over_a_large_vocabulary(tmp_path):
    # The logits of a max-context step (8192 x 32000 = 262M elements) dwarf these weights:
    # the default limit must still admit the model's own declared step (it once did not).
    from synthetic_graphs import llama

    path = tmp_path / "wide-vocab.mlxg"
    llama(layers=1, hidden=16, heads=2, kv_heads=1, intermediate=32, vocab=32000,
          max_context=8192).write(path)
    program = mlxgraph.load(path)
    assert program.session(capacity=16).step([[1, 2]], [0, 1]).shape == (1, 2, 32000)


def test_element_limit_is_a_load_option(tmp_path, capsys):
    data = hg.full_of([4096, 8192])  # 32M elements: over the default for this file
    with pytest.raises(GraphFormatError, match="more than the limit"):
        mlxgraph.load(data)
    mlxgraph.load(data, element_limit=2**26)  # its owner may allow more
    path = tmp_path / "big.mlxg"
    path.write_bytes(data)
    assert run_cli(capsys, "verify", path)[0] == 1
    assert run_cli(capsys, "verify", path, "--element-limit", 2**26)[0] == 0


PRELUDE = """
import sys, mlx.core as mx, numpy as np, mlxgraph, hostile_graphs as hg
from mlxgraph import GraphFormatError, SessionError, CacheError, GraphRuntimeError
def outcome(fn):
    try:
        fn()
        return "ok"
    except (GraphFormatError, SessionError, CacheError, GraphRuntimeError) as e:
        return type(e).__name__ + ": " + str(e)
"""


def _isolated(body: str) -> list:
    """Run ``body`` after PRELUDE in a fresh interpreter; returns its stdout lines."""
    code = PRELUDE + textwrap.dedent(body)
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(__import__("pathlib").Path(__file__).parent),
    )
    assert res.returncode == 0, (
        f"crashed or raised (exit {res.returncode}):\n{res.stdout}\n{res.stderr[-3000:]}"
    )
    return res.stdout.strip().splitlines()


def test_gathers_never_read_outside_their_tables():
    lines = _isolated("""
    for build in (hg.embedding_past_table, hg.gather_past_axis, hg.select_past_axis):
        s = mlxgraph.load(build()).session(capacity=8)
        out = s.step([[1, 2]], [0, 1])
        mx.eval(out)
        nan = bool(np.isnan(np.array(out)).all())
        print(build.__name__, nan, outcome(s.check), s.length)
        print(build.__name__, "after", outcome(lambda: mx.eval(s.step([[0]], [0]))), s.length)
    """)
    for line in lines[0::2]:
        name, nan, rest = line.split(" ", 2)
        assert (
            nan == "True" and rest.startswith("GraphRuntimeError") and "outside its table" in rest
        ), line
        assert rest.endswith(" 0"), line  # rewound to before the bad step
    assert lines[1].endswith("ok 1")  # and usable again


def test_lazy_token_ids_are_checked_against_the_vocabulary():
    lines = _isolated("""
    data = hg.embedding_of_tokens(vocab=256, rows=256)
    for bad in (-1, 256, 10**6):
        s = mlxgraph.load(data).session(capacity=8)
        mx.eval(s.step([[1]], [0]))
        out = s.step(mx.array([[bad]], dtype=mx.int64), [1])
        mx.eval(out)
        print(bad, bool(np.isnan(np.array(out)).all()), outcome(s.check), s.length)
    s = mlxgraph.load(data).session(capacity=8)
    s.step(mx.array([[300]]), [0])
    s.step(mx.array([[1]]), [1])
    print("two steps later:", outcome(lambda: s.step(mx.array([[2]]), [2])), s.length)
    good = mx.array([[5, 255]], dtype=mx.uint32)
    print("good ids:", outcome(lambda: mx.eval(s.step(good, [0, 1]))))
    """)
    for line in lines[:3]:
        assert (
            " True SessionError" in line
            and "outside the vocabulary [0, 256)" in line
            and line.endswith(" 1")
        ), line
    assert lines[3].startswith("two steps later: SessionError") and lines[3].endswith(" 0"), lines[
        3
    ]
    assert lines[4] == "good ids: ok"


def test_shapes_a_file_lies_about_are_refused_before_allocation():
    lines = _isolated("""
    s = mlxgraph.load(hg.broadcast_blowup(6)).session(capacity=8)
    print(outcome(lambda: s.step([[1] * 8], range(8))), s.length)
    p = mlxgraph.load(hg.full_of([2**30, 2**30]), element_limit=2**62)   # raised past its own shape
    print(outcome(lambda: p.session(capacity=8).step([[1]], [0])))
    """)
    assert (
        lines[0].startswith("GraphRuntimeError")
        and "exceeds the" in lines[0]
        and lines[0].endswith(" 0")
    )
    assert lines[1].startswith("GraphRuntimeError") and "(1073741824, 1073741824)" in lines[1]


def test_preallocating_past_memory_is_refused():
    lines = _isolated("""
    p = mlxgraph.load(hg.attribute("UpdateAndAttend", scale=0.5))
    print(outcome(lambda: p.session(capacity=2**31 - 1, preallocate=True)))
    print(outcome(lambda: p.session(capacity=0)))
    """)
    assert lines[0].startswith("CacheError") and "preallocate=True needs" in lines[0]
    assert lines[1].startswith("SessionError") and "capacity must be an int" in lines[1]
