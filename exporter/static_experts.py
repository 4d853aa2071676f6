"""Mixture-of-experts code with data-dependent shapes, computed with static ones.

Some transformers MoE layers group tokens by expert with sizes read from tensor values
(JetMoE's ``expert_size.tolist()`` and ``split``, DBRX's loop over ``nonzero()`` experts)
and offer no experts implementation to switch (adapter.use_export_friendly_experts), so
torch.export cannot follow them. For those exact classes (keyed by module and qualified
name: the code replaced is known, not guessed from a name), the same routing is computed
the way transformers' ``batched_mm`` experts do it: each token repeated top-k times, each
row's expert weights picked by id, one batched matmul, the weighted rows summed per token.
Only the order of the float sums differs from the original (rounding).

The replacements are installed per module instance and are active only inside an adapter
step (``active()``); elsewhere the model's own code runs, so a caller's model computes as
before.
"""

import torch


def _rows_times(weights, rows):
    """``weights [S, out, in] @ rows [S, in] -> [S, out]`` (one matmul per row)."""
    return torch.bmm(weights, rows.unsqueeze(-1)).squeeze(-1)


def _jetmoe_route(router, x):
    """JetMoeTopKGating's choice without its grouping: (gates [T, k], expert ids [T, k])."""
    logits = router.layer(x).float()
    top_logits, ids = logits.topk(router.top_k, dim=1)
    return torch.softmax(top_logits, dim=1).type_as(x), ids, logits


def jetmoe_moe_forward(self, layer_input):
    """JetMoeMoE.forward: a gated MLP of the top-k experts per token, plus a bias."""
    bsz, length, emb = layer_input.size()
    x = layer_input.reshape(-1, emb)
    gates, ids, _ = _jetmoe_route(self.router, x)
    k = ids.size(1)
    experts = ids.reshape(-1)
    hidden = _rows_times(self.input_linear.weight[experts], x.repeat_interleave(k, dim=0))
    gate, up = hidden.chunk(2, dim=-1)
    out = _rows_times(self.output_linear.weight[experts], self.activation(gate) * up)
    out = (out * gates.reshape(-1, 1)).view(-1, k, emb).sum(1)
    return out.view(bsz, length, emb) + self.bias


def jetmoe_moa_map(self, layer_input):
    """JetMoeMoA.map: each token's query projection by each of its top-k experts,
    [bsz, length, k, hidden]; the routing travels to ``reduce`` as (gates, expert ids)."""
    bsz, length, emb = layer_input.size()
    x = layer_input.reshape(-1, emb)
    gates, ids, logits = _jetmoe_route(self.router, x)
    experts = ids.reshape(-1)
    out = _rows_times(self.input_linear.weight[experts], x.repeat_interleave(self.top_k, dim=0))
    return out.view(bsz, length, self.top_k, -1), logits, (gates, experts)


def jetmoe_moa_reduce(self, layer_input, topo_info):
    """JetMoeMoA.reduce: each (token, expert) row's output projection, gated, summed."""
    gates, experts = topo_info
    bsz, length, k, hidden = layer_input.size()
    out = _rows_times(self.output_linear.weight[experts], layer_input.reshape(-1, hidden))
    out = (out * gates.reshape(-1, 1)).view(-1, k, self.input_size).sum(1)
    return out.view(bsz, length, self.input_size) + self.bias


def dbrx_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """DbrxExperts.forward: a GLU of the top-k experts per token, weighted and summed."""
    batch = hidden_states.shape[0]
    x = hidden_states.reshape(-1, self.hidden_size)
    k = top_k_index.size(-1)
    experts = top_k_index.reshape(-1)
    rows = x.repeat_interleave(k, dim=0)
    shape = (-1, self.ffn_hidden_size, self.hidden_size)
    w1 = self.mlp.w1.view(shape)[experts]
    v1 = self.mlp.v1.view(shape)[experts]
    w2 = self.mlp.w2.view(shape)[experts]
    inner = self.mlp.activation_fn(_rows_times(w1, rows)) * _rows_times(v1, rows)
    out = torch.bmm(inner.unsqueeze(1), w2).squeeze(1)  # inner @ w2 [F, H], as DbrxExpertGLU
    out = (out * top_k_weights.reshape(-1, 1)).view(-1, k, self.hidden_size).sum(1)
    return out.to(hidden_states.dtype).view(batch, -1, self.hidden_size)


# (module, qualified class name) -> {method: its static-shape replacement}
STATIC_METHODS = {
    ("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoE"): {"forward": jetmoe_moe_forward},
    ("transformers.models.jetmoe.modeling_jetmoe", "JetMoeMoA"): {
        "map": jetmoe_moa_map, "reduce": jetmoe_moa_reduce},
    ("transformers.models.dbrx.modeling_dbrx", "DbrxExperts"): {"forward": dbrx_experts_forward},
}


def install_static_experts(model, active) -> list:
    """Give each module of a class in STATIC_METHODS its static-shape methods.

    Args:
        model: the ``*ForCausalLM``.
        active: ``fn() -> bool``: whether an adapter step is running (the replacement
            runs then, the module's own method otherwise).
    Returns:
        the modules given replacements (once each).
    """
    done = []
    for module in model.modules():
        methods = STATIC_METHODS.get((type(module).__module__, type(module).__qualname__))
        if not methods or getattr(module, "_mlxgraph_static_experts", False):
            continue
        for name, replacement in methods.items():
            setattr(module, name, _dispatch(module, getattr(module, name), replacement, active))
        module._mlxgraph_static_experts = True
        done.append(module)
    return done


def _dispatch(module, original, replacement, active):
    def method(*args, **kwargs):
        if active():
            return replacement(module, *args, **kwargs)
        return original(*args, **kwargs)

    return method
