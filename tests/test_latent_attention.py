"""Multi-head latent attention (MLA), issue 30 item 3: exported in its absorbed form with a
cache of the latent and the RoPE key per position (format 1.3, LayerCache.values_in_keys).

DeepSeek-V2 (complex RoPE, group-limited greedy routing, yarn), DeepSeek-V3 (q LoRA,
sigmoid noaux_tc routing with grouped top-k and shared experts), GLM-4-MoE-Lite, MiniCPM3
and LongCat-Flash (LoRA scaling, two attention sublayers per layer, zero experts) export
and match transformers eager over a prefill, 40 greedy decode steps, a chunked prefill and
batched steps; DeepSeek-V2's sessions fork, save and restore bitwise,
quantize their latent cache, and report what a position costs. The verifier holds a latent
layer's node to its geometry, and a reader of format 1.2 refuses such a file by name.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from parity_helpers import hf_greedy_reference, ids, mlxgraph_parity_errors, rel_err
from run_cache import build_once
from tool_helpers import run_cli

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.records import LayerCacheInfo
from mlxgraph.schema.verifier import verify_buffer

TOL = 1e-4
PROMPT, DECODE = 12, 40
# 4 heads of nope 16 + rope 16 (v 12) over a latent of 48: a key row of 64 (quantizable).
_MLA = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=256, max_position_embeddings=128,
            kv_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=12)
_MOE = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, n_shared_experts=1, n_group=4, topk_group=2)
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
         "mscale": 0.707, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
FAMILIES = {
    "deepseek_v2": dict(_MLA, **_MOE, q_lora_rank=None, topk_method="group_limited_greedy",
                        rope_parameters=_YARN),
    "deepseek_v3": dict(_MLA, **_MOE, q_lora_rank=24),
    "glm4_moe_lite": dict(_MLA, **_MOE, q_lora_rank=24),
    "minicpm3": dict(_MLA, q_lora_rank=24),
    # LoRA scaling of q and the latent; softmax routing with zero (identity) experts
    # (num_hidden_layers 2 is one layer of two attention sublayers: a cache each)
    "longcat_flash": dict(_MLA, head_dim=16, q_lora_rank=24,
                          ffn_hidden_size=64, moe_topk=2, n_routed_experts=4,
                          zero_expert_num=2, expert_ffn_hidden_size=32),
}
# Per position and layer: the latent and the RoPE key, float32, against per-head K and V.
LATENT_BYTES = (48 + 16) * 4
FULL_KV_BYTES = 4 * ((16 + 16) + 12) * 4


def _model(arch):
    """The seeded model, its routers' score correction biases (noaux_tc; zeros as built)
    drawn too, so that the bias changes which experts are chosen."""
    model = build_model(make_config(arch, **FAMILIES[arch]), seed=0)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in model.modules():
            bias = getattr(m, "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(torch.rand(bias.shape, generator=g) * 0.5)
    return model


@pytest.fixture(scope="module")
def deepseek_v2(tmp_path_factory):
    path = build_once(tmp_path_factory, "deepseek_v2_mla.mlxg",
                      lambda p: export(_model("deepseek_v2"), p, max_seq_len=64))
    return mlxgraph.load(path)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_mla_families_match_transformers_with_a_latent_cache(arch, tmp_path):
    stats = export(_model(arch), tmp_path / "m.mlxg", max_seq_len=64)
    assert stats["ops"]["UpdateAndAttend"] == 2
    program = mlxgraph.load(tmp_path / "m.mlxg")
    assert set(program.layers.values()) == {
        LayerCacheInfo(lid, 1, 64, 48, values_in_keys=True) for lid in (0, 1)}
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    reference = hf_greedy_reference(_model(arch), prompt, DECODE)
    errors = mlxgraph_parity_errors(tmp_path / "m.mlxg", prompt.numpy(), reference, chunk=5)
    print(arch, {k: v for k, v in errors.items() if k != "tokens"})
    assert max(errors[k] for k in ("prefill", "decode", "chunked", "batched")) < TOL, errors
    assert errors["tokens"] == reference[2]


def _steps(session, tokens, start):
    return [np.array(session.step(ids([t]), [start + i]))[0, -1] for i, t in enumerate(tokens)]


def test_fork_and_restore_continue_bitwise_and_the_file_holds_keys_alone(deepseek_v2, tmp_path):
    session = deepseek_v2.session(capacity=64)
    session.step(ids([[5, 9, 17, 3, 200, 41]]), range(6))
    twin = session.fork()
    path = tmp_path / "c.safetensors"
    session.save(path)
    restored = deepseek_v2.restore(path)
    want = _steps(session, [7, 8, 9], 6)
    assert all(np.array_equal(a, b) for a, b in zip(_steps(twin, [7, 8, 9], 6), want))
    assert all(np.array_equal(a, b) for a, b in zip(_steps(restored, [7, 8, 9], 6), want))
    assert twin.trim(2) == 7 and session.length == 9   # the fork rewinds alone
    from safetensors.numpy import load_file

    tensors = load_file(path)
    assert sorted(tensors) == ["layer.0.keys", "layer.1.keys"]
    assert tensors["layer.0.keys"].shape == (1, 1, 6, 64)


def test_describe_and_cache_inspect_report_bytes_per_token(deepseek_v2, tmp_path, capsys):
    session = deepseek_v2.session(capacity=64)
    session.step(ids([[5, 9, 17]]), range(3))
    view = session.describe()
    assert [la["bytes_per_token"] for la in view["layers"]] == [LATENT_BYTES] * 2
    assert view["bytes_per_token"] == 2 * LATENT_BYTES       # vs 2 * FULL_KV_BYTES decompressed
    assert LATENT_BYTES / FULL_KV_BYTES == pytest.approx(256 / 704)
    assert all(la["values_in_keys"] for la in view["layers"])
    path = tmp_path / "c.safetensors"
    session.save(path)
    code, out, _ = run_cli(capsys, "cache", "inspect", "--json", path)
    assert code == 0
    inspected = json.loads(out)
    assert inspected["bytes_per_token"] == 2 * LATENT_BYTES
    assert [la["values_in_keys"] for la in inspected["layers"]] == [True, True]
    code, out, _ = run_cli(capsys, "cache", "inspect", path)
    assert f"{2 * LATENT_BYTES} bytes per token" in out and "keys only (latent)" in out


def test_cache_diff_compares_latent_layers(deepseek_v2, tmp_path, capsys):
    """cache diff reads a latent layer's values back from its keys."""
    paths = []
    for name, prompt in (("a", [5, 9, 17, 3, 2]), ("b", [5, 9, 17, 4, 2])):
        session = deepseek_v2.session(capacity=64)
        session.step(ids([prompt]), range(5))
        paths.append(tmp_path / f"{name}.safetensors")
        session.save(paths[-1])
    code, out, _ = run_cli(capsys, "cache", "diff", paths[0], paths[0], "--json")
    assert code == 0 and json.loads(out)["same"]
    code, out, _ = run_cli(capsys, "cache", "diff", paths[0], paths[1], "--json")
    doc = json.loads(out)
    assert code == 1 and doc["first_divergence"] == 3
    assert all(r["values_max_rel"] > 0 for la in doc["layers"] for r in la["ranges"])


def test_generate_rewinds_a_step_fed_ahead_on_a_latent_cache(deepseek_v2):
    """Stopping on a token trims the step generate fed ahead: the keys-only store rewinds
    like any other, and the session continues as if the step never ran."""
    import mlx.core as mx

    from mlxgraph.generation.loop import generate

    greedy = lambda logits: mx.argmax(logits, axis=-1).astype(mx.int32)  # noqa: E731
    out = list(generate(deepseek_v2.session(capacity=64), [1, 2, 3], greedy, max_tokens=10))
    session = deepseek_v2.session(capacity=64)
    got = list(generate(session, [1, 2, 3], greedy, max_tokens=10, stop_ids=[out[4]]))
    assert got == out[:out.index(out[4]) + 1] and session.length == 3 + len(got) - 1
    fresh = deepseek_v2.session(capacity=64)
    fresh.step(ids([[1, 2, 3, *got[:-1]]]), range(session.length))
    a, b = (np.array(s.step(ids([got[-1]]), [s.length]))[0, -1] for s in (session, fresh))
    assert rel_err(a, b) < 1e-5


def test_a_quantized_latent_cache_stays_close(deepseek_v2):
    exact, q8 = deepseek_v2.session(capacity=64), deepseek_v2.session(capacity=64, kv_bits=8,
                                                                     kv_group_size=32)
    prompt = ids([[5, 9, 17, 3, 200, 41, 8, 8]])
    a, b = (np.array(s.step(prompt, range(8)))[0] for s in (exact, q8))
    assert rel_err(b, a) < 3e-2
    assert q8.describe()["layers"][0]["bytes_per_token"] == (64 * 8 // 32 + 2 * 64 // 32) * 4


def _latent_graph(v_is_k=True, v_head_dim=1, out_width=1) -> bytes:
    """tokens -> a 2-wide embedding -> one latent-attention layer of one head whose key is
    the embedding row and whose value is its first ``v_head_dim`` columns."""
    from hostile_graphs import _finish, _start

    w, _, tok, table = _start()
    pos = w.add_tensor("positions", "int32", ("T",))
    w.add_input("positions", pos)
    x = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=x)
    q = w.add_tensor("q", "float32", (1, 1, "T", 2))
    w.add_node("Unsqueeze", x=x, out=q, axis=1)
    v = q
    if not v_is_k:
        v = w.add_tensor("v", "float32", (1, 1, "T", 2))
        w.add_node("Neg", x=q, out=v)
    att = w.add_tensor("att", "float32", (1, 1, "T", out_width))
    w.add_node("UpdateAndAttend", q=q, k=q, v=v, position=pos, out=att, layer_id=0, scale=1.0)
    out = w.add_tensor("y", "float32", (1, "T", out_width))
    w.add_node("Squeeze", x=att, out=out, axes=[1])
    w.metadata.layers = (LayerCacheInfo(0, 1, 2, v_head_dim, 0, values_in_keys=True),)
    return _finish(w, out)


@pytest.mark.parametrize("kwargs,reason", [
    (dict(v_is_k=False), "v must be the k slot"),
    (dict(v_head_dim=3, out_width=3), "v_head_dim 3 is wider than the keys' head_dim 2"),
    (dict(out_width=2), "the output's last axis is 2, its values are v_head_dim 1 wide"),
])
def test_the_verifier_holds_a_latent_layer_to_its_geometry(kwargs, reason):
    with pytest.raises(GraphFormatError) as e:
        verify_buffer(_latent_graph(**kwargs))
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_a_latent_layer_attends_over_its_keys_and_reads_values_from_them(tmp_path):
    (tmp_path / "g.mlxg").write_bytes(_latent_graph())
    session = mlxgraph.load(tmp_path / "g.mlxg").session(capacity=8)
    got = np.array(session.step(ids([[1, 3, 2]]), range(3)))[0, :, 0]
    table = np.arange(8, dtype=np.float64).reshape(4, 2)[[1, 3, 2]]
    want = []
    for t in range(3):
        scores = table[: t + 1] @ table[t]
        p = np.exp(scores - scores.max())
        want.append((p / p.sum()) @ table[: t + 1, 0])
    assert np.allclose(got, want, rtol=1e-5)
    assert session.describe()["layers"][0]["bytes"] < 2 * 8 * 2 * 4  # keys only


def test_a_reader_of_format_1_2_refuses_a_latent_file_by_name(tmp_path):
    from test_schema_evolution import _OLD_READER, HISTORY

    previous = next(p for p in HISTORY if p.stem == "1.2")
    (tmp_path / "g.mlxg").write_bytes(_latent_graph())
    r = subprocess.run([sys.executable, "-c", _OLD_READER, str(previous),
                        str(tmp_path / "g.mlxg")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "LayerCache field" in r.stdout and "written by a newer mlxgraph" in r.stdout, r.stdout
    assert r.stdout.count("\n") == 1


def test_mla_modules_left_unchecked_are_still_refused(tmp_path):
    """The absorbed form is installed for the checked classes only; a copy of the layer in
    another modeling file (DeepSeek-V3.2's, here a subclass) is refused before tracing, in
    one line."""
    from mlxgraph.exporter.model_support import AdapterError

    config = make_config("deepseek_v2", **FAMILIES["deepseek_v2"])
    model = build_model(config)
    attn = model.model.layers[0].self_attn
    attn.__class__ = type("OtherMLA", (type(attn),), {})
    with pytest.raises(AdapterError, match=r"model\.layers\.0\.self_attn \(OtherMLA\): "
                                           r"multi-head latent attention \(MLA\) is not "
                                           r"supported"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)
