"""--quantize covers every Linear-like weight (issue 31): GPT-2's Conv1D (an addmm of a
[in, out] weight, stored transposed as a Linear's) and a mixture-of-experts layer's 3-D
expert weights (picked per token by id: a QuantizedEmbedding of their flattened rows, then
a Reshape); every weight that stays float is listed with why. Each q8 graph decodes as
transformers does with the graph's dequantized weights (1e-4 of the logits' scale), and
within Q8_TOL of its float graph."""

import numpy as np
import pytest
import torch
from parity_helpers import hf_greedy_reference, ids, mlxgraph_parity_errors, rel_err
from test_quantized import unpack

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.exporter.quantize import QuantizeRecipe
from mlxgraph.schema.reader import open_graph

PROMPT, DECODE, CHUNK = 10, 6, 4
# q8 in groups of 32 against the float graph's prefill, relative to the logits' scale:
# measured 1.4e-2 on both models (random weights drawn at 0.05); 3e-2 leaves room. The
# exact claim is the dequantized model's (1e-4).
Q8_TOL = 3e-2
_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, head_dim=16,
              initializer_range=0.05)
CONFIGS = {"gpt2": dict(_SMALL),
           "qwen3_moe": dict(_SMALL, num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=64)}


def _config(arch):
    return make_config(arch, **CONFIGS[arch])


@pytest.fixture(scope="module", params=list(CONFIGS))
def graphs(request, tmp_path_factory):
    """(arch, q8 export stats, q8 path, float path)."""
    arch, folder = request.param, tmp_path_factory.mktemp("coverage")
    export(build_model(_config(arch)), folder / "float.mlxg", max_seq_len=32)
    stats = export(build_model(_config(arch)), folder / "q8.mlxg", max_seq_len=32,
                   quantize=QuantizeRecipe("q8", 32))
    return arch, stats, folder / "q8.mlxg", folder / "float.mlxg"


def dequantized_model(path, arch):
    """The tiny model holding the graph's dequantized weights, found by the packed
    constants' names (a Conv1D's transposed back, an expert table's rows reshaped)."""
    model, g = build_model(_config(arch)), open_graph(path)
    arrays = {c.tensor: g.constant_array(i) for i, c in enumerate(g.constants)}
    for node in g.nodes:
        if not node.op.startswith("Quantized"):
            continue
        f = node.fields
        weight = unpack(arrays[f["weight"]], arrays[f["scales"]], arrays[f["biases"]],
                        f["bits"], f["group_size"])
        param = model.get_parameter(g.tensors[f["weight"]].name.removesuffix(".q8"))
        weight = torch.tensor(weight, dtype=torch.float32)
        if arch == "gpt2" and "transformer.h." in g.tensors[f["weight"]].name:
            weight = weight.T  # Conv1D stores [in, out]
        with torch.no_grad():
            param.copy_(weight.reshape(param.shape))
    return model


def test_every_product_weight_is_quantized(graphs):
    arch, stats, path, _ = graphs
    g = open_graph(path)
    ops = [n.op for n in g.nodes]
    assert "LinearNode" not in ops and "AddmmNode" not in ops
    # No float constant of two or more axes is left (the experts' Matmuls read gathered rows).
    assert stats["quantization"]["kept_float"] == []
    assert stats["quantization"]["nodes"]["float"] == 0
    if arch == "gpt2":
        # 4 Conv1D per layer and the head; token and position tables.
        assert ops.count("QuantizedLinearNode") == 9 and ops.count("QuantizedEmbeddingNode") == 2
    else:
        # gate_up and down of the experts per layer, and the token table.
        assert ops.count("QuantizedEmbeddingNode") == 5
        assert "EmbeddingNode" not in ops


def test_q8_graph_decodes_as_the_dequantized_model(graphs):
    arch, _, path, _ = graphs
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    reference = hf_greedy_reference(dequantized_model(path, arch), prompt, DECODE)
    errors = mlxgraph_parity_errors(path, prompt.numpy(), reference, CHUNK)
    assert max(errors["prefill"], errors["decode"], errors["chunked"], errors["batched"]) < 1e-4, \
        errors
    assert errors["tokens"] == reference[2]


def test_q8_graph_is_close_to_the_float_graph(graphs):
    _, _, path, float_path = graphs
    prompt = np.random.default_rng(3).integers(4, 256, (1, PROMPT))
    got, want = (np.array(mlxgraph.load(p).session(capacity=32).step(ids(prompt),
                                                                      range(PROMPT)))
                 for p in (path, float_path))
    err = rel_err(got, want)
    print("q8 vs float", err)
    assert 0 < err < Q8_TOL


@pytest.mark.parametrize("arch, recipe, listed", [
    ("qwen3_moe", QuantizeRecipe("q8", 64),
     ["model.layers.0.mlp.experts.down_proj (its last axis 32 is not a multiple of 64)"]),
    ("gpt2", QuantizeRecipe("q8", 32, lm_head="float", exclude=("transformer.h.1.*",)),
     ["lm_head.weight (--quantize-lm-head float)",
      "transformer.h.1.attn.c_attn.weight (--quantize-exclude transformer.h.1.*)"]),
])
def test_weights_left_float_are_listed_with_why(arch, recipe, listed, tmp_path):
    overrides = {"qwen3_moe": dict(moe_intermediate_size=32)}.get(arch, {})
    config = make_config(arch, **dict(CONFIGS[arch], **overrides))
    stats = export(build_model(config), tmp_path / "g.mlxg", max_seq_len=32, quantize=recipe)
    kept = stats["quantization"]["kept_float"]
    assert set(listed) <= set(kept), kept
    # One line per float node's weight (none shared here), nothing quantized listed.
    assert len(kept) == stats["quantization"]["nodes"]["float"]
