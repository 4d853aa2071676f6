"""Mixture-of-experts decoders (Mixtral, Qwen3-MoE) export and match Hugging Face.

transformers 5 runs experts with ``grouped_mm`` by default (sort, histc, cumsum: shapes
that depend on the routing). The exporter switches the model to transformers'
``batched_mm`` experts for the trace, so the graph holds a TopK router, Gathers of each
token's expert weights and batched Matmuls. The oracle is the HF model as configured
by default (``grouped_mm``) with its own DynamicCache: a 9-token prefill and 10 greedy
decode steps must agree within 1e-4 of the logits' scale and pick the same tokens.
"""

import mlx.core as mx
import numpy as np
import pytest
import torch
from lowering_helpers import check_runs_like_torch, lower_module
from parity_helpers import (
    BATCH_ROW_BOUND,
    batched_parity_error,
    batched_vs_solo_error,
    hf_greedy_reference,
    ids,
    rel_err,
)
from torch import nn

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.builtins import build_model, make_config

PROMPT, DECODE, MAX_T = 9, 10, 32
TOL = 1e-4
_SMALL = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, num_experts_per_tok=2)
# arch -> (transformers model_type, config overrides): 4 experts, top-2 routing.
MOE_ARCHS = {
    "mixtral": ("mixtral", {"num_local_experts": 4}),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 4, "moe_intermediate_size": 64, "head_dim": 16,
                                "decoder_sparse_step": 1, "norm_topk_prob": True}),
}


def _model(arch: str):
    model_type, overrides = MOE_ARCHS[arch]
    return build_model(make_config(model_type, **_SMALL, **overrides), seed=0)


@pytest.mark.parametrize("arch", list(MOE_ARCHS))
def test_moe_prefill_then_greedy_decode_matches_hf(arch, tmp_path):
    model = _model(arch)
    assert model.config._experts_implementation == "grouped_mm"  # HF's default: the oracle's path
    folder = tmp_path / arch
    model.save_pretrained(folder)
    stats = export(str(folder), tmp_path / f"{arch}.mlxg", max_seq_len=MAX_T)
    assert stats["ops"]["TopK"] == 2 and stats["ops"]["UpdateAndAttend"] == 2

    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(7))
    prefill, decode, tokens = hf_greedy_reference(model, prompt, DECODE)
    session = mlxgraph.load(tmp_path / f"{arch}.mlxg").session(capacity=64)
    logits = np.array(session.step(ids(prompt.numpy()), range(PROMPT)))[0]
    errors = [rel_err(logits, prefill)]
    ours = [int(logits[-1].argmax())]
    for i in range(DECODE):
        # Feed our own greedy choice: identical tokens is part of the claim.
        step = np.array(session.step(ids([ours[-1]]), [PROMPT + i]))[0, -1]
        errors.append(rel_err(step, decode[i]))
        ours.append(int(step.argmax()))
    print(f"{arch}: max rel error {max(errors):.2e}")
    assert max(errors) < TOL, errors
    assert ours == tokens
    # Routed experts per token: rows stepped in batches with other sessions stay exact.
    program = mlxgraph.load(tmp_path / f"{arch}.mlxg")
    assert program.batching.problem is None
    reference = (prefill, decode, tokens)
    batched, batched_tokens = batched_parity_error(program, prompt.numpy(), reference)
    assert batched < TOL and batched_tokens == tokens
    # ... and against the same sessions stepped alone, within the stated bound.
    assert batched_vs_solo_error(program, prompt.numpy(), 4) <= BATCH_ROW_BOUND


def test_export_restores_the_callers_experts_implementation(tmp_path):
    """A module passed in keeps its own experts (and attention) implementation afterwards."""
    model = _model("mixtral")
    model.set_experts_implementation("eager")
    export(model, tmp_path / "m.mlxg", max_seq_len=8)
    assert model.config._experts_implementation == "eager"
    assert model.config._attn_implementation != "mlxgraph"


class Routing(nn.Module):
    """The router's ops on their own: topk on the last and a middle axis, both directions,
    and weights picked by the indices on axis 0 and 1 (index.Tensor, index_select)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(32, 8)
        self.w0 = nn.Parameter(torch.randn(8, 3, 5))
        self.w1 = nn.Parameter(torch.randn(5, 8, 2))

    def forward(self, tokens, positions):
        h = self.emb(tokens)[0]                                      # [T, 8]
        t = h.shape[0]
        vals, idx = torch.topk(h, 3, dim=-1)                         # [T, 3]
        low, low_idx = torch.topk(h.view(t, 4, 2), 2, dim=1, largest=False)
        picked0 = self.w0[idx].sum(dim=(2, 3))                       # [T, 3, 3, 5] -> [T, 3]
        picked1 = self.w1[:, idx].sum(dim=(0, 3))                    # [5, T, 3, 2] -> [T, 3]
        selected = torch.index_select(self.w1, 1, idx.reshape(-1)).view(5, t, 3, 2).sum(dim=(0, 3))
        parts = [
            vals,
            idx.float(),
            low.reshape(t, 4),
            low_idx.reshape(t, 4).float(),
            picked0,
            picked1,
            selected,
        ]
        return torch.cat(parts, dim=-1).unsqueeze(0)


def test_routing_ops_run_like_torch(tmp_path):
    writer = lower_module(Routing().eval(), tmp_path / "r.mlxg")
    ops = [n.op for n in writer.nodes]
    assert (
        ops.count("TopKNode") == 2 and "GatherNode" not in ops and ops.count("EmbeddingNode") == 4
    )
    check_runs_like_torch(Routing().eval(), tmp_path / "r2.mlxg", lengths=(1, 2, 5), tol=1e-5)


def test_expert_products_run_in_place_bit_for_bit(tmp_path, monkeypatch):
    """The experts' Embedding -> Matmul pairs run as one gather_mm (interpreter/
    expert_products.py): the logits are the unmarked pair's bit for bit, over a prefill,
    decode steps, a batched step, and an observed step (which sees the gathered rows)."""
    from mlxgraph.interpreter import expert_products
    from mlxgraph.interpreter import program as program_module

    model = _model("qwen3_moe")
    export(model, tmp_path / "q.mlxg", max_seq_len=MAX_T)
    marked = mlxgraph.load(tmp_path / "q.mlxg")
    fused = [n for n in marked.nodes if n.fn is expert_products.gathered_matmul]
    assert len(fused) == 2 * 2  # gate_up and down, two layers
    monkeypatch.setattr(program_module, "mark_expert_products", lambda nodes, *_: nodes)
    plain = mlxgraph.load(tmp_path / "q.mlxg")
    assert not any(n.fn is expert_products.gathered_matmul for n in plain.nodes)

    prompt = ids(np.arange(3, 3 + PROMPT) * 7 % 256)
    runs = []
    for program in (marked, plain):
        s = program.session(capacity=MAX_T)
        out = [np.array(s.step(prompt, range(PROMPT)))]
        token = int(out[-1][0, -1].argmax())
        for i in range(4):
            out.append(np.array(s.step(ids([token]), [PROMPT + i])))
            token = int(out[-1][0, -1].argmax())
        others = [program.session(capacity=MAX_T) for _ in range(2)]
        rows = [(o, ids([5 + j] * (j + 1)), list(range(j + 1))) for j, o in enumerate(others)]
        out += [np.array(r) for r in program.step_batch(rows)]
        seen = {}

        def observe(i, rec, outs, seen=seen):
            seen[i] = outs

        observed = program.session(capacity=MAX_T).step(prompt, range(PROMPT), observer=observe)
        out.append(np.array(observed))
        gathered = [o for i in seen for o in seen[i]
                    if program.nodes[i].fn is expert_products.gathered_embedding]
        assert len(gathered) == (4 if program is marked else 0)
        assert all(isinstance(o, mx.array) for o in gathered)
        runs.append(out)
    for got, want in zip(*runs):
        assert np.array_equal(got, want)
