"""The custom ops ``mlxgraph::causal_conv`` (a causal depthwise convolution whose last
inputs are off-graph state keyed by ``layer_id``) and ``mlxgraph::ssd_scan`` (Mamba-2's
selective scan, its S the state) (docs/architecture.md#recurrent-state).

Like ``mlxgraph::update_and_attend`` it is functional from torch's point of view, so the
exported graph holds no state tensors. Its eager kernel keeps each layer's state in the
active reference cache (``ReferenceCache.states``), so a model rewritten to call it still
runs step by step in torch and serves as an oracle.
"""

import torch
import torch.nn.functional as F

from mlxgraph.exporter.attention_op import active_reference_cache

__all__ = ["causal_conv", "gated_delta", "selective_scan", "ssd_scan"]


@torch.library.custom_op("mlxgraph::causal_conv", mutates_args=())
def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer_id: int) -> torch.Tensor:
    """Convolve x over its last axis with the layer's state prepended; keep the last inputs.

    Args:
        x: [B, C, T]; weight: [C, K]; bias: [C] or None; layer_id: which state.
    Returns:
        [B, C, T] in x's dtype (accumulated in float32).
    """
    states = active_reference_cache().states
    width = weight.shape[1] - 1
    state = states.get(layer_id)
    if state is None:
        state = x.new_zeros(x.shape[0], x.shape[1], width)
    s = torch.cat([state, x], dim=-1)
    states[layer_id] = s[:, :, x.shape[-1]:]
    out = F.conv1d(s.float(), weight.float().unsqueeze(1),
                   None if bias is None else bias.float(), groups=x.shape[1])
    return out.to(x.dtype)


@causal_conv.register_fake
def _fake(x, weight, bias, layer_id):
    return x.new_empty(x.shape)


@torch.library.custom_op("mlxgraph::ssd_scan", mutates_args=())
def ssd_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             c: torch.Tensor, d: torch.Tensor, dt_bias: torch.Tensor,
             layer_id: int) -> torch.Tensor:
    """Mamba-2's scan, token by token in float32 (the contract of schema/mlxgraph.fbs's
    SsdScanNode): x [1, T, H, P], dt [1, T, H], a/d/dt_bias [H], b/c [1, T, G, N].

    Returns:
        [1, T, H, P] float32.
    """
    states = active_reference_cache().states
    _, t, heads, head_dim = x.shape
    rep = heads // b.shape[2]
    b, c = (v.float().repeat_interleave(rep, dim=2) for v in (b, c))
    step = F.softplus(dt.float() + dt_bias.float())                   # [1, T, H]
    s = states.get(layer_id)
    if s is None:
        s = x.new_zeros((1, heads, head_dim, b.shape[-1]), dtype=torch.float32)
    outs = []
    for i in range(t):
        decay = torch.exp(step[:, i] * a.float())[:, :, None, None]   # [1, H, 1, 1]
        s = decay * s + (step[:, i, :, None] * x[:, i].float())[..., None] * b[:, i, :, None]
        outs.append((s @ c[:, i, :, :, None])[..., 0] + d.float()[:, None] * x[:, i].float())
    states[layer_id] = s
    return torch.stack(outs, dim=1)


@ssd_scan.register_fake
def _fake_scan(x, dt, a, b, c, d, dt_bias, layer_id):
    return x.new_empty(x.shape, dtype=torch.float32)


@torch.library.custom_op("mlxgraph::gated_delta", mutates_args=())
def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, layer_id: int, scale: float,
                qk_l2norm: bool = False) -> torch.Tensor:
    """The gated delta rule token by token in float32 (the contract of schema/mlxgraph.fbs's
    GatedDeltaNode): q, k [1, T, Hk, Dk], v [1, T, Hv, Dv], g, beta [1, T, Hv].

    Returns:
        [1, T, Hv, Dv] float32.
    """
    states = active_reference_cache().states
    rep = v.shape[2] // q.shape[2]
    q, k = (x.float().repeat_interleave(rep, dim=2) for x in (q, k))
    if qk_l2norm:
        q, k = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q * scale
    s = states.get(layer_id)
    if s is None:
        s = q.new_zeros((1, v.shape[2], q.shape[-1], v.shape[-1]))
    outs = []
    for i in range(v.shape[1]):
        s = s * torch.exp(g[:, i].float())[:, :, None, None]                     # [1, H, Dk, Dv]
        kv = (s * k[:, i, :, :, None]).sum(-2)                                   # [1, H, Dv]
        delta = (v[:, i].float() - kv) * beta[:, i].float()[..., None]
        s = s + k[:, i, :, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, i, :, :, None]).sum(-2))
    states[layer_id] = s
    return torch.stack(outs, dim=1)


@gated_delta.register_fake
def _fake_delta(q, k, v, g, beta, layer_id, scale, qk_l2norm=False):
    return v.new_empty(v.shape, dtype=torch.float32)


@torch.library.custom_op("mlxgraph::selective_scan", mutates_args=())
def selective_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                   c: torch.Tensor, d: torch.Tensor, dt_bias: torch.Tensor | None,
                   layer_id: int) -> torch.Tensor:
    """Mamba's selective scan token by token in float32 (the contract of schema/mlxgraph.fbs's
    SelectiveScanNode): x, dt [1, T, D], a [D, N], b, c [1, T, N], d, dt_bias [D].

    Returns:
        [1, T, D] float32.
    """
    states = active_reference_cache().states
    step = dt.float() + (0.0 if dt_bias is None else dt_bias.float())
    step = F.softplus(step)
    s = states.get(layer_id)
    if s is None:
        s = x.new_zeros(a.shape, dtype=torch.float32)[None]
    outs = []
    for i in range(x.shape[1]):
        s = (torch.exp(step[:, i, :, None] * a.float()) * s
             + (step[:, i] * x[:, i].float())[:, :, None] * b[:, i, None, :].float())
        outs.append((s @ c[:, i, :, None].float())[..., 0] + d.float() * x[:, i].float())
    states[layer_id] = s
    return torch.stack(outs, dim=1)


@selective_scan.register_fake
def _fake_selective(x, dt, a, b, c, d, dt_bias, layer_id):
    return x.new_empty(x.shape, dtype=torch.float32)
