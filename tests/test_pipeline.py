"""Pipeline-parallel generation over mx.distributed: the partition (in this process) and
2 / 3 local ranks started by ``mlx.launch`` over the loopback ring (tests/pipeline_worker.py).

Every launch is bounded (a deadline on the launcher and a watchdog in every rank) and its
whole process group is killed afterwards, whatever happened.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pipeline_worker
import pytest
from run_cache import build_once
from synthetic_graphs import llama

import mlxgraph
from mlxgraph.interpreter.pipeline.plan import plan_stages
from mlxgraph.tools.cli import main
from mlxgraph.tools.local_ranks import free_port_block, run_local_ranks

WORKER = Path(pipeline_worker.__file__)
LAUNCH_DEADLINE = 90  # seconds: the most one launch may take before it is killed


def run_worker(tmp_path, graph, n, mode="schedule", timeout=30.0) -> tuple:
    """Launch the worker on ``n`` ranks; ({rank: its json}, seconds, stderr)."""
    run = run_local_ranks(n, [sys.executable, WORKER, graph, tmp_path, mode, timeout],
                          LAUNCH_DEADLINE)
    assert not run.timed_out, f"{n} ranks still running after {LAUNCH_DEADLINE} s"
    docs = {}
    for r in range(n):
        f = tmp_path / f"rank{r}.json"
        if f.exists():
            docs[r] = json.loads(f.read_text())
    return docs, run.seconds, run.stderr




@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A 4-layer Llama graph (tied embedding: the first and last stage both load it)."""
    path = tmp_path_factory.mktemp("pipe") / "llama4.mlxg"
    llama(layers=4, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=96,
          max_context=128).write(path)
    return path


def check_ranks(tmp_path, graph, n):
    """Run the schedule on ``n`` ranks: the tokens and logits (within 1e-5) of the schedule
    on one ordinary session, every layer on one rank, each rank loading only its stage's
    weights, one step rejected on every rank."""
    docs, _, err = run_worker(tmp_path, graph, n)
    assert sorted(docs) == list(range(n)), f"a rank wrote no result: {err[-3000:]}"
    reference = json.loads((tmp_path / "reference.json").read_text())
    ref = reference["steps"]
    for rank, doc in docs.items():
        assert doc["error"] is None
        steps = doc["steps"]
        assert [s["tokens"] for s in steps] == [s["tokens"] for s in ref], f"rank {rank}"
        for got, want in zip(steps, ref):
            np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-5)
        assert [e[0] for e in doc["events"]] == ["trim", "rejected", "disagreed",
                                                 "trim_refused", "reset", "ring_refused"]
        assert "disagree with the cache" in doc["events"][1][2]
        assert "the pipeline ranks disagree on the call" in doc["events"][2][2]
        assert doc["events"][1][1] == doc["events"][2][1] == doc["events"][0][1]
        # Only the last rank holds the ring; every rank refused, nothing was rewound.
        _, length, message, approximations = doc["events"][5]
        assert f"cannot rewind {length - 2} tokens" in message
        rings = {lc.layer_id for lc in mlxgraph.load(graph).metadata.layers
                 if lc.sliding_window or lc.attention_chunk}
        if not rings & set(doc["layers"]):  # this rank's own stores could rewind
            assert ("rejected the call" in message) == (rank != n - 1)
        assert approximations == last_layer_approximation(graph)
    program = mlxgraph.load(graph)
    assert sorted(lid for d in docs.values() for lid in d["layers"]) == sorted(program.layers)
    total = sum(c.length for c in program.graph.constants)
    for doc in docs.values():
        assert doc["loaded_bytes"] == doc["weight_bytes"] < total
        # Peak memory per rank: below one process holding the whole model.
        assert doc["peak_memory_bytes"] < reference["peak_memory_bytes"]
        assert doc["stage_weight_bytes"] == [d["weight_bytes"] for _, d in sorted(docs.items())]
    return docs


def last_layer_approximation(graph) -> dict:
    """What ring_refusal's window on the last layer approximates (pipeline_worker.py)."""
    last = max(mlxgraph.load(graph).metadata.layers, key=lambda lc: lc.layer_id)
    full = not last.sliding_window and not last.attention_chunk
    return {str(last.layer_id): 4} if full else {}


def test_two_ranks_match_one_process(tmp_path, graph):
    check_ranks(tmp_path, graph, 2)


@pytest.mark.slow
def test_three_ranks_match_one_process(tmp_path, graph):
    check_ranks(tmp_path, graph, 3)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gemma3",
                                   "tiny-phi3", "hf-llama-4-layers", "tiny-llama-q4"])
def test_exported_models_on_two_and_three_ranks(tmp_path, model):
    """The built-ins, a 4-layer Hugging Face folder and a 4-bit export on 2 and 3 ranks."""
    from mlxgraph.exporter import export
    from mlxgraph.exporter.builtins import build_model, make_config
    from mlxgraph.exporter.quantize import QuantizeRecipe

    source, recipe = model, None
    if model == "tiny-llama-q4":  # quantized weights: scales and biases go with their layer
        source, recipe = "tiny-llama", QuantizeRecipe("q4")
    if model == "hf-llama-4-layers":
        source = tmp_path / "hf"
        config = make_config("llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
        build_model(config, seed=3).save_pretrained(source)
    graph = tmp_path / f"{model}.mlxg"
    export(str(source), graph, quantize=recipe)
    for n in (2, 3):
        (tmp_path / str(n)).mkdir()
        docs = check_ranks(tmp_path / str(n), graph, n)
        print(f"{model}: {n} ranks, weights {[d['weight_bytes'] for d in docs.values()]}, "
              f"peak MLX memory {[d['peak_memory_bytes'] for d in docs.values()]}")


def test_a_rank_that_dies_ends_the_run(tmp_path, graph):
    docs, seconds, err = run_worker(tmp_path, graph, 2, mode="die", timeout=30)
    assert "lost another rank" in docs[0]["error"], err[-2000:]
    assert 1 not in docs  # it exited without writing
    assert seconds < 30  # the peer's lost connection, not the watchdog's deadline


def test_a_rank_that_hangs_is_ended_by_the_watchdog(tmp_path, graph):
    # 6 s: the same deadline also bounds connecting the ring, which took over 2 s while
    # the machine ran other tests (the test then saw "could not connect the ring in 2 s")
    docs, seconds, err = run_worker(tmp_path, graph, 2, mode="hang", timeout=6)
    assert "pipeline rank 0: no answer for 6 s" in err, err[-2000:]
    assert docs == {}  # rank 0 was ended inside the wait, rank 1 by the launcher
    assert seconds < 30


def test_partition_balances_weights_and_cuts_at_the_hidden_state(graph):
    program = mlxgraph.load(graph)
    for n in (1, 2, 3, 4):
        stages = plan_stages(program.graph, program.nodes, n)
        assert [s.rank for s in stages] == list(range(n))
        assert sorted(lid for s in stages for lid in s.layers) == [0, 1, 2, 3]
        every = set().union(*(s.constants for s in stages))
        assert every == {c.tensor for c in program.graph.constants}
        for a, b in zip(stages, stages[1:]):
            assert a.sends == b.receives and len(a.sends) == 1  # the residual stream only
            hidden = program.graph.tensors[a.sends[0]]
            assert hidden.shape == (1, "T", 64)
        assert stages[0].receives == () and stages[-1].sends == ()
    with pytest.raises(mlxgraph.GraphFormatError, match="needs at least 5 layers"):
        plan_stages(program.graph, program.nodes, 5)


def test_one_rank_pipeline_is_the_plain_session(graph):
    """Not launched: a pipeline of one stage, the same numbers as a Session."""
    program = mlxgraph.load(graph, pipeline=True)
    assert repr(program).endswith("4 attention layers, stage 0 of 1)")
    assert program.link.size == 1 and program.stage.weight_bytes == sum(
        c.length for c in program.graph.constants)
    session = program.session(capacity=64)
    record, ref = [], []
    pipeline_worker.schedule(session, 0, 1, record, [])
    pipeline_worker.schedule(mlxgraph.load(graph).session(capacity=64), 0, 1, ref, [])
    for got, want in zip(record, ref):
        assert got["tokens"] == want["tokens"]
        np.testing.assert_array_equal(np.array(got["logits"]), np.array(want["logits"]))
    twin = session.fork()  # collective: a pipeline of one rank agrees with itself
    assert (twin.length, twin.stores.keys()) == (session.length, session.stores.keys())
    for refused in (lambda: session.save("x"), lambda: session.restore("x")):
        with pytest.raises(mlxgraph.SessionError, match="not supported by a pipeline session"):
            refused()
    with pytest.raises(ValueError, match="pipeline timeout"):
        mlxgraph.load(graph, pipeline=True, pipeline_timeout=0)


def test_generate_pipeline_command(tmp_path, graph):
    """`mlxgraph generate --pipeline` on 2 ranks: one JSON document (rank 0's), the greedy
    tokens of the single-process command, the weights and peak memory of each rank."""
    args = ["generate", graph, "--prompt-ids", "1,2,3,4", "--max-tokens", "12", "--ignore-eos",
            "--json"]
    single = subprocess.run([sys.executable, "-m", "mlxgraph.tools", *map(str, args)],
                            capture_output=True, text=True, timeout=LAUNCH_DEADLINE, check=True)
    run = run_local_ranks(2, [sys.executable, "-m", "mlxgraph.tools", *args, "--pipeline"],
                          LAUNCH_DEADLINE)
    doc = json.loads(run.stdout)  # exactly one document: the other rank prints nothing
    assert doc["token_ids"] == json.loads(single.stdout)["token_ids"]
    pipe = doc["pipeline"]
    assert pipe["ranks"] == 2 and len(pipe["peak_memory_bytes"]) == 2
    assert sum(pipe["weight_bytes"]) > sum(c.length for c in mlxgraph.load(graph).graph.constants)


def test_generate_pipeline_refusals(tmp_path, graph, capsys):
    args = ["generate", str(graph), "--prompt-ids", "1,2", "--pipeline"]
    assert main([*args, "--prompt-cache", str(tmp_path / "c")]) == 2
    assert "--prompt-cache cannot be used with --pipeline" in capsys.readouterr().err
    assert main([*args, "--pipeline-timeout", "0"]) == 2
    assert "--pipeline-timeout must be a positive number" in capsys.readouterr().err


def test_a_peer_that_never_starts_ends_the_connect(tmp_path, graph):
    """MLX holds Python's lock while the ring connects: a watcher process ends the rank."""
    port = free_port_block(2)
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([[f"127.0.0.1:{port}"], [f"127.0.0.1:{port + 1}"]]))
    env = {**os.environ, "MLX_HOSTFILE": str(hosts), "MLX_RANK": "0"}
    proc = subprocess.run([sys.executable, WORKER, graph, tmp_path, "schedule", "2"], env=env,
                          capture_output=True, text=True, timeout=LAUNCH_DEADLINE)
    assert proc.returncode != 0
    assert "pipeline rank 0: could not connect the ring in 2 s" in proc.stderr


# Recurrent state layers (format 1.3) in a pipeline: LFM2 (short convolutions around one
# attention layer) and Nemotron-H (a Mamba-2 layer, whose conv and scan stay on one stage,
# then an attention layer: the 2-stage cut falls between a state layer and attention).
STATE_MODELS = {
    "lfm2": dict(num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=96, conv_L_cache=3,
                 layer_types=["conv", "full_attention", "conv", "conv"]),
    "nemotron_h": dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                       hybrid_override_pattern="M*", head_dim=16, mamba_num_heads=8,
                       mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
                       chunk_size=8),
}
# Partitioned only: Falcon-H1 runs attention and a Mamba-2 mixer side by side in each layer.
FALCON_H1 = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=96, head_dim=16,
                 mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
                 mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8)


def state_graph(tmp_path_factory, arch) -> Path:
    """The tiny seeded model's graph, exported once per test run."""
    from mlxgraph.exporter import export
    from mlxgraph.exporter.builtins import build_model, make_config

    model = build_model(make_config(arch, **{**STATE_MODELS, "falcon_h1": FALCON_H1}[arch]),
                        seed=0)
    return build_once(tmp_path_factory, f"pipe_{arch}.mlxg",
                      lambda p: export(model, p, max_seq_len=64))


def check_state_ranks(tmp_path, graph, n):
    """The state schedule on ``n`` ranks: the one-process session's tokens and logits bit
    for bit, every KV and state layer on one rank, rewinds allowed and refused alike."""
    docs, _, err = run_worker(tmp_path, graph, n, mode="states")
    assert sorted(docs) == list(range(n)), f"a rank wrote no result: {err[-3000:]}"
    ref = json.loads((tmp_path / "reference.json").read_text())["steps"]
    program = mlxgraph.load(graph)
    for rank, doc in docs.items():
        assert doc["error"] is None
        assert [s["tokens"] for s in doc["steps"]] == [s["tokens"] for s in ref], f"rank {rank}"
        for got, want in zip(doc["steps"], ref):
            np.testing.assert_array_equal(np.array(got["logits"]), np.array(want["logits"]))
        kinds = [e[0] for e in doc["events"]]
        assert kinds[-4:] == ["rewound", "state_refused", "trimmed", "states"], kinds
        (_, at), (_, length, message), (_, to), (_, held) = doc["events"][-4:]
        assert (at, length, to) == (len(pipeline_worker.PROMPT) * 2, 20, 18)
        assert ("cannot rewind 3 tokens to position 17: a recurrent state is kept only at "
                "positions 0, 18, 19 (the starts of its last 2 steps)") in message
        assert ("rejected the call" in message) == (not doc["states"])
        assert sorted(held) == sorted(doc["states"])  # its own stage's states, no other
    assert sorted(lid for d in docs.values() for lid in d["states"]) == sorted(program.states)
    assert sorted(lid for d in docs.values() for lid in d["layers"]) == sorted(program.layers)
    return docs


@pytest.mark.parametrize("arch", list(STATE_MODELS))
def test_state_graphs_on_two_ranks_match_one_process(tmp_path_factory, tmp_path, arch):
    docs = check_state_ranks(tmp_path, state_graph(tmp_path_factory, arch), 2)
    if arch == "nemotron_h":  # the Mamba-2 layer (conv and scan) first, then attention
        assert (len(docs[0]["states"]), docs[0]["layers"], docs[1]["states"]) == (2, [], [])


@pytest.mark.slow
def test_lfm2_on_three_ranks_matches_one_process(tmp_path_factory, tmp_path):
    check_state_ranks(tmp_path, state_graph(tmp_path_factory, "lfm2"), 3)


def test_state_partition_keeps_each_layer_whole(tmp_path_factory):
    """Each stage holds the states of its own nodes; a Mamba-2 layer's conv and scan, and
    Falcon-H1's attention beside them, are never cut apart (the layer's inside is wider
    than the residual stream), so the 2-layer Nemotron-H and Falcon-H1 have two blocks."""
    for arch, blocks in (("lfm2", 4), ("nemotron_h", 2), ("falcon_h1", 2)):
        program = mlxgraph.load(state_graph(tmp_path_factory, arch))
        for n in range(1, blocks + 1):
            stages = plan_stages(program.graph, program.nodes, n)
            assert sorted(s for p in stages for s in p.states) == sorted(program.states)
            for a, b in zip(stages, stages[1:]):
                assert a.sends == b.receives and len(a.sends) == 1  # the residual stream
        if arch == "falcon_h1":  # each stage: one layer's attention, conv and scan
            assert [(len(p.layers), len(p.states)) for p in stages] == [(1, 2), (1, 2)]
        with pytest.raises(mlxgraph.GraphFormatError, match=f"needs at least {blocks + 1} "
                                                            f"layers .* the graph has {blocks}"):
            plan_stages(program.graph, program.nodes, blocks + 1)


def test_one_rank_state_pipeline_is_the_plain_session(tmp_path_factory):
    """Not launched: the state schedule on a pipeline of one stage, bit for bit."""
    graph = state_graph(tmp_path_factory, "lfm2")
    program = mlxgraph.load(graph, pipeline=True)
    assert program.states == mlxgraph.load(graph).states and program.stage.states
    record, ref, events = [], [], []
    pipeline_worker.state_rewinds(program, record, events)
    pipeline_worker.state_rewinds(mlxgraph.load(graph), ref, [])
    assert [r["tokens"] for r in record] == [r["tokens"] for r in ref]
    for got, want in zip(record, ref):
        np.testing.assert_array_equal(np.array(got["logits"]), np.array(want["logits"]))
    assert record[1]["logits"] == record[2]["logits"]  # the chunk again after the rewind
    assert [e[0] for e in events] == ["rewound", "state_refused", "trimmed", "states"]
