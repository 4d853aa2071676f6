"""Route a model's recurrent layers through ``mlxgraph::causal_conv`` and ``::ssd_scan``.

transformers' state-space, short-convolution and linear-attention layers (LFM2, Mamba,
Qwen3-Next, ...) call module-level functions of their modeling file,
``causal_conv1d_forward(conv1d, hidden_states, cache, layer_idx, activation=None,
state_idx=0, **kwargs)`` and (Mamba-2 and its hybrids) ``mamba2_scan_forward(module,
hidden_states, B, C, dt, cache, **kwargs)``, the places transformers documents for "a
runtime that manages the state itself". :func:`install` puts a dispatcher in their place
in each modeling module a model uses: inside :func:`recording` (one DecoderAdapter's
forward, a context variable, so other threads and plain eager runs keep the original) it
calls the custom op and records the state's shape; outside it calls the original.

State ids: a layer's KV cache is keyed by its ``layer_idx`` (a layer attended twice takes
the ids after the model's layers, exporter/adapter.py), so the states are numbered from
``STATE_ID_BASE`` (2**20) in the order (layer, kind, state_idx) is first met: disjoint from
every attention layer_id and the same in every forward.
"""

import math
import sys
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers.activations import ACT2FN

from mlxgraph.exporter import state_op  # noqa: F401  (registers the op with torch)
from mlxgraph.exporter.model_support import (
    DELTA_HOOK,
    MAMBA_HOOK,
    SCAN_HOOK,
    AdapterError,
    has_hook,
)
from mlxgraph.schema.records import StateLayerInfo

_RECORD: ContextVar = ContextVar("mlxgraph_state_record", default=None)
STATE_ID_BASE = 2**20


class StateRecord:
    """What one adapter records of its recurrent layers: {state layer_id: StateLayerInfo}
    and the ids given so far (see the module docstring)."""

    def __init__(self, paths: dict):
        self.paths = paths  # {id(module): its path}, for messages
        self.ids = {}
        self.states = {}
        self.used = set()
        self.scanned = set()  # (hook, layer_idx) of every routed scan seen
        self.current = None  # the gated-delta layer running now (its forward pre-hook)

    def state_id(self, layer_idx: int, kind: str, state_idx: int) -> int:
        """The state's layer_id (see the module docstring)."""
        return self.ids.setdefault((layer_idx, kind, state_idx), STATE_ID_BASE + len(self.ids))


def install(model) -> None:
    """Put a dispatcher in place of each hook (``causal_conv1d_forward``,
    ``mamba2_scan_forward``) in every modeling module ``model``'s classes come from (once
    per module; process-wide, like the registered attention implementation)."""
    for module in model.modules():
        owner = sys.modules.get(type(module).__module__)
        for name, make in _HOOKS.items():
            original = getattr(owner, name, None)
            if original is not None and getattr(original, "mlxgraph_original", None) is None:
                setattr(owner, name, make(original))
        if (hasattr(owner, DELTA_HOOK) and hasattr(module, "layer_idx")
                and not getattr(module, "_mlxgraph_layer_hook", False)):
            module.register_forward_pre_hook(_enter_layer)
            module._mlxgraph_layer_hook = True


def _conv_dispatcher(original):
    def causal_conv1d_forward(conv1d, hidden_states, cache=None, layer_idx=None,
                              activation=None, state_idx=0, **kwargs):
        record = _RECORD.get()
        if record is None:
            return original(conv1d, hidden_states, cache, layer_idx, activation=activation,
                            state_idx=state_idx, **kwargs)
        return _causal_conv(record, conv1d, hidden_states, layer_idx, activation, state_idx)

    causal_conv1d_forward.mlxgraph_original = original
    return causal_conv1d_forward


def _scan_dispatcher(original):
    def mamba2_scan_forward(module, hidden_states, B, C, dt, cache=None, **kwargs):  # noqa: N803
        record = _RECORD.get()
        if record is None:
            return original(module, hidden_states, B, C, dt, cache, **kwargs)
        return _ssd_scan(record, module, hidden_states, B, C, dt)

    mamba2_scan_forward.mlxgraph_original = original
    return mamba2_scan_forward


def _causal_conv(record, conv1d, x, layer_idx, activation, state_idx):
    where = _where(record, conv1d, layer_idx)
    if layer_idx is None:
        raise AdapterError(f"{where}: a recurrent convolution without a layer index")
    k = conv1d.kernel_size[0]
    if conv1d.groups != conv1d.in_channels or conv1d.out_channels != conv1d.in_channels:
        raise AdapterError(f"{where}: only depthwise convolutions keep a state the graph "
                           "can express")
    if conv1d.stride[0] != 1 or conv1d.dilation[0] != 1 or k < 2:
        raise AdapterError(f"{where}: a strided or dilated convolution (or kernel < 2)")
    lid = record.state_id(int(layer_idx), "conv", int(state_idx))
    if lid in record.used:
        raise AdapterError(f"{where}: its state {state_idx} is used twice in one forward")
    record.used.add(lid)
    info = StateLayerInfo(lid, (1, conv1d.in_channels, k - 1), str(x.dtype).rsplit(".", 1)[-1])
    if record.states.setdefault(lid, info) != info:
        raise AdapterError(f"{where}: called twice with different state shapes")
    out = torch.ops.mlxgraph.causal_conv(x, conv1d.weight.squeeze(1), conv1d.bias, lid)
    return out if activation is None else ACT2FN[activation](out)


def _where(record, module, layer_idx) -> str:
    return f"{record.paths.get(id(module), f'layer {layer_idx}')} ({type(module).__name__})"


def _ssd_scan(record, module, x, b, c, dt):
    where = _where(record, module, module.layer_idx)
    limit = tuple(float(v) for v in (getattr(module, "time_step_limit", None) or (0, math.inf)))
    if limit != (0.0, math.inf):  # transformers clamps dt only in its chunked form
        raise AdapterError(f"{where}: time_step_limit {limit} is not supported (only (0, inf))")
    lid = record.state_id(int(module.layer_idx), "ssm", 0)
    record.scanned.add((SCAN_HOOK, int(module.layer_idx)))
    if lid in record.used:
        raise AdapterError(f"{where}: its scan runs twice in one forward")
    record.used.add(lid)
    heads, head_dim = module.num_heads, module.head_dim
    groups, size = module.n_groups, module.ssm_state_size
    info = StateLayerInfo(lid, (1, heads, head_dim, size), "float32")
    if record.states.setdefault(lid, info) != info:
        raise AdapterError(f"{where}: called twice with different state shapes")
    n, t = x.shape[:2]
    out = torch.ops.mlxgraph.ssd_scan(
        x.reshape(n, t, heads, head_dim), dt, -torch.exp(module.A_log.float()),
        b.reshape(n, t, groups, size), c.reshape(n, t, groups, size), module.D, module.dt_bias,
        lid)
    return out.reshape(n, t, heads * head_dim)


def unrouted_scan(model, record: StateRecord) -> str | None:
    """The first state-space or gated-delta layer (path and class) whose forward never
    reached its routed hook (it would run without its state), else None."""
    for path, module in model.named_modules():
        for hook in (SCAN_HOOK, DELTA_HOOK, MAMBA_HOOK):
            if (hasattr(module, "A_log") and has_hook(module, (hook,))
                    and (hook, getattr(module, "layer_idx", None)) not in record.scanned):
                return f"{path} ({type(module).__name__})"
    return None


def _delta_dispatcher(original):
    def torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64,
                                     initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, **kwargs):
        record = _RECORD.get()
        if record is None:
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                            initial_state=initial_state, output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        if kwargs.get("scale") is not None or initial_state is not None:
            raise AdapterError("a gated delta rule with a scale or an initial state of its own "
                               "is not supported")
        out = _gated_delta(record, query, key, value, g, beta, use_qk_l2norm_in_kernel)
        return out, None

    torch_chunk_gated_delta_rule.mlxgraph_original = original
    return torch_chunk_gated_delta_rule


def _gated_delta(record, q, k, v, g, beta, l2norm):
    module = record.current
    if module is None or getattr(module, "layer_idx", None) is None:
        raise AdapterError("a gated delta rule ran outside a layer with a layer_idx")
    where = _where(record, module, module.layer_idx)
    if tuple(g.shape) != tuple(v.shape[:3]) or tuple(beta.shape) != tuple(v.shape[:3]):
        raise AdapterError(f"{where}: only a decay and beta per value head are supported "
                           f"(g {list(g.shape)}, v {list(v.shape)})")
    lid = record.state_id(int(module.layer_idx), "delta", 0)
    record.scanned.add((DELTA_HOOK, int(module.layer_idx)))
    if lid in record.used:
        raise AdapterError(f"{where}: its gated delta rule runs twice in one forward")
    record.used.add(lid)
    info = StateLayerInfo(lid, (1, v.shape[2], k.shape[-1], v.shape[-1]), "float32")
    if record.states.setdefault(lid, info) != info:
        raise AdapterError(f"{where}: called twice with different state shapes")
    out = torch.ops.mlxgraph.gated_delta(q, k, v, g, beta, lid, float(k.shape[-1]) ** -0.5,
                                         bool(l2norm))
    return out.to(q.dtype)


def _enter_layer(module, args):
    """Forward pre-hook of a gated-delta layer: its hook's call does not name the layer."""
    record = _RECORD.get()
    if record is not None:
        record.current = module


def _mamba_dispatcher(original):
    def mamba_scan_forward(module, hidden_states, time_step, B, C, gate, cache=None,  # noqa: N803
                           **kwargs):
        record = _RECORD.get()
        if record is None:
            return original(module, hidden_states, time_step, B, C, gate, cache, **kwargs)
        return _selective_scan(record, module, hidden_states, time_step, B, C, gate)

    mamba_scan_forward.mlxgraph_original = original
    return mamba_scan_forward


def _selective_scan(record, module, x, dt, b, c, gate):
    """Mamba-1: x, dt, gate [B, D, T]; b, c [B, T, N]; returns [B, D, T] as the hook does."""
    where = _where(record, module, module.layer_idx)
    lid = record.state_id(int(module.layer_idx), "scan", 0)
    record.scanned.add((MAMBA_HOOK, int(module.layer_idx)))
    if lid in record.used:
        raise AdapterError(f"{where}: its scan runs twice in one forward")
    record.used.add(lid)
    a = -torch.exp(module.A_log.float())
    info = StateLayerInfo(lid, (1, *a.shape), "float32")
    if record.states.setdefault(lid, info) != info:
        raise AdapterError(f"{where}: called twice with different state shapes")
    bias = module.dt_proj.bias
    out = torch.ops.mlxgraph.selective_scan(x.transpose(1, 2), dt.transpose(1, 2), a, b, c,
                                            module.D, bias, lid)
    return (out * torch.nn.functional.silu(gate.transpose(1, 2).float())).transpose(1, 2)


_HOOKS = {"causal_conv1d_forward": _conv_dispatcher, SCAN_HOOK: _scan_dispatcher,
          DELTA_HOOK: _delta_dispatcher, MAMBA_HOOK: _mamba_dispatcher}


@contextmanager
def recording(record: StateRecord):
    """Inside the block (this context only) recurrent convolutions call the custom op."""
    record.used = set()
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


__all__ = ["StateRecord", "install", "recording", "unrouted_scan"]
