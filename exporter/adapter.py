"""Adapt a Hugging Face decoder to the graph's calling convention, without editing its code.

An attention implementation named ``mlxgraph`` is registered with transformers'
``AttentionInterface``; it calls ``mlxgraph::update_and_attend`` instead of computing
attention over a mask. The name is deliberately *not* registered with
``AttentionMaskInterface``: for an implementation that has no mask function, transformers'
mask builders return ``None`` before emitting any op (not even the packed-sequence
detection they run otherwise), so the exported graph holds no mask computation and the
cache alone decides the mask (docs/architecture.md#the-attention-contract).

:class:`DecoderAdapter` wraps a ``*ForCausalLM`` as ``forward(tokens [1, T], positions
[T]) -> logits [1, T, vocab]``, called with ``use_cache=False`` and explicit position ids.
While it runs, each attention call records its layer's cache geometry (kv heads, head
dims, sliding window as the model itself passes it, attention chunk from the config's
layer types), which becomes the graph's metadata. Attention sinks (gpt-oss's ``s_aux``),
logit softcapping (Gemma-2's ``softcap``) and ALiBi slopes go into the op; any other
argument an attention call passes is refused unless it is known not to change the result.
"""

from contextvars import ContextVar

import torch
from transformers import AttentionInterface

from mlxgraph.exporter.alibi_attention import ALIBI_SLOPES
from mlxgraph.exporter.attention_op import ReferenceCache, update_and_attend, using_reference_cache
from mlxgraph.exporter.errors import TraceError
from mlxgraph.exporter.latent_attention import VALUES_IN_KEYS
from mlxgraph.exporter.latent_attention import install as install_latent
from mlxgraph.exporter.model_support import AdapterError, chunked_layers
from mlxgraph.exporter.own_attention import install_own_attention, unlisted_subclass
from mlxgraph.exporter.position_hooks import install_position_hooks
from mlxgraph.exporter.state_adapter import StateRecord, install, recording
from mlxgraph.exporter.static_experts import install_static_experts
from mlxgraph.exporter.trace_scope import torch_reason
from mlxgraph.schema.records import LayerCacheInfo

ATTN_IMPLEMENTATION = "mlxgraph"
# transformers' experts implementation without data-dependent shapes
# (see use_export_friendly_experts).
EXPERTS_IMPLEMENTATION = "batched_mm"

# Attention-call arguments that do not change the result here (bookkeeping, or handled by
# the cache). Any other one with a value is refused: it might change what attention does.
_HARMLESS_KWARGS = frozenset({
    "position_ids", "cache_position", "use_cache", "output_attentions", "is_causal", "layer_idx",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "return_dict",
    "output_hidden_states", "output_router_logits",
})
# What the op implements: sliding window, logit softcapping, attention sinks (gpt-oss),
# latent attention's values read from its keys (exporter/latent_attention.py passes it), and
# ALiBi's slopes per query head (exporter/alibi_attention.py passes them).
_IMPLEMENTED_KWARGS = ("sliding_window", "softcap", "s_aux", VALUES_IN_KEYS, ALIBI_SLOPES)


class TraceRecord:
    """What one adapter records across its forwards: each layer's cache geometry
    ({layer_id: LayerCacheInfo}) and the eager reference cache, plus what the attention
    calls need to know about the model (chunked layers, module paths for messages).

    One object owned by one adapter (one export). torch.export restores a module's plain
    attributes (dicts, numbers) after tracing, which would drop what was recorded; it
    keeps this object, whose contents it does not touch.
    """

    def __init__(self, chunks: dict, paths: dict, spare_layer_id: int = 0):
        self.layers = {}
        # A layer attended again in one forward gets the next id from here (its own cache).
        self.spare_layer_id = spare_layer_id
        self.reference_cache = ReferenceCache()
        self.chunks = chunks
        self.paths = paths


# The forward being run: (positions as [T, 1], its adapter's TraceRecord, the layer ids
# attended so far in this forward, so a reused layer gets a cache of its own). A context
# variable, so adapters running in other threads never see each other's step.
_STEP: ContextVar = ContextVar("mlxgraph_adapter_step", default=None)


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The ``mlxgraph`` attention implementation (transformers' attention-function signature).

    Returns (output [B, T, Hq, Dv], contiguous, None) like the built-in implementations.
    Raises:
        AdapterError: called outside a DecoderAdapter, attention that is not causal, a custom
            mask, or an argument that might change attention and is not implemented.
    """
    step = _STEP.get()
    if step is None:
        raise AdapterError("the mlxgraph attention runs only inside DecoderAdapter.forward")
    position, record, used = step
    layer_id = getattr(module, "layer_idx", None)
    if layer_id is None:
        raise AdapterError(f"{type(module).__name__} has no layer_idx to key its cache by")
    layer_id = int(layer_id)
    where = f"{record.paths.get(id(module), f'layer {layer_id}')} ({type(module).__name__})"
    if layer_id in used:
        # A second call in one forward (DiffLlama's two softmaxes, HRM's reused layers):
        # each call caches its own keys and values, so it gets a cache (a layer id) of its
        # own, numbered after every layer_idx of the model in call order.
        layer_id = max(record.spare_layer_id - 1, *used) + 1
    used.add(layer_id)
    if getattr(module, "is_causal", True) is False or kwargs.get("is_causal") is False:
        raise AdapterError(f"{where}: attention in both directions (is_causal=False): not a "
                           "causal decoder")
    if attention_mask is not None:
        raise AdapterError(f"{where}: an explicit attention mask is not supported")
    # An unknown flag left off (None / False) asks for nothing.
    unknown = sorted(k for k, v in kwargs.items() if v is not None and v is not False
                     and k not in _HARMLESS_KWARGS and k not in _IMPLEMENTED_KWARGS)
    if unknown:
        raise AdapterError(f"{where}: the attention argument {unknown[0]!r} is not supported")
    window = int(kwargs.get("sliding_window") or 0)
    chunk = record.chunks.get(layer_id, 0)
    softcap = float(kwargs.get("softcap") or 0.0)
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    # Latent attention: v is k, its values the first value_width columns (keys-only cache).
    value_width = int(kwargs.get(VALUES_IN_KEYS) or 0)
    if value_width and (value is not key or window or chunk):
        raise AdapterError(f"{where}: latent attention needs its keys as values and no window")
    info = LayerCacheInfo(layer_id, int(key.shape[1]), int(key.shape[-1]),
                          value_width or int(value.shape[-1]), window, chunk, bool(value_width))
    seen = record.layers.setdefault(layer_id, info)
    if seen != info:
        raise AdapterError(
            f"{where} is called twice with different cache geometry: {seen} vs {info}"
        )
    record.reference_cache.windows[layer_id] = window
    record.reference_cache.chunks[layer_id] = chunk
    slopes = kwargs.get(ALIBI_SLOPES)
    if slopes is not None and len(slopes) != query.shape[1]:
        raise AdapterError(f"{where}: {len(slopes)} ALiBi slopes for {query.shape[1]} heads")
    out = torch.ops.mlxgraph.update_and_attend(query, key, value, position, layer_id, scale, None,
                                               kwargs.get("s_aux"), softcap, value_width,
                                               None if slopes is None else list(slopes))
    # Contiguous as transformers' eager attention returns it: models .view() it (afmoe).
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)


def _in_step() -> bool:
    """Whether an adapter step is running (in this thread or task)."""
    return _STEP.get() is not None


def _step_positions():
    """The running adapter step's positions ([T, 1]), None outside one."""
    step = _STEP.get()
    return None if step is None else step[0]


class DecoderAdapter(torch.nn.Module):
    """``forward(tokens [1, T] int, positions [T] int) -> logits [1, T, vocab]``.

    Args:
        model: a transformers ``*ForCausalLM`` in eval mode; its attention implementation
            is switched to ``mlxgraph``, and a mixture-of-experts model's experts
            implementation to ``batched_mm``.
    Raises:
        AdapterError: the model's attention implementation cannot be switched.

    A model whose attention implementation cannot be switched (its attention code does not
    go through transformers' AttentionInterface: RWKV's recurrence; GPT-Neo's, XGLM's, BLOOM's
    and MPT's are routed by own_attention.py) is refused here,
    before tracing; one that switches but whose layers still call none of it leaves
    ``layer_infos()`` empty after a forward, which export() reports. (transformers'
    ``is_backend_compatible()`` flag cannot decide this up front: some models that do use
    the interface, e.g. StableLM, leave it False.)
    """

    def __init__(self, model):
        super().__init__()
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        # Attention computed by the model's own code, routed to ours (own_attention.py).
        if (where := unlisted_subclass(model)) is not None:
            raise AdapterError(f"{where}: an attention implementation other than the one "
                               "whose code is routed to the attention op")
        own = install_own_attention(model, _attention, _in_step)
        # transformers keeps (and only logs about) the implementation of a model whose
        # attention code does not go through the AttentionInterface: nothing would call ours.
        if model.config._attn_implementation != ATTN_IMPLEMENTATION and not own:
            raise AdapterError(
                f"{type(model).__name__}: its attention is not computed through transformers' "
                "AttentionInterface (the implementation cannot be switched), so no layer "
                "would keep a KV cache")
        use_export_friendly_experts(model)
        install(model)  # recurrent layers: mlxgraph::causal_conv / ssd_scan (state_adapter.py)
        install_latent(model)  # MLA in its absorbed form (latent_attention.py)
        # Positional embeddings that count from the cache's length get the step's positions.
        install_position_hooks(model, _step_positions)
        # MoE code that groups tokens by data-dependent sizes (static_experts.py).
        install_static_experts(model, _in_step)
        self.model = model
        # Chunked layers are known from the config: the attention call does not say.
        ids = [getattr(m, "layer_idx", None) for m in model.modules()]
        self.record = TraceRecord(chunked_layers(model.config),
                                  {id(m): p for p, m in model.named_modules()},
                                  1 + max((int(i) for i in ids if isinstance(i, int)), default=-1))
        self.states = StateRecord(self.record.paths)

    def forward(self, tokens, positions):
        """Run one step; also records each attention layer's geometry (see layer_infos).

        Raises:
            TraceError: the model's code depends on tensor values (while tracing).
        """
        token = _STEP.set((positions.reshape(-1, 1), self.record, set()))
        try:
            with using_reference_cache(self.record.reference_cache), recording(self.states):
                out = self.model(input_ids=tokens, position_ids=positions.unsqueeze(0),
                                 use_cache=False)
        except RuntimeError as e:
            # torch's tracer would attach the partial FX graph to a data-dependent error and
            # torch.export print it (pages): it is said in one line instead.
            if "data-dependent" in str(e):
                raise TraceError(torch_reason(e)) from e
            raise
        finally:
            _STEP.reset(token)
        return out.logits

    def layer_infos(self) -> tuple:
        """The geometry recorded by the last forward, ordered by layer_id."""
        layers = self.record.layers
        return tuple(layers[k] for k in sorted(layers))

    def reused_layers(self) -> bool:
        """Whether the last forward attended with a layer more than once (spare ids)."""
        return any(i >= self.record.spare_layer_id for i in self.record.layers)

    def state_infos(self) -> tuple:
        """The recurrent states recorded by the last forward, ordered by layer_id."""
        states = self.states.states
        return tuple(states[k] for k in sorted(states))

    def reset_reference_cache(self) -> None:
        """Forget the eager reference cache's history (keeps the recorded windows)."""
        self.record.reference_cache.reset()


def use_export_friendly_experts(model) -> None:
    """Switch a mixture-of-experts model to transformers' ``batched_mm`` experts, if it has any.

    transformers 5 defaults to ``grouped_mm``, which sorts tokens by expert and cuts them
    into groups of data-dependent sizes (sort, histc, cumsum, grouped_mm: no static
    shapes). ``batched_mm`` gathers each token's top-k expert weights by index and runs one
    batched matmul, so every shape follows the sequence length. Models without a
    switchable experts implementation (dense ones, or MoE code that ignores the setting)
    are left alone.
    """
    if getattr(model.config, "_experts_implementation", None) is None:
        return
    if not model._can_set_experts_implementation():
        return
    model.set_experts_implementation(EXPERTS_IMPLEMENTATION)


__all__ = [
    "DecoderAdapter",
    "AdapterError",
    "ATTN_IMPLEMENTATION",
    "EXPERTS_IMPLEMENTATION",
    "TraceRecord",
    "update_and_attend",
    "use_export_friendly_experts",
]
