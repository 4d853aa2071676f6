"""Whether a model that attends with one layer more than once per forward gives each call a
cache of its own, as the graph does.

The adapter gives every attention call after a layer's first in one forward a KV cache of
its own (docs/architecture.md#export: DiffLlama's two softmaxes, HRM's and Dory's layers
looped with a cache index per cycle). That is the model's meaning only when the model's own
cache does the same: each call writes its keys to a cache layer no other call writes, and
that layer keeps them. A model whose calls share a cache layer (the second call attends
over the first one's keys too) or read another layer's cache without writing their own
(Dory's ``last_loop`` mode: earlier loops read the last loop's past) computes something
else from the second step on. So such a model's own forward is run once, eagerly, with a
recording ``DynamicCache`` of two tokens, and what its calls did is checked: behaviour, not
class names.
"""

from collections import Counter

import torch

PROBE_TOKENS = 2


def shared_cache_problem(model) -> str | None:
    """Why ``model``'s own cache does not give each attention call its own layer, or None.

    Runs one eager forward of ``PROBE_TOKENS`` tokens with the model's own attention
    implementation and a fresh ``DynamicCache`` whose ``update`` calls are counted.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    writes = Counter()
    update = cache.update

    def counting_update(key_states, value_states, layer_idx, *args, **kwargs):
        writes[int(layer_idx)] += 1
        return update(key_states, value_states, layer_idx, *args, **kwargs)

    cache.update = counting_update
    vocab = int(model.get_input_embeddings().weight.shape[0])
    tokens = torch.arange(1, PROBE_TOKENS + 1).clamp(max=vocab - 1)[None]
    try:
        with torch.no_grad():
            model(input_ids=tokens, cache=cache, use_cache=True,
                  position_ids=torch.arange(PROBE_TOKENS)[None])
    except Exception as e:  # noqa: BLE001 - any failure leaves the question open: refuse
        first = (str(e).strip().splitlines() or [""])[0]
        return f"its own cached forward failed ({type(e).__name__}: {first})"
    for index, count in sorted(writes.items()):
        if count > 1:
            return (f"cache layer {index} is written {count} times in one forward (its calls "
                    "share a cache), where the graph gives each call its own")
        layer = cache.layers[index]
        keys = getattr(layer, "keys", None)
        if not isinstance(keys, torch.Tensor) or keys.shape[-2] == 0:
            return (f"cache layer {index} ({type(layer).__name__}) does not keep the keys "
                    "written to it (a view of another layer's cache), where the graph gives "
                    "each call a cache of its own")
    return None
