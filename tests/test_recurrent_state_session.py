"""Session semantics of recurrent state (issue 30 item 2): snapshots for trim, save and
restore in the cache file, generate's rewind after a queued step, describe.

The hand-built graph of tests/state_graphs.py against its float64 oracle, and LFM2
(tests/test_recurrent_state.py's export) against transformers.
"""

import mlx.core as mx
import numpy as np
import pytest
from parity_helpers import ids, rel_err
from state_graphs import StateOracle, build_state_graph

import mlxgraph
from mlxgraph.generation.loop import generate
from mlxgraph.interpreter.cache.file import CacheFile
from mlxgraph.interpreter.cache.types import CacheError


@pytest.fixture
def graph(tmp_path):
    wts = build_state_graph(tmp_path / "s.mlxg")
    return mlxgraph.load(tmp_path / "s.mlxg"), wts


def _feed(session, oracle, tokens):
    start = session.length
    got = np.array(session.step(ids([tokens]), range(start, start + len(tokens))))[0]
    return rel_err(got, oracle.step(tokens))


def _rewound(oracle, n):
    oracle.history = oracle.history[:len(oracle.history) - n]
    return oracle


def test_trim_rewinds_to_kept_step_starts_and_refuses_others_in_one_line(graph):
    program, wts = graph
    session, oracle = program.session(state_snapshots=3), StateOracle(wts)
    for tokens in ([1, 2, 3, 4], [5, 6], [7], [8]):       # steps start at 0, 4, 6, 7
        _feed(session, oracle, tokens)
    assert session.describe()["layers"][0]["snapshots"] == [4, 6, 7]
    with pytest.raises(CacheError) as e:                   # position 5: inside a step
        session.trim(3)
    assert str(e.value) == ("layer 0: cannot rewind 3 tokens to position 5: a recurrent state "
                            "is kept only at positions 0, 4, 6, 7 (the starts of its last 3 "
                            "steps)")
    assert session.length == 8
    assert session.trim(2) == 6                            # to a chunk's end
    assert _feed(session, _rewound(oracle, 2), [9, 9, 9]) < 1e-5
    assert session.trim(session.length) == 0               # to 0: always
    assert _feed(session, StateOracle(wts), [3, 1]) < 1e-5


def test_no_snapshots_means_only_position_zero(graph):
    program, wts = graph
    session = program.session(state_snapshots=0)
    _feed(session, StateOracle(wts), [1, 2])
    _feed(session, StateOracle(wts), [3])
    with pytest.raises(CacheError, match="kept only at positions 0 "):
        session.trim(1)
    with pytest.raises(mlxgraph.SessionError, match="state_snapshots must be an int"):
        program.session(state_snapshots=-1)


def test_fork_keeps_its_own_snapshots(graph):
    program, wts = graph
    session, oracle = program.session(), StateOracle(wts)
    _feed(session, oracle, [1, 2, 3])
    _feed(session, oracle, [4])
    twin = session.fork()
    twin.trim(1)                                           # the twin rewinds...
    twin_oracle = StateOracle(wts)
    twin_oracle.step([1, 2, 3])
    assert _feed(twin, twin_oracle, [7]) < 1e-5
    assert session.length == 4                             # ...the original does not
    assert _feed(session, oracle, [5]) < 1e-5


def test_save_and_restore_carry_the_state_bitwise(graph, tmp_path):
    program, wts = graph
    session = program.session()
    session.step(ids([[1, 2, 3, 4, 5]]), range(5))
    path = tmp_path / "c.safetensors"
    session.save(path, tokens=[1, 2, 3, 4, 5])
    cache = CacheFile(path)
    assert cache.layers[0] == {"kind": "conv_state", "length": 5, "shape": [1, 8, 3],
                               "dtype": "float32"}
    restored = program.restore(path)
    a = np.array(session.step(ids([[6, 7]]), [5, 6]))
    b = np.array(restored.step(ids([[6, 7]]), [5, 6]))
    assert np.array_equal(a, b)
    with pytest.raises(CacheError, match="kept only at positions 0, 5 "):
        restored.trim(3)                                   # the file keeps no snapshots


def test_a_damaged_state_header_is_refused_in_one_line(graph, tmp_path):
    import json

    from mlxgraph.interpreter.cache.safetensors_io import SafetensorsFile, write

    program, _ = graph
    session = program.session()
    session.step(ids([[1, 2]]), range(2))
    session.save(tmp_path / "c.safetensors")
    st = SafetensorsFile(tmp_path / "c.safetensors")
    meta = dict(st.metadata)
    doc = json.loads(meta["mlxgraph.session"])
    doc["layers"]["0"]["shape"] = [1, 8, 4]
    meta["mlxgraph.session"] = json.dumps(doc)
    meta.pop("mlxgraph.sha256")
    write(tmp_path / "bad.safetensors", {"layer.0.state": st.array("layer.0.state")}, meta,
          {}, seal="mlxgraph.sha256")
    with pytest.raises(mlxgraph.CacheFileError) as e:
        program.restore(tmp_path / "bad.safetensors")
    assert "tensor layer.0.state" in str(e.value) and "\n" not in str(e.value)


def test_generate_rewinds_a_queued_step_on_a_state_model(graph):
    """Stopping on a token leaves a step fed ahead, which generate trims: the state from
    before it must be there, and the session continues as if it never ran."""
    program, wts = graph
    greedy = lambda logits: mx.argmax(logits, axis=-1).astype(mx.int32)  # noqa: E731
    session = program.session()
    out = list(generate(session, [1, 2, 3], greedy, max_tokens=12))
    stop = out[4]
    session = program.session()
    got = list(generate(session, [1, 2, 3], greedy, max_tokens=12, stop_ids=[stop]))
    assert got == out[:out.index(stop) + 1]
    assert session.length == 3 + len(got) - 1
    oracle = StateOracle(wts)
    oracle.step([1, 2, 3] + got[:-1])
    assert _feed(session, oracle, [got[-1]]) < 1e-5


def test_describe_reports_state_bytes(graph):
    program, _ = graph
    session = program.session()
    session.step(ids([[1, 2, 3]]), range(3))
    session.step(ids([[4]]), [3])
    view = session.describe()
    assert view["state_bytes"] == 8 * 3 * 4 * 2            # the state and one snapshot
