"""Mamba-2's selective scan (SsdScan) and the gated delta rule (GatedDelta), format 1.3,
as off-graph session state (issue 30).

Mamba-2 and its hybrids (Bamba, Falcon-H1, Granite 4 / granitemoehybrid, Nemotron-H) and
Qwen3-Next export and match transformers eager (Nemotron-H with its MLP-only and MoE
layers too) over a prefill, 40 greedy decode steps, a chunked prefill and batched steps;
Mamba-2's 150-token and Qwen3-Next's 80-token prompts cross the kernels' 64-token blocks.
The kernels match the ops' token-by-token eager definitions across block boundaries and
steps; what they cannot do is refused.
"""

import mlx.core as mx
import numpy as np
import pytest
import torch
from parity_helpers import hf_greedy_reference, mlxgraph_parity_errors

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.exporter.attention_op import ReferenceCache, using_reference_cache
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.exporter.model_support import AdapterError
from mlxgraph.exporter.state_op import gated_delta as eager_delta
from mlxgraph.exporter.state_op import ssd_scan as eager_scan
from mlxgraph.interpreter.cache.recurrent_state import RecurrentState
from mlxgraph.interpreter.kernels.state import DELTA_CHUNK, SSD_CHUNK, gated_delta, ssd_scan
from mlxgraph.interpreter.session.step_context import StepContext
from mlxgraph.schema.records import StateLayerInfo

TOL = 1e-4
_ATTN = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256)
_MAMBA = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=2,
              mamba_d_conv=4, mamba_chunk_size=8)
# model type -> (config overrides, prompt length): heads 8 of 16, groups 2, state 16.
FAMILIES = {
    "mamba2": (dict(num_hidden_layers=2, hidden_size=64, vocab_size=256, num_heads=8,
                    head_dim=16, state_size=16, n_groups=2, conv_kernel=4, chunk_size=8,
                    expand=2), 150),
    "bamba": (dict(_ATTN, attn_layer_indices=[1], **_MAMBA), 13),
    "falcon_h1": (dict(_ATTN, head_dim=16, mamba_d_ssm=128, **_MAMBA), 13),
    "granitemoehybrid": (dict(_ATTN, layer_types=["mamba", "attention"], num_local_experts=0,
                              **_MAMBA), 13),
    "nemotron_h": (dict(_ATTN, hybrid_override_pattern="M*", head_dim=16, mamba_num_heads=8,
                        mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
                        chunk_size=8), 13),
    # Mamba-1's selective scan (a decay per channel and state entry), alone and in Jamba
    "mamba": (dict(num_hidden_layers=2, hidden_size=64, vocab_size=256, state_size=8), 13),
    "falcon_mamba": (dict(num_hidden_layers=2, hidden_size=64, vocab_size=256, state_size=8),
                     13),
    "jamba": (dict(_ATTN, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                   expert_layer_offset=1, num_experts=2), 13),
    # gated delta rule: 4 value heads over 2 key heads of 8, beside full attention and MoE
    "qwen3_next": (dict(_ATTN, head_dim=16, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, linear_num_value_heads=4,
                        linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                        layer_types=["linear_attention", "full_attention"]), 80),
}


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_mamba2_families_match_transformers(arch, tmp_path):
    overrides, n = FAMILIES[arch]
    model = build_model(make_config(arch, **overrides), seed=0)
    stats = export(model, tmp_path / "m.mlxg", max_seq_len=512)
    assert sum(stats["ops"].get(op, 0) for op in ("SsdScan", "GatedDelta", "SelectiveScan"))
    assert stats["ops"]["CausalConv"] >= 1
    prompt = torch.randint(4, 256, (1, n), generator=torch.Generator().manual_seed(7))
    reference = hf_greedy_reference(model, prompt, 40)
    errors = mlxgraph_parity_errors(tmp_path / "m.mlxg", prompt.numpy(), reference,
                                    chunk=4 if n < 20 else 50)
    print(arch, {k: v for k, v in errors.items() if k != "tokens"})
    assert max(errors[k] for k in ("prefill", "decode", "chunked", "batched")) < TOL, errors
    assert errors["tokens"] == reference[2]


# Nemotron-H's layer kinds in one pattern (hybrid_override_pattern): 'M' Mamba-2, '-' an MLP
# alone, '*' attention, 'E' a routed MoE (grouped top-k by sigmoid scores plus a correction
# bias, a shared expert). The '-' and 'E' layers keep neither a KV cache nor a state.
NEMOTRON_H_PATTERN = dict(_ATTN, num_hidden_layers=4, hybrid_override_pattern="M-*E",
                          head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16,
                          n_groups=2, conv_kernel=4, chunk_size=8, n_routed_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32,
                          moe_shared_expert_intermediate_size=32, n_group=2, topk_group=1)


def test_nemotron_h_mlp_and_moe_layers_match_transformers(tmp_path):
    model = build_model(make_config("nemotron_h", **NEMOTRON_H_PATTERN), seed=0)
    assert model.config.layer_types == ["linear_attention", "mlp", "full_attention", "moe"]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # zeros as built: drawn, so that the bias changes the experts chosen
        for m in model.modules():
            if (bias := getattr(m, "e_score_correction_bias", None)) is not None:
                bias.copy_(torch.rand(bias.shape, generator=g) * 0.5)
    stats = export(model, tmp_path / "m.mlxg", max_seq_len=512)
    assert stats["ops"]["UpdateAndAttend"] == stats["ops"]["SsdScan"] == 1
    assert stats["ops"]["TopK"] >= 1  # the MoE layer's router
    metadata = mlxgraph.load(tmp_path / "m.mlxg").metadata  # one KV layer, one conv + scan
    assert (len(metadata.layers), len(metadata.states)) == (1, 2)
    prompt = torch.randint(4, 256, (1, 13), generator=torch.Generator().manual_seed(7))
    reference = hf_greedy_reference(model, prompt, 40)
    errors = mlxgraph_parity_errors(tmp_path / "m.mlxg", prompt.numpy(), reference, chunk=4)
    assert max(errors[k] for k in ("prefill", "decode", "chunked", "batched")) < TOL, errors
    assert errors["tokens"] == reference[2]

def test_the_kernel_matches_the_token_by_token_definition_across_blocks():
    g = torch.Generator().manual_seed(0)
    t, heads, head_dim, groups, size = 2 * SSD_CHUNK + 22, 4, 8, 2, 6
    x = torch.randn(1, t, heads, head_dim, generator=g)
    dt = torch.randn(1, t, heads, generator=g)
    b, c = (torch.randn(1, t, groups, size, generator=g) for _ in range(2))
    a = -torch.rand(heads, generator=g) * 2
    d, dt_bias = torch.randn(heads, generator=g), torch.randn(heads, generator=g)
    with using_reference_cache(ReferenceCache()):
        want = eager_scan(x, dt, a, b, c, d, dt_bias, 0).numpy()
    store = RecurrentState(StateLayerInfo(0, (1, heads, head_dim, size), "float32"), "ssm_state")
    ctx, got = StepContext({0: store}), []
    m = {k: mx.array(v.numpy()) for k, v in dict(x=x, dt=dt, b=b, c=c).items()}
    for lo, hi in ((0, SSD_CHUNK + 9), (SSD_CHUNK + 9, SSD_CHUNK + 10), (SSD_CHUNK + 10, t)):
        store.begin(hi - lo)
        got.append(np.array(ssd_scan(m["x"][:, lo:hi], m["dt"][:, lo:hi], mx.array(a.numpy()),
                                     m["b"][:, lo:hi], m["c"][:, lo:hi], mx.array(d.numpy()),
                                     mx.array(dt_bias.numpy()), 0, ctx)))
        store.commit()
    got = np.concatenate(got, axis=1)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("l2norm", [True, False])
def test_the_delta_kernel_matches_the_token_by_token_definition_across_blocks(l2norm):
    g = torch.Generator().manual_seed(1)
    t, hk, hv, dk, dv = DELTA_CHUNK + 30, 2, 4, 8, 6
    q, k = (torch.randn(1, t, hk, dk, generator=g) for _ in range(2))
    if not l2norm:  # keep the delta rule's state bounded: unit-norm keys, as the model has
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(1, t, hv, dv, generator=g)
    decay = -torch.rand(1, t, hv, generator=g)
    beta = torch.rand(1, t, hv, generator=g)
    with using_reference_cache(ReferenceCache()):
        want = eager_delta(q, k, v, decay, beta, 0, dk ** -0.5, l2norm).numpy()
    store = RecurrentState(StateLayerInfo(0, (1, hv, dk, dv), "float32"), "delta_state")
    ctx, got = StepContext({0: store}), []
    m = {n: mx.array(x.numpy()) for n, x in dict(q=q, k=k, v=v, g=decay, beta=beta).items()}
    for lo, hi in ((0, DELTA_CHUNK + 5), (DELTA_CHUNK + 5, DELTA_CHUNK + 6), (DELTA_CHUNK + 6, t)):
        store.begin(hi - lo)
        part = {n: x[:, lo:hi] for n, x in m.items()}
        got.append(np.array(gated_delta(**part, layer_id=0, scale=dk ** -0.5,
                                        qk_l2norm=l2norm, ctx=ctx)))
        store.commit()
    got = np.concatenate(got, axis=1)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_a_clamped_time_step_is_refused_in_one_line(tmp_path):
    overrides, _ = FAMILIES["mamba2"]
    model = build_model(make_config("mamba2", **overrides, time_step_limit=(0.0, 0.1)))
    with pytest.raises(AdapterError, match=r"backbone.layers.0.mixer \(Mamba2Mixer\): "
                                           r"time_step_limit \(0.0, 0.1\) is not supported"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)


def test_a_mixer_that_skips_the_routed_scan_is_refused(tmp_path):
    """A mixer whose forward never calls mamba2_scan_forward would run without its state."""
    overrides, _ = FAMILIES["mamba2"]
    model = build_model(make_config("mamba2", **overrides))
    model.backbone.layers[1].mixer.forward = lambda hidden_states, **kw: hidden_states
    with pytest.raises(AdapterError, match=r"backbone.layers.1.mixer \(Mamba2Mixer\): its scan "
                                           "did not go through mamba2_scan_forward"):
        export(model, tmp_path / "m.mlxg", max_seq_len=16)


@pytest.mark.parametrize("arch,reason", [
    ("mamba2", "do not make the state"),
    ("qwen3_next", "do not make the state"),
    ("mamba", "a must be [D, N] for the state"),
])
def test_a_state_the_node_does_not_fit_fails_verification(arch, reason, tmp_path, monkeypatch):
    """The verifier holds each scan node to its metadata.states entry: a file whose state
    shape is one entry off is refused (here by export's own verification) in one line."""
    from mlxgraph.exporter import state_adapter

    def off_by_one(lid, shape, dtype):  # the scans' states (last axis 8 or 16), not the convs'
        grown = (*shape[:-1], shape[-1] + 1) if shape[-1] > 3 else shape
        return StateLayerInfo(lid, grown, dtype)

    monkeypatch.setattr(state_adapter, "StateLayerInfo", off_by_one)
    model = build_model(make_config(arch, **FAMILIES[arch][0]), seed=0)
    with pytest.raises(Exception) as e:
        export(model, tmp_path / "m.mlxg", max_seq_len=16)
    assert reason in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "m.mlxg").exists()


_O = mx.ones
STATE_EXAMPLES = {  # op -> (its fields, its state's shape and kind)
    "CausalConv": (dict(x=_O((1, 4, 3)), weight=_O((4, 3)), bias=_O(4)), (1, 4, 2),
                   "conv_state"),
    "SsdScan": (dict(x=_O((1, 3, 2, 2)), dt=_O((1, 3, 2)), a=-_O(2), b=_O((1, 3, 1, 2)),
                     c=_O((1, 3, 1, 2)), d=_O(2), dt_bias=_O(2)), (1, 2, 2, 2), "ssm_state"),
    "GatedDelta": (dict(q=_O((1, 3, 1, 2)), k=_O((1, 3, 1, 2)), v=_O((1, 3, 2, 2)),
                        g=-_O((1, 3, 2)), beta=_O((1, 3, 2)), scale=1.0, qk_l2norm=True),
                   (1, 2, 2, 2), "delta_state"),
    "SelectiveScan": (dict(x=_O((1, 3, 2)), dt=_O((1, 3, 2)), a=-_O((2, 4)), b=_O((1, 3, 4)),
                           c=_O((1, 3, 4)), d=_O(2), dt_bias=_O(2)), (1, 2, 4), "scan_state"),
}


def test_state_kernels_never_force_evaluation():
    """Each recurrent kernel, with a store, traced under mx.compile: an evaluation would raise."""
    from mlxgraph.interpreter.kernels import get_kernel
    from mlxgraph.schema.op_catalogue import Trait, ops_with

    assert set(STATE_EXAMPLES) == {o.name for o in ops_with(Trait.STATE)}
    for op, (fields, shape, kind) in STATE_EXAMPLES.items():
        arrays = {k: v for k, v in fields.items() if isinstance(v, mx.array)}
        names = sorted(arrays)

        def run(*vals, op=op, fields=fields, shape=shape, kind=kind, names=names):
            store = RecurrentState(StateLayerInfo(0, shape, "float32"), kind)
            store.begin(3)
            given = {**fields, **dict(zip(names, vals, strict=True))}
            return get_kernel(f"{op}Node").fn(**given, layer_id=0, ctx=StepContext({0: store}))

        mx.eval(mx.compile(run)(*[arrays[n] for n in names]))
