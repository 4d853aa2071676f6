"""ALiBi attention (BLOOM, MPT) routed to the attention op with its slopes per query head.

BLOOM and MPT compute attention in their own code, adding a linear bias to the scores:
``slope[h] * s`` for a key at position s (BLOOM's ``build_alibi_tensor`` without padding),
or ``slope[h] * (s - last key)`` (MPT's ``build_mpt_alibi_tensor`` sliced to the keys).
Softmax is shift-invariant per query row, so both equal ``slope[h] * (s - p)`` for the query
at position p, which is what the op computes (format 1.3, ``alibi_slopes``;
docs/architecture.md#alibi). The forwards here are the models' attention forwards with that
one call to the adapter's attention in place of the scores, the bias, the mask and the
softmax; they run only inside an adapter step (exporter/own_attention.py dispatches).

The slopes are the models' own numbers, taken once when a module is routed (a float32
tensor from the modeling file's own function, as a tuple of floats: the op's static
attribute), never recomputed while tracing.
"""

import sys

import torch.nn.functional as F

from mlxgraph.exporter.model_support import AdapterError

# The attention-call argument that carries one ALiBi slope per query head.
ALIBI_SLOPES = "mlxgraph_alibi_slopes"


def _modeling(module):
    """The modeling file (module object) ``module``'s class comes from."""
    return sys.modules[type(module).__module__]


def bloom_slopes(module) -> tuple:
    """BLOOM's slopes, by its ``_get_alibi_slopes`` (float32, one per head).

    Raises:
        AdapterError: a ``beta`` other than 1 (the bias would be scaled; no file sets one).
    """
    if module.beta != 1.0:
        raise AdapterError(f"{type(module).__name__}: an ALiBi beta of {module.beta} is not "
                           "supported")
    return tuple(_modeling(module)._get_alibi_slopes(module.num_heads, "cpu").tolist())


def mpt_slopes(module) -> tuple:
    """MPT's slopes, by its ``build_mpt_alibi_tensor`` over two positions: the bias of the key
    one before the last is ``-slope`` (int32 -1 times the float32 slope: exact). transformers'
    MptModel calls it with the default ``alibi_bias_max`` (8), whatever the config says, and
    so does this."""
    bias = _modeling(module).build_mpt_alibi_tensor(module.n_heads, 2)     # [H, 1, 2]
    return tuple((-bias[:, 0, 0]).tolist())


def bloom_forward(module, attend, hidden_states, residual, alibi, attention_mask,
                  layer_past=None, use_cache=False, output_attentions=False, **kwargs):
    """BloomAttention.forward: fused QKV, ALiBi attention scaled by ``inv_norm_factor``,
    the output projection (per tensor-parallel slice without its bias when
    ``slow_but_exact``, as the original), dropout-add of the residual; (output, None)."""
    b, t, _ = hidden_states.shape
    query, key, value = module._reshape(module.query_key_value(hidden_states))
    out, _ = attend(module, query, key, value, None, scaling=module.inv_norm_factor,
                    **{ALIBI_SLOPES: module._mlxgraph_alibi_slopes})
    context = out.reshape(b, t, module.num_heads * module.head_dim)
    if module.pretraining_tp > 1 and module.slow_but_exact:
        step = module.hidden_size / module.pretraining_tp
        output = 0
        for i in range(module.pretraining_tp):
            cut = slice(int(i * step), int((i + 1) * step))
            output = output + F.linear(context[:, :, cut], module.dense.weight[:, cut])
    else:
        output = module.dense(context)
    return _modeling(module).dropout_add(output, residual, module.hidden_dropout,
                                         module.training), None


def mpt_forward(module, attend, hidden_states, position_bias, cache=None, attention_mask=None,
                **kwargs):
    """MptAttention.forward: fused QKV (clipped when ``clip_qkv``), ALiBi attention scaled by
    ``softmax_scale``, the output projection; (output, None)."""
    b, t = hidden_states.shape[:2]
    mixed = module.Wqkv(hidden_states)
    if module.clip_qkv:
        mixed = mixed.clamp(min=-module.clip_qkv, max=module.clip_qkv)

    def heads(x):
        return x.reshape(b, t, module.n_heads, module.head_dim).transpose(1, 2)

    query, key, value = (heads(x) for x in mixed.chunk(3, dim=2))
    out, _ = attend(module, query, key, value, None, scaling=module.softmax_scale,
                    **{ALIBI_SLOPES: module._mlxgraph_alibi_slopes})
    return module.out_proj(out.reshape(b, t, -1)), None
