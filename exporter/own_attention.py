"""Attention that a model computes itself, routed to the attention op.

A few widely used decoders compute attention in their own code instead of through
transformers' ``AttentionInterface`` (the adapter cannot switch their implementation). For
the exact classes listed here (keyed by module and qualified name: the code replaced is
known), the method that turns projected queries, keys and values into the attention output
is replaced by a call to the adapter's attention implementation with what that code does
(its scale, its window), so the layer keeps a KV cache like any other. Everything around
it (projections, head split and merge, output projection) stays the model's own.

The replacement runs only inside an adapter step (``attend`` is the adapter's attention
function and ``active()`` says whether a step runs); elsewhere the model's own method runs.
A subclass of a listed class (another implementation: GPT-Neo's flash-attention class) is
not the code replaced, so such a model is refused (``unlisted_subclass``).
"""


def _gpt_neo_attn(module, attend, query, key, value, attention_mask=None):
    """GPTNeoSelfAttention._attn: unscaled softmax attention of [B, H, T, D] heads, over a
    window of ``config.window_size`` tokens on its "local" layers; [B, H, T, D] out."""
    window = module.config.window_size if module.attention_type == "local" else None
    out, _ = attend(module, query, key, value, None, scaling=1.0, sliding_window=window)
    return out.transpose(1, 2).to(value.dtype), None


# (module, qualified class name) -> (method replaced, replacement, the attribute holding the
# layer's index: the adapter keys its cache by ``layer_idx``)
OWN_ATTENTION = {
    ("transformers.models.gpt_neo.modeling_gpt_neo", "GPTNeoSelfAttention"):
        ("_attn", _gpt_neo_attn, "layer_id"),
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
        name, replacement, index = entry
        if not getattr(module, "_mlxgraph_own_attention", False):
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
