"""One refusal shape for every model the export cannot export exactly (issues 31 and 32).

Whatever the reason (not a causal decoder, a model type transformers does not know, weights
quantized by MLX in a way the format cannot store, attention outside transformers'
AttentionInterface, latent attention, data-dependent code, ops without a lowering), the
export raises an
UnsupportedModelError whose message is one line, ``<model type>: <where>: <why>``, and the
command line prints ``mlxgraph: export: MODEL: cannot export: <that line>`` and exits 1,
with nothing else on stderr but its progress lines. Real transformers models from tiny
configs with seeded random weights (transformers' own classes, HF_HUB_OFFLINE=1).
"""

import json
import re

import pytest
from tool_helpers import run_cli
from torch import nn

from mlxgraph.exporter import AdapterError, UnsupportedModelError, export
from mlxgraph.exporter.builtins import build_model, make_config

_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)

# name -> (model type, config overrides, the reason's pattern (re.fullmatch after the type)).
# Each is a different path to a refusal: the module walk before tracing, the adapter while
# tracing, torch.export's own failure, the lowering's unsupported ops.
REFUSED_MODELS = {
    "rwkv": ("rwkv", dict(hidden_size=64, num_hidden_layers=2, attention_hidden_size=64,
                          intermediate_size=128, vocab_size=256, context_length=64),
             r"RwkvForCausalLM: its attention is not computed through transformers' "
             r"AttentionInterface \(the implementation cannot be switched\), so no layer would "
             r"keep a KV cache"),
    # (MLA of a class not checked against transformers: DeepSeek-V3.2's sparse indexer;
    # deepseek_v2/v3, glm4_moe_lite, minicpm3, longcat_flash export: test_latent_attention.)
    "deepseek_v32": ("deepseek_v32", dict(
        _SMALL, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        first_k_dense_replace=1, n_group=1, topk_group=1, index_n_heads=2, index_head_dim=16,
        index_topk=8),
        r"model\.layers\.0\.self_attn \(DeepseekV32Attention\): multi-head latent attention "
        r"\(MLA\) is not supported"),
    # Dory's earlier loops read the last loop's cache without writing their own
    # (exporter/cache_probe.py: found by running its own cached forward once)
    "dory last_loop": ("dory", dict(_SMALL, num_hidden_layers=3, n_input_layers=1,
                                    n_output_layers=1, head_dim=16,
                                    recurrent_kv_cache_mode="last_loop"),
                       r"DoryForCausalLM: cache layer 3 \(DoryPastReader\) does not keep the "
                       r"keys written to it \(a view of another layer's cache\), where the graph "
                       r"gives each call a cache of its own"),
    # input and output layers overlapping: one layer's two calls write one cache
    "dory shared cache": ("dory", dict(_SMALL, head_dim=16),
                          r"DoryForCausalLM: cache layer 0 is written 2 times in one forward "
                          r"\(its calls share a cache\), where the graph gives each call its own"),
    "bert": ("bert", dict(_SMALL),
             r"bert\.encoder\.layer\.0\.attention\.self \(BertSelfAttention\): attention in both "
             r"directions \(is_causal=False\): not a causal decoder"),
}

# name -> (config.json, the line after "cannot export: "): refused from config.json alone,
# before any weight is read (these folders hold no weights at all).
REFUSED_FOLDERS = {
    "t5": ({"model_type": "t5", "is_encoder_decoder": True, "d_model": 64},
           "t5: not a causal decoder: an encoder-decoder model without a *ForCausalLM class in "
           "transformers"),
    "unknown type": ({"model_type": "no_such_architecture", "auto_map": {"AutoModel": "x.Y"}},
                     "no_such_architecture: model type unknown to transformers {version} (code "
                     "shipped with a model, auto_map, is not run)"),
    "no model type": ({"hidden_size": 64}, "config.json names no model_type, so the "
                      "architecture is unknown"),
    "mlx 3-bit": ({"model_type": "llama", "quantization": {"group_size": 64, "bits": 3},
                   "quantization_config": {"group_size": 64, "bits": 3}},
                  "llama: MLX-quantized weights: 3 bits: the graph stores 4 or 8"),
}


def _one_refusal(capsys, model, tmp_path) -> str:
    """The CLI's one line after ``cannot export: `` (asserting exit 1 and nothing else)."""
    capsys.readouterr()   # what building the folder printed
    code, out, err = run_cli(capsys, "export", model, "-o", tmp_path / "m.mlxg",
                             "--max-seq-len", "16")
    lines = [ln for ln in err.splitlines() if not re.match(r"\[ *\d+\.\ds\] ", ln)]
    assert (code, out, len(lines)) == (1, "", 1), err
    prefix = f"mlxgraph: export: {model}: cannot export: "
    assert lines[0].startswith(prefix), lines[0]
    assert not (tmp_path / "m.mlxg").exists()
    return lines[0][len(prefix):]


@pytest.mark.parametrize("name", list(REFUSED_MODELS))
def test_refused_models_say_why_in_one_line(name, tmp_path, capsys):
    model_type, overrides, reason = REFUSED_MODELS[name]
    config = make_config(model_type, **overrides)
    with pytest.raises(UnsupportedModelError) as e:
        export(build_model(config), tmp_path / "m.mlxg", max_seq_len=16)
    assert e.value.model_type == model_type
    assert re.fullmatch(reason, e.value.reason), e.value.reason
    assert str(e.value) == f"{model_type}: {e.value.reason}"
    folder = tmp_path / name
    build_model(config).save_pretrained(folder)
    assert _one_refusal(capsys, folder, tmp_path) == str(e.value)


@pytest.mark.parametrize("name", list(REFUSED_FOLDERS))
def test_folders_are_refused_from_their_config_alone(name, tmp_path, capsys):
    from transformers import __version__

    config, line = REFUSED_FOLDERS[name]
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert _one_refusal(capsys, folder, tmp_path) == line.format(version=__version__)


def test_quantization_transformers_cannot_load_is_a_refusal(tmp_path, capsys):
    """A quant_method transformers knows but cannot load here: exit 1, its first line."""
    folder = tmp_path / "model"
    build_model(make_config("llama", **_SMALL)).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (folder / "config.json").write_text(json.dumps(config))
    line = _one_refusal(capsys, folder, tmp_path)
    assert line.startswith("llama: weights quantized by 'bitsandbytes' cannot be loaded: ")


def test_a_folder_transformers_cannot_read_is_bad_input(tmp_path, capsys):
    """Not a refusal of the model but a bad file: exit 2, one line."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    code, _, err = run_cli(capsys, "export", folder, "-o", tmp_path / "m.mlxg")
    (line,) = [ln for ln in err.splitlines() if not ln.startswith("[")]
    assert code == 2
    assert line.startswith(f"mlxgraph: export: {folder}/config.json: cannot read it: ")


class OwnAttention(nn.Module):
    """Attention a layer computes itself (here: none at all), not through the interface."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states, None


def test_a_model_whose_layers_call_no_attention_is_refused(tmp_path):
    """The implementation switches (the class uses the interface), yet no layer calls it."""
    model = build_model(make_config("llama", **_SMALL))
    for layer in model.model.layers:
        layer.self_attn = OwnAttention()
    with pytest.raises(AdapterError, match=r"^llama: LlamaForCausalLM: no attention layer called "
                                           r"the mlxgraph attention implementation"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)


def test_positions_counted_from_the_step_length_are_refused(tmp_path, monkeypatch):
    """Without the hook that gives BART's positional embedding the step's positions, its
    graph would count them from 0 at every step: found in the traced graph, refused."""
    import mlxgraph.exporter.adapter as adapter

    monkeypatch.setattr(adapter, "install_position_hooks", lambda model, positions: [])
    model = build_model(make_config("bart", **_SMALL, decoder_layers=2))
    with pytest.raises(AdapterError, match=r"^bart: BartForCausalLM: its positions are counted "
                                           r"from the step's own length"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)


# Without exporter/static_experts.py's static shapes, the two other refusal paths: an op
# without a lowering (JetMoE's expert_size.tolist()) and data-dependent control flow (DBRX's
# loop over the experts hit), each in one line.
UNPATCHED = {
    "jetmoe": ("jetmoe", dict(_SMALL, num_local_experts=4, num_experts_per_tok=2,
                              kv_channels=16),
               r"unsupported op aten\.\S+ \(no lowering\) at File \".*modeling_jetmoe\.py\", "
               r"line \d+, in \w+ \(module model\.layers\.0\.\S+\); \d+ more problem\(s\), "
               r"other ops: .*"),
    # (d_model too: DBRX copies it into ffn_config before hidden_size is mapped onto it.)
    "dbrx": ("dbrx", dict(_SMALL, d_model=64, attn_config={"kv_n_heads": 2, "clip_qkv": 8.0,
                                                         "rope_theta": 10000.0},
                          ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4,
                                      "moe_top_k": 2}),
             r"torch\.export failed in transformer\.blocks\.0\.ffn\.experts \(DbrxExperts\): "
             r"control flow or a shape depends on tensor values \(data-dependent\), which one "
             r"graph cannot follow \(GuardOnDataDependentSymNode: .*\)"),
}


@pytest.mark.parametrize("name", list(UNPATCHED))
def test_refusals_after_tracing_are_one_line(name, tmp_path, monkeypatch):
    import mlxgraph.exporter.static_experts as static_experts

    monkeypatch.setattr(static_experts, "STATIC_METHODS", {})
    model_type, overrides, reason = UNPATCHED[name]
    with pytest.raises(UnsupportedModelError) as e:
        export(build_model(make_config(model_type, **overrides)), tmp_path / "m.mlxg",
               max_seq_len=16)
    assert re.fullmatch(reason, e.value.reason), e.value.reason
    assert "\n" not in str(e.value)


def test_another_implementation_of_a_routed_attention_class_is_refused(tmp_path):
    """GPT-Neo's attention code is routed to the op by its exact class; a subclass (its
    flash-attention class, here a stand-in) runs other code: refused, not routed."""
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention

    model = build_model(make_config("gpt_neo", **_SMALL, attention_types=[[["global"], 2]]))
    model.transformer.h[1].attn.attention.__class__ = type("GPTNeoOther", (GPTNeoSelfAttention,),
                                                           {})
    with pytest.raises(AdapterError, match=r"^gpt_neo: transformer\.h\.1\.attn\.attention "
                                           r"\(GPTNeoOther\): an attention implementation other"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)
