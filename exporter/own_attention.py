"""Attention that a model computes itself, routed to the attention op.

A few widely used decoders compute attention in their own code instead of through
transformers' ``AttentionInterface`` (the adapter cannot switch their implementation). For
the exact classes listed here (keyed by module and qualified name: the code replaced is
known), the method that turns projected queries, keys and values into the attention output
is replaced by a call to the adapter's attention implementation with what that code does
(its scale, its window), so the layer keeps a KV cache like any other: GPT-Neo's ``_attn``
(everything around it stays the model's own), XGLM's whole attention forward (its
projections and the cache code around one softmax attention), and BLOOM's and MPT's
attention forwards with their ALiBi slopes (exporter/alibi_attention.py: the slopes are
taken from the model's own code once, when the module is routed).

The replacement runs only inside an adapter step (``attend`` is the adapter's attention
function and ``active()`` says whether a step runs); elsewhere the model's own method runs.
A subclass of a listed class (another implementation: GPT-Neo's flash-attention class) is
not the code replaced, so such a model is refused (``unlisted_subclass``).
"""

from mlxgraph.exporter.alibi_attention import bloom_forward, bloom_slopes, mpt_forward, mpt_slopes
from mlxgraph.exporter.model_support import AdapterError


def _gpt_neo_attn(module, attend, query, key, value, attention_mask=None):
    """GPTNeoSelfAttention._attn: unscaled softmax attention of [B, H, T, D] heads, over a
    window of ``config.window_size`` tokens on its "local" layers; [B, H, T, D] out."""
    window = module.config.window_size if module.attention_type == "local" else None
    out, _ = attend(module, query, key, value, None, scaling=1.0, sliding_window=window)
    return out.transpose(1, 2).to(value.dtype), None


def _xglm_forward(module, attend, hidden_states, key_value_states=None, cache=None,
                  attention_mask=None, **kwargs):
    """XGLMAttention.forward as self-attention: projections, queries scaled before the
    product (as the original), softmax attention, output projection; (output, None)."""
    if key_value_states is not None:
        raise AdapterError(f"{type(module).__name__}: cross-attention is not supported")
    bsz, tgt_len, _ = hidden_states.size()

    def heads(x):
        return x.view(bsz, tgt_len, -1, module.head_dim).transpose(1, 2)

    query = heads(module.q_proj(hidden_states) * module.scaling)
    key, value = heads(module.k_proj(hidden_states)), heads(module.v_proj(hidden_states))
    out, _ = attend(module, query, key, value, None, scaling=1.0)
    return module.out_proj(out.reshape(bsz, tgt_len, module.embed_dim)), None


# (module, qualified class name) -> (method replaced, replacement, the attribute holding the
# layer's index: the adapter keys its cache by ``layer_idx``, and None or what the module's
# ALiBi slopes are: a function of the module, called once when it is routed)
OWN_ATTENTION = {
    ("transformers.models.gpt_neo.modeling_gpt_neo", "GPTNeoSelfAttention"):
        ("_attn", _gpt_neo_attn, "layer_id", None),
    ("transformers.models.xglm.modeling_xglm", "XGLMAttention"):
        ("forward", _xglm_forward, "layer_idx", None),
    ("transformers.models.bloom.modeling_bloom", "BloomAttention"):
        ("forward", bloom_forward, "layer_idx", bloom_slopes),
    ("transformers.models.mpt.modeling_mpt", "MptAttention"):
        ("forward", mpt_forward, "layer_idx", mpt_slopes),
}


def _key(cls) -> tuple:
    return (cls.__module__, cls.__qualname__)


def unlisted_subclass(model):
    """The first module of ``model`` whose class derives from a listed one without being it
    (its path and class name), or None."""
    for path, module in model.named_modules():
        cls = type(module)
        if _key(cls) not in OWN_ATTENTION and any(_key(b) in OWN_ATTENTION for b in cls.__mro__):
            return f"{path} ({cls.__name__})"
    return None


def install_own_attention(model, attend, active) -> list:
    """Route each listed attention module of ``model`` to ``attend`` during adapter steps.

    Returns:
        the modules routed (once each).
    """
    routed = []
    for module in model.modules():
        entry = OWN_ATTENTION.get(_key(type(module)))
        if entry is None:
            continue
        name, replacement, index, slopes = entry
        if not getattr(module, "_mlxgraph_own_attention", False):
            if slopes is not None:
                module._mlxgraph_alibi_slopes = slopes(module)
            original = getattr(module, name)
            setattr(module, name, _dispatch(module, original, replacement, attend, active))
            module.layer_idx = getattr(module, index)
            module._mlxgraph_own_attention = True
        routed.append(module)
    return routed


def _dispatch(module, original, replacement, attend, active):
    def method(*args, **kwargs):
        if active():
            return replacement(module, attend, *args, **kwargs)
        return original(*args, **kwargs)

    return method
