"""Models the export cannot run as transformers runs them are refused before tracing, in
one line naming the module path, its class and the missing feature (or the config
setting and why); torch.export failures name the module being traced; the CLI exits 1
without a traceback. Every entry of exporter/model_support.py's lists is exercised here.
"""

import pytest
import torch
from tool_helpers import run_cli
from torch import nn

from mlxgraph.exporter import AdapterError, TraceError, export, pipeline
from mlxgraph.exporter.adapter import DecoderAdapter
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.exporter.model_support import UNSUPPORTED_MODULES, UNSUPPORTED_SETTINGS, check_model

_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256)
_LLAMA4 = dict(
    _SMALL,
    num_hidden_layers=4,
    intermediate_size=64,
    intermediate_size_mlp=128,
    head_dim=16,
    attention_chunk_size=8,
    num_local_experts=2,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,
    no_rope_layers=[1, 1, 1, 0],
    attn_temperature_tuning=False,
)
# model type -> (config overrides, the expected line).
REFUSED = {
    "zamba": (
        dict(num_hidden_layers=3, hidden_size=64, vocab_size=256, intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=4),
        "model.layers.0.mamba (ZambaMambaMixer): state-space layers are not supported",
    ),
    "olmo_hybrid": (
        dict(_SMALL, layer_types=["linear_attention", "full_attention"]),
        "model.layers.0 (OlmoHybridLinearAttentionDecoderLayer): linear / gated-delta attention "
        "layers are not supported",
    ),
    # DeepSeek-V3.2's MLA adds a sparse indexer: not one of the checked classes
    # (deepseek_v2 / v3, glm4_moe_lite and minicpm3 export: tests/test_latent_attention.py).
    "deepseek_v32": (
        dict(
            _SMALL,
            index_n_heads=2,
            index_head_dim=16,
            index_topk=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            q_lora_rank=16,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
        "model.layers.0.self_attn (DeepseekV32Attention): multi-head latent attention (MLA) is "
        "not "
        "supported",
    ),
    "llama4_text": (
        _LLAMA4,
        "model.rotary_emb (Llama4TextRotaryEmbedding): complex-number RoPE "
        "(torch.polar / view_as_complex) is not supported",
    ),
}


@pytest.fixture
def no_tracing(monkeypatch):
    """Fail the test if the export gets as far as torch.export."""

    def traced(*_args, **_kwargs):
        raise AssertionError("the model was traced before being refused")

    monkeypatch.setattr(pipeline, "trace", traced)


@pytest.mark.parametrize("model_type", list(REFUSED))
def test_unsupported_layers_are_refused_before_tracing_in_one_line(
    model_type, tmp_path, no_tracing
):
    overrides, line = REFUSED[model_type]
    model = build_model(make_config(model_type, **overrides))
    with pytest.raises(AdapterError) as e:
        export(model, tmp_path / "m.mlxg", max_seq_len=16)
    assert str(e.value) == f"{model_type}: {line}"   # the model type, then where and why
    assert (e.value.model_type, e.value.reason) == (model_type, line)
    assert not (tmp_path / "m.mlxg").exists()


def test_every_module_rule_is_exercised():
    """Each UNSUPPORTED_MODULES entry refuses at least one real module above (the bare
    Conv1d rule: a decoder with a sequence convolution inside an MLP)."""
    features = {line.split(": ", 1)[1] for _, line in REFUSED.values()}
    model = build_model(make_config("llama", **_SMALL))
    model.model.layers[1].mlp = nn.Sequential(nn.Conv1d(64, 64, 3, padding=2))
    with pytest.raises(AdapterError) as e:
        check_model(model)
    assert str(e.value) == (
        "model.layers.1.mlp.0 (Conv1d): convolutions over the sequence (a recurrent state) "
        "are not supported"
    )
    features.add(str(e.value).split(": ", 1)[1])
    assert {rule.feature for rule in UNSUPPORTED_MODULES} == features


# setting name -> (model type, overrides that switch it on, the expected reason).
SETTINGS = {
    "layer_types": (
        "llama",
        {"num_hidden_layers": 2, "layer_types": ["full_attention", "window_attention"]},
        "layer type 'window_attention' is not supported (only full_attention, sliding_attention, "
        "chunked_attention, conv, mamba, linear_attention, hybrid)",
    ),
    "attention_chunk_size": (
        "llama4_text",
        {**_LLAMA4, "layer_types": ["full_attention"] * 4},
        "attention_chunk_size is set but no layer is 'chunked_attention': which layers chunk "
        "is unknown",
    ),
    "attn_temperature_tuning": (
        "llama4_text",
        {**_LLAMA4, "attn_temperature_tuning": True},
        "attention temperature tuning (layer 3 and other NoPE layers) reads positions from "
        "the KV cache, which the exported graph does not have",
    ),
    "rope_parameters": (
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
        "rope_type 'dynamic' rescales RoPE by the sequence length seen, which a traced graph fixes",
    ),
    "scale_attn_by_inverse_layer_idx": (
        "gpt2",
        {
            "n_layer": 2,
            "n_embd": 64,
            "n_head": 4,
            "vocab_size": 256,
            "scale_attn_by_inverse_layer_idx": True,
        },
        "scaling attention by 1 / (layer + 1) is not supported",
    ),
    "use_bidirectional_attention": (
        "gemma3_text",
        {**_SMALL, "head_dim": 16, "use_bidirectional_attention": True},
        "bidirectional attention is not supported",
    ),
    "alibi": (
        "falcon",
        {
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "vocab_size": 256,
            "alibi": True,
        },
        "ALiBi position biases rounded to bfloat16 (Falcon's) are not supported",
    ),
}


# What switches a setting off when leaving it out does not (the model's default is on).
SETTING_OFF = {
    "attention_chunk_size": {"layer_types": None},  # llama4's own layer types chunk its RoPE layers
    "attn_temperature_tuning": {"attn_temperature_tuning": False},
}


def test_every_setting_rule_has_a_case():
    assert [rule.name for rule in UNSUPPORTED_SETTINGS] == list(SETTINGS)


@pytest.mark.parametrize("rule", UNSUPPORTED_SETTINGS, ids=[r.name for r in UNSUPPORTED_SETTINGS])
def test_each_unsupported_setting_is_named_and_only_when_set(rule):
    model_type, overrides, reason = SETTINGS[rule.name]
    assert rule.refuses(make_config(model_type, **overrides)) == reason
    off = {
        k: v
        for k, v in overrides.items()
        if k != rule.name and k in make_config(model_type).to_dict()
    }
    off.update(SETTING_OFF.get(rule.name, {}))
    assert rule.refuses(make_config(model_type, **off)) is None


def test_a_setting_refusal_stops_the_export_before_tracing(tmp_path, no_tracing):
    model = build_model(
        make_config(
            "llama",
            **_SMALL,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        )
    )
    with pytest.raises(AdapterError, match=r"^llama: config.rope_parameters: rope_type 'dynamic'"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)


def test_chunked_layers_are_never_run_as_full_attention():
    """llama4 text (dense and MoE layers, chunk 8 < 21 tokens) run eagerly through the
    adapter, in steps of 5, 8 and 8 tokens, matches transformers; the same run with the
    chunk forgotten does not."""
    tokens = torch.randint(4, 256, (1, 21), generator=torch.Generator().manual_seed(7))
    hf = build_model(make_config("llama4_text", **_LLAMA4))
    hf.set_attn_implementation("eager")
    with torch.no_grad():
        want = hf(tokens, use_cache=False).logits

    def adapted(forget_chunks: bool):
        adapter = DecoderAdapter(build_model(make_config("llama4_text", **_LLAMA4)))
        assert adapter.record.chunks == {0: 8, 1: 8, 2: 8}
        if forget_chunks:
            adapter.record.chunks = {}
        with torch.no_grad():
            steps = [
                adapter(tokens[:, s:e].int(), torch.arange(s, e, dtype=torch.int32))
                for s, e in ((0, 5), (5, 13), (13, 21))
            ]
        assert [lc.attention_chunk for lc in adapter.layer_infos()] == (
            [0] * 4 if forget_chunks else [8, 8, 8, 0]
        )
        return torch.cat(steps, dim=1)

    scale = want.abs().max()
    assert (adapted(False) - want).abs().max() / scale < 1e-5
    assert (adapted(True) - want).abs().max() / scale > 1e-2


class DataDependentMLP(nn.Module):
    """An MLP that branches on its input's values: torch.export cannot trace it."""

    def __init__(self, mlp):
        super().__init__()
        self.inner = mlp

    def forward(self, x):
        if x.sum() > 0:
            return self.inner(x)
        return -self.inner(x)


def test_trace_failure_names_the_module_being_traced(tmp_path):
    model = build_model(make_config("llama", **_SMALL))
    model.model.layers[1].mlp = DataDependentMLP(model.model.layers[1].mlp)
    with pytest.raises(
        TraceError,
        match=r"^llama: torch.export failed in model.layers.1.mlp \(DataDependentMLP\): "
        r"control flow or a shape depends on tensor values \(data-dependent\), which one graph "
        r"cannot follow \(GuardOnDataDependentSymNode: "
    ) as e:
        export(model, tmp_path / "m.mlxg", max_seq_len=16)
    assert "\n" not in str(e.value)


def test_cli_refusal_is_one_line_and_exit_1(tmp_path, capsys):
    overrides, line = REFUSED["zamba"]
    folder = tmp_path / "zamba"
    build_model(make_config("zamba", **overrides)).save_pretrained(folder)
    capsys.readouterr()
    code, out, err = run_cli(capsys, "export", folder, "-o", tmp_path / "m.mlxg")
    assert code == 1 and out == ""
    lines = [
        ln for ln in err.splitlines() if not ln.startswith("[")
    ]  # progress lines start with [time]
    assert lines == [f"mlxgraph: export: {folder}: cannot export: zamba: {line}"]
    assert "Traceback" not in err
