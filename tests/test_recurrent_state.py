"""Recurrent state as off-graph session state (format 1.3, issue 30): CausalConv.

LFM2 (short convolutions beside attention layers) exports and matches transformers eager
over a prefill, 40 greedy decode steps, a chunked prefill and batched steps; a hand-built
graph is checked against a float64 oracle and through the session's semantics (fork,
refused trims and saves, a rejected step); the verifier refuses bad state metadata in one
line; the kernel matches torch's conv1d in several dtypes.
"""

import mlx.core as mx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from parity_helpers import hf_greedy_reference, ids, mlxgraph_parity_errors, rel_err
from state_graphs import CHANNELS, KERNEL, StateOracle, build_state_graph

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.interpreter.cache.recurrent_state import RecurrentState
from mlxgraph.interpreter.kernels.state import causal_conv
from mlxgraph.interpreter.session.step_context import StepContext
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.records import LayerCacheInfo, StateLayerInfo
from mlxgraph.schema.verifier import verify_buffer

TOL = 1e-4
LFM2 = dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, conv_L_cache=3,
            layer_types=["conv", "full_attention", "conv", "conv"])


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    model = build_model(make_config("lfm2", **LFM2), seed=0)
    path = tmp_path_factory.mktemp("lfm2") / "lfm2.mlxg"
    stats = export(model, path, max_seq_len=64)
    assert stats["ops"]["CausalConv"] == 3 and stats["ops"]["UpdateAndAttend"] == 1
    return model, path


def test_lfm2_matches_transformers_over_prefill_chunks_decode_and_batches(lfm2):
    model, path = lfm2
    prompt = torch.randint(4, 256, (1, 13), generator=torch.Generator().manual_seed(7))
    reference = hf_greedy_reference(model, prompt, 40)
    errors = mlxgraph_parity_errors(path, prompt.numpy(), reference, chunk=4)
    print({k: v for k, v in errors.items() if k != "tokens"})
    assert max(errors[k] for k in ("prefill", "decode", "chunked", "batched")) < TOL, errors
    assert errors["tokens"] == reference[2]


def test_lfm2_moe_matches_transformers(tmp_path):
    """Short convolutions beside MoE feed-forward layers (the router's gather: issue 31)."""
    config = make_config("lfm2_moe", **LFM2, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, num_dense_layers=1)
    model = build_model(config, seed=0)
    export(model, tmp_path / "m.mlxg", max_seq_len=64)
    prompt = torch.randint(4, 256, (1, 13), generator=torch.Generator().manual_seed(7))
    reference = hf_greedy_reference(model, prompt, 40)
    errors = mlxgraph_parity_errors(tmp_path / "m.mlxg", prompt.numpy(), reference, chunk=4)
    assert max(errors[k] for k in ("prefill", "decode", "chunked", "batched")) < TOL, errors
    assert errors["tokens"] == reference[2]


def test_lfm2_describes_its_state_layers(lfm2):
    program = mlxgraph.load(lfm2[1])
    base = 2**20  # state ids are numbered from 2**20: the conv states of layers 0, 2, 3
    assert sorted(program.states) == [base, base + 1, base + 2]
    assert all(s.shape == (1, 64, 2) and s.dtype == "float32" for s in program.states.values())
    session = program.session(capacity=32)
    session.step(ids([[5, 6, 7]]), range(3))
    held = {la["layer"]: la for la in session.describe()["layers"]}
    assert held[base]["kind"] == "conv_state" and held[base]["bytes"] == 64 * 2 * 4
    assert held[1]["kind"] == "flat"


def _steps(session, oracle, sizes, start=0):
    err, pos = 0.0, start
    for n in sizes:
        tokens = [(7 * (pos + i) + 3) % 32 for i in range(n)]
        got = np.array(session.step(ids([tokens]), range(pos, pos + n)))[0]
        err = max(err, rel_err(got, oracle.step(tokens)))
        pos += n
    return err


@pytest.mark.parametrize("bias", [True, False])
def test_a_state_graph_matches_its_oracle_in_any_step_sizes(tmp_path, bias):
    wts = build_state_graph(tmp_path / "s.mlxg", bias=bias)
    program = mlxgraph.load(tmp_path / "s.mlxg")
    assert _steps(program.session(), StateOracle(wts), [5, 1, 1, 2, 7, 1]) < 1e-5


def test_fork_copies_the_state_and_a_rejected_step_leaves_it(tmp_path):
    wts = build_state_graph(tmp_path / "s.mlxg")
    program = mlxgraph.load(tmp_path / "s.mlxg")
    session, oracle = program.session(), StateOracle(wts)
    _steps(session, oracle, [6])
    twin = session.fork()
    twin_oracle = StateOracle(wts)
    twin_oracle.history = oracle.history.copy()
    assert _steps(twin, twin_oracle, [3, 1], start=6) < 1e-5   # the twin moves on...
    with pytest.raises(mlxgraph.SessionError):                # ...a bad step changes nothing
        session.step(ids([[1, 2]]), [7, 8])
    assert _steps(session, oracle, [1, 2], start=6) < 1e-5     # the original is where it was


def test_lfm2_fork_save_restore_and_rewind_stay_exact(lfm2, tmp_path):
    """Chunked prefill, decode, then a fork, a saved file and a step fed ahead and trimmed:
    all three continue as transformers does."""
    model, path = lfm2
    prompt = torch.randint(4, 256, (1, 13), generator=torch.Generator().manual_seed(3))
    _, decode, tokens = hf_greedy_reference(model, prompt, 12)
    program = mlxgraph.load(path)
    session = program.session(capacity=64)
    session.step(ids(prompt[:, :8].numpy()), range(8))
    session.step(ids(prompt[:, 8:].numpy()), range(8, 13))

    def feed(s, i):  # decode step i: the reference's own greedy token
        return rel_err(np.array(s.step(ids([[tokens[i]]]), [13 + i]))[0, -1], decode[i])

    assert max(feed(session, i) for i in range(6)) < TOL
    twin = session.fork()
    session.save(tmp_path / "c.safetensors")
    session.step(ids([[0]]), [19])   # a step fed ahead (generate's queued step), rewound
    session.trim(1)
    restored = program.restore(tmp_path / "c.safetensors")
    for s in (session, twin, restored):
        assert max(feed(s, i) for i in range(6, 12)) < TOL


def test_batched_rows_keep_their_own_state(tmp_path):
    wts = build_state_graph(tmp_path / "s.mlxg")
    program = mlxgraph.load(tmp_path / "s.mlxg")
    assert program.batching.problem is None
    a, b = program.session(), program.session()
    oa, ob = StateOracle(wts), StateOracle(wts)
    rows = program.step_batch([(a, ids([[1, 2, 3, 4]]), range(4)), (b, ids([[9]]), [0])])
    assert rel_err(np.array(rows[0])[0], oa.step([1, 2, 3, 4])) < 1e-5
    assert rel_err(np.array(rows[1])[0], ob.step([9])) < 1e-5
    for i in range(5):
        rows = program.step_batch([(a, ids([[i]]), [4 + i]), (b, ids([[i + 1]]), [1 + i])])
        assert rel_err(np.array(rows[0])[0], oa.step([i])) < 1e-5
        assert rel_err(np.array(rows[1])[0], ob.step([i + 1])) < 1e-5


BAD_STATES = {
    "shape": (dict(state=StateLayerInfo(0, (1, CHANNELS, KERNEL), "float32")),
              "node 2: field CausalConv.weight: weight [8, 4] is not [C, K] with K >= 2 for the "
              "state [1, 8, 4] = [1, C, K - 1]"),
    "dtype": (dict(state=StateLayerInfo(0, (1, CHANNELS, KERNEL - 1), "float16")),
              "node 2: field CausalConv.x: its dtype must be the state's, float16"),
    "missing": (dict(state=False),
                "node 2: field CausalConv.layer_id: layer_id 0 has no state in the metadata "
                "(metadata.states)"),
    "unused": (dict(layer_id=3),
               "node 2: field CausalConv.layer_id: layer_id 3 has no state in the metadata "
               "(metadata.states)"),
    "batch": (dict(state=StateLayerInfo(0, (2, CHANNELS, KERNEL - 1), "float32")),
              "field metadata.states[0]: shape [2, 8, 3] is not [1, ...] of rank 3 or 4 with "
              "dims >= 1"),
    "huge": (dict(state=StateLayerInfo(0, (1, 2**30, 2**20), "float32")),
             "field metadata.states[0]: shape [1, 1073741824, 1048576] holds more than the "
             "limit of"),
}


@pytest.mark.parametrize("case", list(BAD_STATES))
def test_the_verifier_refuses_bad_state_metadata_in_one_line(tmp_path, case):
    kwargs, reason = BAD_STATES[case]
    build_state_graph(tmp_path / "s.mlxg", **kwargs)
    with pytest.raises(GraphFormatError) as e:
        verify_buffer((tmp_path / "s.mlxg").read_bytes())
    assert e.value.detail.startswith(reason) and "\n" not in str(e.value)


def test_a_state_id_may_not_also_name_a_kv_cache(tmp_path, monkeypatch):
    from mlxgraph.schema.writer import GraphWriter

    write = GraphWriter.write

    def with_layer(self, path, **kw):
        self.metadata.layers = (LayerCacheInfo(0, 1, 8, 8),)
        return write(self, path, **kw)

    monkeypatch.setattr(GraphWriter, "write", with_layer)
    build_state_graph(tmp_path / "s.mlxg")
    with pytest.raises(GraphFormatError, match="names two states or a state and a KV cache"):
        verify_buffer((tmp_path / "s.mlxg").read_bytes())


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 2e-3),
                                       (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("kernel", [2, 4])
def test_the_kernel_matches_torch_conv1d_step_by_step(dtype, tol, kernel):
    g = torch.Generator().manual_seed(kernel)
    x = torch.randn(1, 6, 11, generator=g).to(dtype)
    weight, bias = torch.randn(6, kernel, generator=g).to(dtype), torch.randn(6, generator=g)
    bias = bias.to(dtype)
    want = F.conv1d(x.float(), weight.float().unsqueeze(1), bias.float(), padding=kernel - 1,
                    groups=6)[:, :, :11]
    info = StateLayerInfo(0, (1, 6, kernel - 1), str(dtype).rsplit(".", 1)[-1])
    store = RecurrentState(info, "conv_state")
    ctx = StepContext({0: store})
    got = []
    for lo, hi in ((0, 5), (5, 6), (6, 7), (7, 11)):   # a prefill, then steps
        part = mx.array(x[:, :, lo:hi].float().numpy()).astype(getattr(mx, str(dtype)[6:]))
        store.begin(hi - lo)
        got.append(np.array(causal_conv(part, mx.array(weight.float().numpy()),
                                        mx.array(bias.float().numpy()), 0, ctx)
                            .astype(mx.float32)))
        store.commit()
    got = np.concatenate(got, axis=2)
    assert np.abs(got - want.numpy()).max() <= tol * max(1.0, np.abs(want.numpy()).max())


def test_inspect_lists_the_state_layers(tmp_path, capsys):
    import json

    from tool_helpers import run_cli

    build_state_graph(tmp_path / "s.mlxg")
    code, out, _ = run_cli(capsys, "inspect", tmp_path / "s.mlxg", "--json")
    assert code == 0
    assert json.loads(out)["metadata"]["states"] == [
        {"layer": 0, "shape": [1, CHANNELS, KERNEL - 1], "dtype": "float32"}]
    code, out, _ = run_cli(capsys, "inspect", tmp_path / "s.mlxg")
    assert f"state       layer 0: float32 [1, {CHANNELS}, {KERNEL - 1}]" in out.splitlines()
