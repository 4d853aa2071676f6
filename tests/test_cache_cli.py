"""`mlxgraph cache inspect/diff` and generate's --prompt-cache, --kv-bits and --window.

Oracles: a fresh generation without any cache file (tokens must be identical when a
prefix is reused), the sessions whose files are inspected (describe()), and known
divergence points (two prompts sharing a prefix diverge exactly where they differ).
"""

import json

import mlx.core as mx
import numpy as np
import pytest
from synthetic_graphs import llama
from tool_helpers import run_cli

import mlxgraph

PROMPT = [1, 7, 42, 99, 5, 200, 3, 17]


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """A graph with head_dim 64 (quantizable) and another with other weights."""
    folder = tmp_path_factory.mktemp("cc")
    out = {}
    for name, seed in (("a", 0), ("b", 1)):
        path = folder / f"{name}.mlxg"
        llama(
            layers=2,
            hidden=128,
            heads=2,
            kv_heads=1,
            intermediate=64,
            vocab=256,
            seed=seed,
            max_context=128,
        ).write(path)
        out[name] = path
    return out


def gen(capsys, graph, prompt, *extra):
    code, out, err = run_cli(
        capsys,
        "generate",
        graph,
        "--prompt-ids",
        ",".join(map(str, prompt)),
        "--max-tokens",
        6,
        "--ignore-eos",
        "--json",
        *extra,
    )
    assert code == 0, err
    return json.loads(out)


def test_prompt_cache_reuses_a_prefix_and_matches_a_fresh_run(capsys, graphs, tmp_path):
    file = tmp_path / "prompt.safetensors"
    first = gen(capsys, graphs["a"], PROMPT, "--prompt-cache", file)
    assert (
        first["prompt_cache"]["reused_tokens"] == 0
        and first["prompt_cache"]["saved_tokens"] == len(PROMPT) - 1
    )
    again = gen(capsys, graphs["a"], PROMPT, "--prompt-cache", file)
    assert again["prompt_cache"]["reused_tokens"] == len(PROMPT) - 1
    assert again["token_ids"] == first["token_ids"]
    longer = PROMPT + [9, 9, 31]
    cached = gen(capsys, graphs["a"], longer, "--prompt-cache", file)
    assert cached["prompt_cache"]["reused_tokens"] == len(PROMPT) - 1
    assert cached["token_ids"] == gen(capsys, graphs["a"], longer)["token_ids"]
    other = gen(capsys, graphs["a"], [5] + PROMPT, "--prompt-cache", file)
    assert (
        other["prompt_cache"]["reused_tokens"] == 0
        and "not a prefix" in other["prompt_cache"]["note"]
    )
    quant = gen(capsys, graphs["a"], [5] + PROMPT, "--prompt-cache", file, "--kv-bits", "8")
    assert quant["prompt_cache"]["reused_tokens"] == 0 and "policy" in quant["prompt_cache"]["note"]
    # another graph's file is refused, and left as it was
    before = file.read_bytes()
    code, _, err = run_cli(
        capsys, "generate", graphs["b"], "--prompt-ids", "1,2,3", "--prompt-cache", file
    )
    assert code == 2 and "another graph" in err
    assert file.read_bytes() == before


def test_kv_bits_and_window_are_reported(capsys, graphs):
    doc = gen(
        capsys, graphs["a"], PROMPT, "--kv-bits", "4", "--kv-group-size", "32", "--window", "4"
    )
    assert doc["kv_cache"]["kv_bits"] == 4 and doc["kv_cache"]["kv_group_size"] == 32
    assert doc["kv_cache"]["approximations"] == {"0": 4, "1": 4}
    assert gen(capsys, graphs["a"], PROMPT)["kv_cache"]["approximations"] == {}
    code, _, err = run_cli(
        capsys, "generate", graphs["a"], "--prompt-ids", "1,2", "--max-tokens", 2, "--window", 4
    )
    assert code == 0 and "approximation" in err and "last 4 tokens" in err


def test_kv_bits_a_graph_cannot_take_exits_2(capsys, tmp_path):
    path = tmp_path / "narrow.mlxg"
    llama(hidden=64, heads=4, vocab=256).write(path)  # head_dim 16
    code, _, err = run_cli(capsys, "generate", path, "--prompt-ids", "1,2", "--kv-bits", "8")
    assert code == 2 and "head_dim 16 is not a multiple of the quantization group size 64" in err


def saved(graph, tmp_path, name, prompt, **policy):
    session = mlxgraph.load(graph).session(**policy)
    session.step(mx.array([prompt], dtype=mx.int32), range(len(prompt)))
    path = tmp_path / f"{name}.safetensors"
    session.save(path, tokens=prompt)
    return path, session


def test_inspect_shows_what_describe_shows(capsys, graphs, tmp_path):
    path, session = saved(graphs["a"], tmp_path, "ring", PROMPT, windows={0: 3, 1: 0}, max_step=2)
    code, out, err = run_cli(capsys, "cache", "inspect", path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    live = session.describe()
    assert doc["length"] == live["length"] == len(PROMPT) and doc["policy"] == live["policy"]
    assert doc["approximations"] == {"0": 3} and doc["tokens_recorded"]
    for got, want in zip(doc["layers"], live["layers"], strict=True):
        for key in (
            "layer",
            "kind",
            "wrapped",
            "length",
            "first_position",
            "tokens",
            "window",
            "slots",
            "bits",
        ):
            assert got[key] == want[key], key
    assert doc["layers"][0]["kind"] == "ring" and doc["layers"][0]["wrapped"]
    code, out, _ = run_cli(capsys, "cache", "inspect", path)
    assert "ring wrapped" in out and "approximation" in out and "flat" in out


def test_diff_finds_quantization_error_and_the_first_differing_position(capsys, graphs, tmp_path):
    f32, _ = saved(graphs["a"], tmp_path, "f32", PROMPT)
    q8, _ = saved(graphs["a"], tmp_path, "q8", PROMPT, kv_bits=8)
    fork, _ = saved(graphs["a"], tmp_path, "fork", PROMPT[:5] + [11, 12, 13])
    code, out, _ = run_cli(capsys, "cache", "diff", f32, f32, "--json")
    assert code == 0 and json.loads(out)["same"]
    code, out, _ = run_cli(capsys, "cache", "diff", f32, q8, "--json", "--tolerance", "1e-6")
    doc = json.loads(out)
    assert code == 1 and doc["first_divergence"] == 0
    worst = max(r["keys_max_rel"] for la in doc["layers"] for r in la["ranges"])
    assert 0 < worst < 0.02  # 8-bit codes: under 1/255 of a group's range per element
    code, out, _ = run_cli(capsys, "cache", "diff", f32, q8, "--json", "--tolerance", "0.05")
    assert code == 0
    code, out, _ = run_cli(capsys, "cache", "diff", f32, fork, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["first_divergence"] == 5
    assert all(la["first_divergence"]["position"] == 5 for la in doc["layers"])
    code, out, _ = run_cli(capsys, "cache", "diff", f32, fork, "--block", "4")
    assert "first diverges at position 5" in out and "different" in out


def test_cache_commands_refuse_damaged_files(capsys, graphs, tmp_path):
    path, _ = saved(graphs["a"], tmp_path, "ok", PROMPT)
    raw = path.read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0x40]))
    code, out, err = run_cli(capsys, "cache", "inspect", bad)
    assert code == 2 and out == "" and "SHA-256 seal" in err
    code, _, err = run_cli(capsys, "cache", "diff", path, tmp_path / "missing.safetensors")
    assert code == 2 and "cannot read" in err


def test_prompt_cache_refuses_a_crafted_file_in_one_line_and_keeps_it(capsys, graphs, tmp_path):
    """Sealed with mlxgraph's own writer (the seal is no secret): a header field of the
    wrong type, a tensor that does not fit the graph's cache, a sparse 40 GB claim. Exit 2
    with one line, the file never overwritten, nothing of its claimed size allocated."""
    from hostile_caches import corpus

    good, _ = saved(graphs["a"], tmp_path, "good", PROMPT[:5], capacity=128, max_step=512)
    names = ("layer batch='1'", "tensor heads doubled", "sparse 40 GB tensor",
             "policy.windows={'1_0': 2}")
    cases = [(n, p) for n, p in corpus(good, tmp_path) if n in names]
    assert len(cases) == len(names)
    for name, path in cases:
        before = path.stat()
        code, out, err = run_cli(capsys, "generate", graphs["a"], "--prompt-ids",
                                 ",".join(map(str, PROMPT)), "--max-tokens", 2,
                                 "--prompt-cache", path)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, (name, err)
        assert "--prompt-cache" in err and str(path) in err, (name, err)
        after = path.stat()
        assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)

def test_diff_counts_nan_in_both_as_equal_and_in_one_as_infinite():
    from mlxgraph.tools.cache_view import _position_diff

    a = np.ones((1, 1, 3, 2), np.float32)
    b = a.copy()
    a[0, 0, 0, 0] = b[0, 0, 0, 0] = np.nan
    b[0, 0, 2, 1] = np.nan
    diff, scale = _position_diff(a, b)
    assert diff.tolist() == [0.0, 0.0, np.inf] and scale.tolist() == [1.0, 1.0, 1.0]
