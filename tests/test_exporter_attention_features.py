"""Attention features beyond plain causal attention match Hugging Face: gpt-oss's learned
attention sinks (sliding and full layers, mixture of experts) and Gemma-2's logit
softcapping (attention softcap 50 and final logit softcap 30, its defaults).

Each model is exported, then run as a 17-token prefill, 40 greedy decode steps fed with
our own choices, and a prefill in chunks of 5; logits must agree with the HF model (eager
attention, its own DynamicCache) within 1e-4 of their scale and the greedy tokens must be
identical. Each test also checks that the feature matters on its config (switching it off
in HF moves the logits by far more than the tolerance) and that the greedy tokens are not
one token repeated, so a graph that dropped the feature could not pass.
"""

import numpy as np
import pytest
import torch
from parity_helpers import (
    BATCH_ROW_BOUND,
    batched_vs_solo_error,
    hf_greedy_reference,
    mlxgraph_parity_errors,
    rel_err,
)

from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.schema.reader import open_graph

PROMPT, DECODE, CHUNK, MAX_T = 17, 40, 5, 64
TOL = 1e-4
_SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, vocab_size=256, sliding_window=8)
CASES = {
    # Sliding (window 8 < the context) then full layer; 4 experts, top-2.
    "gpt_oss": dict(
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
    ),
    # Default softcaps: attn_logit_softcapping 50, final_logit_softcapping 30.
    "gemma2": dict(intermediate_size=128),
}


def build(arch: str, feature_off: bool = False):
    """The seeded model; its feature (sinks / attention softcap) switched off on request."""
    overrides = dict(CASES[arch])
    if arch == "gemma2" and feature_off:
        overrides["attn_logit_softcapping"] = None
    model = build_model(make_config(arch, **_SMALL, **overrides), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            if arch == "gpt_oss":
                # Sinks of a trained model's size (HF's init draws them at the 0.02 scale).
                attn.sinks.copy_(
                    -1e4 if feature_off else 2 * torch.randn(attn.sinks.shape, generator=gen)
                )
            else:
                # Scores large enough that tanh(scores / 50) is far from linear.
                attn.q_proj.weight.mul_(16)
    model.set_attn_implementation("eager")  # HF's reference implementation of both features
    return model


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    arch = request.param
    path = tmp_path_factory.mktemp(arch) / f"{arch}.mlxg"
    stats = export(build(arch), path, max_seq_len=MAX_T)
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    return {
        "arch": arch,
        "path": path,
        "stats": stats,
        "prompt": prompt,
        "ref": hf_greedy_reference(build(arch), prompt, DECODE - 1),
    }


def test_matches_hf_over_prefill_decode_and_chunked_prefill(case):
    got = mlxgraph_parity_errors(case["path"], case["prompt"].numpy(), case["ref"], CHUNK)
    print(
        f"{case['arch']}: prefill {got['prefill']:.1e} decode {got['decode']:.1e} "
        f"chunked {got['chunked']:.1e} batched {got['batched']:.1e}"
    )
    assert max(got["prefill"], got["decode"], got["chunked"], got["batched"]) < TOL, got
    tokens = case["ref"][2]
    assert got["tokens"] == tokens
    assert len(set(tokens)) > 10, tokens  # not one token repeated
    import mlxgraph

    solo = batched_vs_solo_error(mlxgraph.load(case["path"]), case["prompt"].numpy(), 4)
    assert solo <= BATCH_ROW_BOUND, solo


@pytest.mark.parametrize("chunk", [1, CHUNK, 512])
def test_generation_yields_hf_greedy_tokens(case, chunk):
    """generation/loop.py's loop (prefill chunks, the last one sampled with last_only, the
    pipelined decode) picks HF's greedy tokens: chunks of 1 (every prompt token a step),
    of 5 (the last chunk a 2-token step) and one 17-token step (longer than the window)."""
    import mlxgraph
    from mlxgraph.generation.loop import generate
    from mlxgraph.generation.sampling import Sampler

    program = mlxgraph.load(case["path"])
    prompt = [int(t) for t in case["prompt"][0]]
    got = list(generate(program.session(capacity=MAX_T), prompt, Sampler(), DECODE,
                        prefill_chunk=chunk))
    assert got == case["ref"][2]


def test_the_feature_matters_on_this_config(case):
    prompt = case["prompt"]
    with torch.no_grad():
        on = build(case["arch"])(prompt, use_cache=False).logits[0].numpy()
        off = build(case["arch"], feature_off=True)(prompt, use_cache=False).logits[0].numpy()
    assert rel_err(off, on) > 100 * TOL


def test_graph_records_the_feature(case):
    attn = [n for n in open_graph(case["path"]).nodes if n.op == "UpdateAndAttendNode"]
    assert len(attn) == 2
    if case["arch"] == "gpt_oss":
        assert all(n.fields["sinks"] is not None and n.fields["softcap"] is None for n in attn)
        assert [lc.sliding_window for lc in open_graph(case["path"]).metadata.layers] == [8, 0]
    else:
        assert all(n.fields["sinks"] is None and n.fields["softcap"] == 50.0 for n in attn)
        # The final logit softcap is plain graph ops: x / 30, tanh, * 30.
        assert case["stats"]["ops"]["Tanh"] == 1
    assert np.isfinite([n.fields["scale"] for n in attn]).all()
