"""A model that ``.view()``s the attention output exports and matches Hugging Face.

transformers' eager attention returns its output contiguous ([B, T, H, D]); some models
rely on it and ``.view()`` the result, which fails on a transposed, non-contiguous tensor.
AFMoE is one (``output.view(*input_shape, -1)`` after the attention call; its layers are
made dense here, so no router is involved): a sliding layer with RoPE and a full layer
without it (NoPE), each output gated by a sigmoid. The oracle is the HF model with eager
attention and its own DynamicCache: a 17-token prefill, 40 greedy decode steps fed with our
own choices, a prefill in chunks of 5 and batched rows, within 1e-4 of the logits' scale.
"""

import torch
from parity_helpers import hf_greedy_reference, mlxgraph_parity_errors

from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config

PROMPT, DECODE, CHUNK, MAX_T = 17, 40, 5, 64
TOL = 1e-4
AFMOE = dict(num_hidden_layers=2, num_dense_layers=2, hidden_size=64, intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
             sliding_window=8, layer_types=["sliding_attention", "full_attention"])


def _afmoe():
    model = build_model(make_config("afmoe", **AFMOE), seed=0)
    model.set_attn_implementation("eager")
    return model


def test_afmoe_views_the_attention_output_and_matches_hf(tmp_path):
    path = tmp_path / "afmoe.mlxg"
    stats = export(_afmoe(), path, max_seq_len=MAX_T)
    assert stats["ops"]["UpdateAndAttend"] == 2 and stats["ops"]["Sigmoid"] == 2
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    reference = hf_greedy_reference(_afmoe(), prompt, DECODE - 1)
    got = mlxgraph_parity_errors(path, prompt.numpy(), reference, CHUNK)
    assert max(got["prefill"], got["decode"], got["chunked"], got["batched"]) < TOL, got
    assert got["tokens"] == reference[2]
    assert len(set(reference[2])) > 10, reference[2]  # not one token repeated
