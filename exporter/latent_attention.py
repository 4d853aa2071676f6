"""Multi-head latent attention (MLA: DeepSeek-V2/V3 and the files that copy them) exported in
its absorbed form, with a cache of the compressed latent and the RoPE key per position.

transformers' MLA layer projects each token to a latent ``c`` (``kv_a_proj_with_mqa``, then
``kv_a_layernorm``: ``kv_lora_rank`` wide) and a decoupled RoPE key ``k_pe``
(``qk_rope_head_dim``, one for all heads), caches those two, and decompresses them into
per-head keys and values (``kv_b_proj``) at every step. The absorbed form folds the
decompression into the queries and the output instead, per head h, with
``kv_b_proj.weight`` viewed as ``[H, nope + v, rank]`` = ``[W_UK[h]; W_UV[h]]``:

    scores = (q_nope W_UK[h]) . c + q_pe . k_pe      (the same sums, reassociated)
    out[h] = (softmax(scores * scale) . c) W_UV[h]^T

so attention is multi-query attention with one kv head whose key is ``[c, k_pe]``
(``rank + rope`` wide) and whose value is the first ``rank`` columns of that key: the
graph's cache keeps the key rows alone (``LayerCache.values_in_keys``, format 1.3;
docs/architecture.md#latent-attention). :func:`install` replaces the forward of each
checked MLA module of a model (``model_support.LATENT_CLASSES``) with
:func:`absorbed_forward`, which calls the model's attention interface (the ``mlxgraph``
one once adapted) with the keys as values and :data:`VALUES_IN_KEYS`; DeepSeek-V2's
complex rotary embedding (``torch.polar``) is replaced by the real cos/sin it stands for.
Both fall back to the model's own code whenever its attention implementation is not
``mlxgraph``, so the same model object still runs eagerly as transformers wrote it.
"""

import re
import types

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from mlxgraph.exporter.model_support import LATENT_CLASSES, AdapterError

# The attention-call argument that says "the values are the first N columns of the keys".
VALUES_IN_KEYS = "mlxgraph_values_in_keys"
ATTN_IMPLEMENTATION = "mlxgraph"  # the adapter's (exporter/adapter.py registers it)
# Files whose rotary embedding is complex (torch.polar): their pairs are adjacent columns.
_COMPLEX_ROTARY = r"^DeepseekV2RotaryEmbedding$"
# Layers that always rotate adjacent pairs (the others ask config.rope_interleave).
_INTERLEAVED_ATTENTION = r"^(DeepseekV2Attention|LongcatFlashMLA)$"


def install(model) -> None:
    """Give each checked MLA module of ``model`` the absorbed forward (and DeepSeek-V2's
    rotary embedding its real form); the absorbed weights become buffers of the module.

    Raises:
        AdapterError: an MLA module with a bias on ``kv_b_proj`` (none of the checked
            files has one; the absorbed form would drop it).
    """
    for path, module in model.named_modules():
        name = type(module).__name__
        if re.search(_COMPLEX_ROTARY, name) and not hasattr(module, "_mlxgraph_original"):
            module._mlxgraph_original = module.forward
            module.forward = types.MethodType(_real_rotary, module)
        if not (hasattr(module, "kv_a_proj_with_mqa") and re.search(LATENT_CLASSES, name)):
            continue
        if hasattr(module, "_mlxgraph_original"):
            continue
        if module.kv_b_proj.bias is not None:
            raise AdapterError(f"{path} ({name}): a bias on kv_b_proj is not supported")
        heads, nope, v = module.num_heads, module.qk_nope_head_dim, module.v_head_dim
        w = module.kv_b_proj.weight.detach().view(heads, nope + v, module.kv_lora_rank)
        # Constants of the graph, once: W_UK [H, nope, rank] and W_UV^T [H, rank, v].
        module.register_buffer("mlxgraph_w_uk", w[:, :nope].contiguous(), persistent=False)
        module.register_buffer("mlxgraph_w_uv", w[:, nope:].transpose(1, 2).contiguous(),
                               persistent=False)
        module._mlxgraph_original = module.forward
        module._mlxgraph_interleaved = bool(re.search(_INTERLEAVED_ATTENTION, name)
                                            or getattr(module.config, "rope_interleave", False))
        module.forward = types.MethodType(absorbed_forward, module)


def _adapted(config) -> bool:
    return getattr(config, "_attn_implementation", None) == ATTN_IMPLEMENTATION


def _real_rotary(self, x, position_ids):
    """DeepSeek-V2's rotary embedding as (cos, sin) ``[B, T, rope]`` (each frequency twice,
    as DeepSeek-V3's), instead of ``polar(1, freqs) * attention_scaling``: the same numbers."""
    if not _adapted(self.config):
        return self._mlxgraph_original(x, position_ids)
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def _rotate(x, cos, sin, interleaved: bool):
    """RoPE of ``x [B, H, T, rope]`` by ``cos, sin [B, T, rope]``.

    Interleaved (DeepSeek's pairs of adjacent columns, a complex product) comes out with
    each pair's first parts then second parts, as transformers' interleaved form returns
    it; queries and keys share the layout, so the scores are the model's.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if interleaved:
        cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def absorbed_forward(self, hidden_states, position_embeddings=None, attention_mask=None,
                     cache=None, **kwargs):
    """The MLA layer's forward in the absorbed form (see the module docstring).

    Returns (output [B, T, hidden], None) as transformers' attention modules do.
    """
    if not _adapted(self.config):
        return self._mlxgraph_original(hidden_states, position_embeddings=position_embeddings,
                                       attention_mask=attention_mask, cache=cache, **kwargs)
    b, t = hidden_states.shape[:-1]
    nope, rope, rank = self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(b, t, -1, nope + rope).transpose(1, 2)
    q_nope, q_pe = torch.split(q, [nope, rope], dim=-1)
    latent, k_pe = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    latent = self.kv_a_layernorm(latent)
    if hasattr(self, "mla_scale_q_lora"):  # LongCat-Flash's LoRA scaling, in its order
        q_nope, q_pe = q_nope * self.mla_scale_q_lora, q_pe * self.mla_scale_q_lora
        latent = latent * self.mla_scale_kv_lora
    latent = latent.view(b, 1, t, rank)
    k_pe = k_pe.view(b, 1, t, rope)
    cos, sin = position_embeddings
    q_pe = _rotate(q_pe, cos, sin, self._mlxgraph_interleaved)
    k_pe = _rotate(k_pe, cos, sin, self._mlxgraph_interleaved)
    query = torch.cat([q_nope @ self.mlxgraph_w_uk, q_pe], dim=-1)     # [B, H, T, rank + rope]
    key = torch.cat([latent, k_pe], dim=-1)                              # [B, 1, T, rank + rope]
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(ATTN_IMPLEMENTATION, None)
    out, _ = attend(self, query, key, key, attention_mask, scaling=self.scaling,
                    **{**kwargs, VALUES_IN_KEYS: rank})                 # [B, T, H, rank]
    out = out.transpose(1, 2) @ self.mlxgraph_w_uv                       # [B, H, T, v]
    out = out.transpose(1, 2).reshape(b, t, -1)
    return self.o_proj(out), None


__all__ = ["VALUES_IN_KEYS", "absorbed_forward", "install"]
