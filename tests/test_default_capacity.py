"""A session's default capacity is the model's own maximum context (its
max_position_embeddings, recorded at export), bounded by memory, and says why; an explicit
capacity is the user's choice. A prompt longer than the export's step bound (max_context)
but within the model's maximum runs (issue 32: 2,102 tokens were refused on a 4096 model)."""

import json
from types import SimpleNamespace

import pytest
from synthetic_graphs import llama
from tool_helpers import generate_cli

import mlxgraph
from mlxgraph.interpreter.session.capacity import (
    DEFAULT_CAPACITY,
    bytes_per_token,
    default_capacity,
    model_maximum,
)
from mlxgraph.schema.records import LayerCacheInfo


def _graph(path, max_position_embeddings="1024"):
    spec = llama(vocab=256, hidden=64, intermediate=128, seed=0, tied=False, max_context=256)
    spec.metadata.eos_token_ids = ()
    spec.metadata.tokenizer = "byte"
    if max_position_embeddings is not None:
        spec.metadata.extra["max_position_embeddings"] = max_position_embeddings
    spec.write(path)
    return path


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return _graph(tmp_path_factory.mktemp("capacity") / "g.mlxg")


def _meta(extra=None, max_context=0):
    return SimpleNamespace(extra=extra or {}, max_context=max_context)


def test_the_model_s_maximum_comes_first():
    assert model_maximum(_meta({"max_position_embeddings": "4096"}, 2048)) == (
        4096, "the model's max_position_embeddings")
    assert model_maximum(_meta({}, 2048)) == (2048, "the graph's max context")
    for bad in ("", "many", "0", str(2**40)):
        assert model_maximum(_meta({"max_position_embeddings": bad}, 512))[0] == 512
    assert model_maximum(_meta())[0] == DEFAULT_CAPACITY


def _program(windows=(0, 0), chunk=0):
    layers = {i: LayerCacheInfo(i, kv_heads=2, head_dim=16, v_head_dim=16,
                                sliding_window=w, attention_chunk=chunk)
              for i, w in enumerate(windows)}
    return SimpleNamespace(metadata=_meta({"max_position_embeddings": "100000"}, 2048),
                           layers=layers), {i: w for i, w in enumerate(windows)}


def test_memory_bounds_it_to_a_power_of_two_and_says_so():
    program, windows = _program()
    per_token = bytes_per_token(program.layers, windows, 4, 0, 64)
    assert per_token == 2 * 2 * 32 * 4  # two layers, k and v of 2 heads x 16, float32
    assert default_capacity(program, windows, 4, 0, 64, room=1 << 40) == (
        100000, "the model's max_position_embeddings")
    room = 3000 * per_token * 2  # half of it holds 3000 tokens: 2048 is the power of two
    capacity, why = default_capacity(program, windows, 4, 0, 64, room=room)
    assert capacity == 2048 and why.startswith("memory: the model's max_position_embeddings "
                                               "is 100000") and "1/2 of the" in why
    # an 8-bit cache (1.125 bytes an element with its scales) holds 3.5x the tokens
    assert default_capacity(program, windows, 4, 8, 64, room=room)[0] == 8192


def test_layers_that_keep_a_fixed_history_do_not_count():
    program, windows = _program(windows=(0, 128))
    one_layer = bytes_per_token(program.layers, windows, 4, 0, 64)
    assert one_layer == 2 * 32 * 4
    program, windows = _program(windows=(64, 128))  # a ring per layer: no bound at all
    assert default_capacity(program, windows, 4, 0, 64, room=1)[0] == 100000
    program, windows = _program(chunk=32)  # chunked layers hold one chunk
    assert default_capacity(program, windows, 4, 0, 64, room=1)[0] == 100000


def test_sessions_default_to_the_model_s_maximum(graph):
    program = mlxgraph.load(graph)
    session = program.session()
    assert program.metadata.max_context == 256
    assert session.capacity == 1024
    assert session.capacity_reason == "the model's max_position_embeddings"
    twin = session.fork()
    assert (twin.capacity, twin.capacity_reason) == (1024, session.capacity_reason)
    asked = program.session(capacity=64)
    assert (asked.capacity, asked.capacity_reason) == (64, "as asked")


def test_a_prompt_past_the_step_bound_runs(graph, tmp_path):
    ids = ",".join(str(3 + i % 200) for i in range(300))
    proc = generate_cli(graph, "--prompt-ids", ids, "--max-tokens", 2, "--prefill-chunk", 128,
                        "--json")
    assert proc.returncode == 0, proc.stderr
    kv = json.loads(proc.stdout)["kv_cache"]
    assert kv["capacity"] == 1024 and kv["capacity_reason"] == "the model's max_position_embeddings"
    proc = generate_cli(graph, "--prompt-ids", ids, "--max-tokens", 2, "--prefill-chunk", 128)
    assert "context      1024 tokens of KV capacity (the model's max_position_embeddings)" \
        in proc.stderr, proc.stderr
    # the user's own capacity stays the user's: refused past it, naming why
    proc = generate_cli(graph, "--prompt-ids", ids, "--capacity", 200)
    assert proc.returncode == 2 and "more than the KV capacity of 200 (as asked" in proc.stderr
    # a graph without the model's maximum keeps its max context
    old = _graph(tmp_path / "old.mlxg", max_position_embeddings=None)
    proc = generate_cli(old, "--prompt-ids", ids, "--max-tokens", 2, "--prefill-chunk", 128)
    assert proc.returncode == 2 and "KV capacity of 256 (the graph's max context" in proc.stderr
