"""Architectures issue 31 made exact: mixture-of-experts routers (top-k with gather and
scatter, grouped and limited top-k, shared experts, phimoe's sparsemixer), and the
elementwise ops of apertus (expm1, log1p), ministral3 (floor) and gemma3n (repeat, copy,
slice_scatter, erfinv, var), models attending twice with one layer in a forward
(diffllama, hrm_text, dory: a KV cache per call), BART's decoders, which count
positions from the cache's length (bart, blenderbot, blenderbot-small, marian, mbart), MoE
code with data-dependent group sizes (jetmoe, dbrx: static shapes), and attention a model
computes in its own code (gpt_neo, xglm: routed to the op).

Tiny random configs (transformers' own classes, seeded weights), exported and run against
transformers as configured by default with its own DynamicCache: a prefill, the same
prompt in chunks, greedy decode steps fed with our own choices, and the prompt's row
stepped in batches beside two other sessions; each within 1e-4 of the logits' scale and
the same greedy tokens.
"""

import pytest
import torch
from parity_helpers import hf_greedy_reference, mlxgraph_parity_errors

from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config

PROMPT, DECODE, CHUNK, MAX_T = 12, 8, 5, 32
TOL = 1e-4
_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
_ROUTED = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               first_k_dense_replace=1, head_dim=16)
# model type -> config overrides
CONFIGS = {
    # sigmoid scores, grouped and limited top-k (scatter of the chosen groups), shared experts
    "glm4_moe": dict(_SMALL, **_ROUTED, n_group=4, topk_group=2, n_shared_experts=1),
    "dots1": dict(_SMALL, **_ROUTED, n_group=4, topk_group=2, n_shared_experts=1),
    # top-k then gather of the scores with a correction bias
    "ernie4_5_moe": dict(_SMALL, moe_num_experts=4, moe_k=2, moe_intermediate_size=32,
                         moe_num_shared_experts=1),
    "minimax_m2": dict(_SMALL, num_local_experts=4, num_experts_per_tok=2, head_dim=16),
    "afmoe": dict(_SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  head_dim=16, num_dense_layers=1, num_shared_experts=1),
    # sparsemixer: clamp by tensor bounds, scatter of -inf, gather
    "phimoe": dict(_SMALL, num_local_experts=4, num_experts_per_tok=2),
    # xIELU activation: expm1 and log1p (format 1.3)
    "apertus": dict(_SMALL),
    # two attention calls per layer (a cache each)
    "diffllama": dict(_SMALL),
    # layers reused in cycles: 12 attention calls of 4 modules. (Weights drawn narrower:
    # at the tiny models' 0.25 the chained cycles amplify float32 rounding, and transformers'
    # own eager and sdpa forwards differ by 1.4e-4.)
    "hrm_text": dict(_SMALL, head_dim=16, H_cycles=2, L_cycles=2, initializer_range=0.1),
    # experts grouped by data-dependent sizes, computed with static shapes
    # (exporter/static_experts.py): JetMoE's MoE and mixture of attention heads, DBRX's
    # experts loop after a p-norm of the top-k weights (vector_norm)
    "jetmoe": dict(_SMALL, num_local_experts=4, num_experts_per_tok=2, kv_channels=16),
    "dbrx": dict(_SMALL, d_model=64, attn_config={"kv_n_heads": 2, "clip_qkv": 8.0,
                                                  "rope_theta": 10000.0},
                 ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2,
                             "moe_normalize_expert_weights": 2.0}),
    # attention in the model's own code routed to the op (exporter/own_attention.py):
    # unscaled, a global and a local layer (a window of 4 the prompt passes); its mask,
    # built for the code replaced, is dead code
    "gpt_neo": dict(_SMALL, attention_types=[[["global", "local"], 1]], window_size=4),
    # XGLM's whole attention forward replaced (queries scaled before the product)
    "xglm": dict(_SMALL, d_model=64, attention_heads=4, ffn_dim=128),
    # floor in the attention's position scaling
    "ministral3": dict(_SMALL, head_dim=16),
    # AltUp and Laurel: repeat, copy, slice_scatter; activation sparsity on the first
    # layer: erfinv (format 1.3) and std
    # BART's decoders count positions from the cache's length (exporter/position_hooks.py)
    **{t: dict(_SMALL, decoder_layers=2) for t in ("bart", "blenderbot", "blenderbot-small",
                                                   "marian", "mbart")},
    # the same with a sinusoidal table (its own module and signature)
    "pegasus": dict(_SMALL, decoder_layers=2, d_model=64, decoder_attention_heads=4,
                    decoder_ffn_dim=128),
    # sigmoid router, one route per row with a per-expert RMSNorm (repeat_interleave)
    "ergo": dict(_SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 head_dim=16),
    # a looped middle layer with a cache per loop (its own cache probe says so)
    "dory": dict(_SMALL, num_hidden_layers=3, n_input_layers=1, n_output_layers=1,
                 head_dim=16),
    # per-layer embeddings from a table longer than the vocabulary (the verifier admits a
    # second table of the tokens at least vocab_size long)
    "gemma4_text": dict(_SMALL, head_dim=16, hidden_size_per_layer_input=8,
                        vocab_size_per_layer_input=512),
    "gemma3n_text": dict(_SMALL, head_dim=16, num_kv_shared_layers=0, laurel_rank=8,
                         altup_num_inputs=2, hidden_size_per_layer_input=8,
                         vocab_size_per_layer_input=256, sliding_window=8,
                         layer_types=["sliding_attention", "full_attention"],
                         activation_sparsity_pattern=[0.95, 0.0]),
}


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_exports_and_matches_transformers(model_type, tmp_path):
    config = make_config(model_type, **CONFIGS[model_type])
    path = tmp_path / f"{model_type}.mlxg"
    export(build_model(config), path, max_seq_len=MAX_T)
    model = build_model(config)
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    reference = hf_greedy_reference(model, prompt, DECODE)
    errors = mlxgraph_parity_errors(path, prompt.numpy(), reference, CHUNK)
    print(model_type, errors)
    assert max(errors["prefill"], errors["decode"], errors["chunked"], errors["batched"]) < TOL
    assert errors["tokens"] == reference[2]
