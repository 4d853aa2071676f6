"""Positions for decoders that count them from the cache's length.

BART's decoder family (BART, mBART, Marian, Blenderbot, Pegasus, PLBart, MVP as
``*ForCausalLM``) ignores the ``position_ids`` the adapter passes: it computes
``arange(T) + cache.get_seq_length()`` and hands that to its positional embedding module,
whose forward takes ``(…, cache_length, position_ids)``. The adapter runs with
``use_cache=False``, so the length is 0 and every step would embed positions from 0: a
prefill is right and every later step wrong. The step's real positions are a graph input,
so the embedding is given those instead: recognised by what the module asks for (a
``cache_length`` or ``past_key_values_length`` parameter beside ``position_ids``), not by
its class name.
"""

import inspect

import torch

# Parameters through which a module counts positions from the cache's length.
_LENGTH_PARAMETERS = ("cache_length", "past_key_values_length")


def counts_positions_from_cache(module) -> bool:
    """Whether ``module``'s forward takes a cache length beside ``position_ids``."""
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return "position_ids" in params and any(p in params for p in _LENGTH_PARAMETERS)


def install_position_hooks(model, current_positions) -> list:
    """Give each cache-length-counting module of ``model`` the step's own positions.

    Args:
        model: the ``*ForCausalLM``.
        current_positions: ``fn() -> positions [T] | None``: the running adapter step's
            positions, None outside one (the hook then changes nothing, so the model's own
            eager use is untouched).
    Returns:
        the modules hooked (once each: a second adapter over the same model adds nothing).
    """
    hooked = []
    for module in model.modules():
        if getattr(module, "_mlxgraph_position_hook", False) or not counts_positions_from_cache(
                module):
            continue
        signature = inspect.signature(type(module).forward)
        module.register_forward_pre_hook(_hook(signature, current_positions), with_kwargs=True)
        module._mlxgraph_position_hook = True
        hooked.append(module)
    return hooked


def _hook(signature, current_positions):
    def give_positions(module, args, kwargs):
        positions = current_positions()
        if positions is None:
            return None
        bound = signature.bind(module, *args, **kwargs)
        given = bound.arguments.get("position_ids")
        positions = positions.reshape(-1).to(torch.long)
        # The module's own shape for them ([T], or [B, T] where a caller passes that).
        if isinstance(given, torch.Tensor):
            positions = positions.reshape(given.shape)
        bound.arguments["position_ids"] = positions
        for name in _LENGTH_PARAMETERS:  # never read once position_ids is given; 0 anyway
            if name in bound.arguments:
                bound.arguments[name] = 0
        return bound.args[1:], bound.kwargs

    return give_positions


def positions_from_step_length(ep) -> bool:
    """Whether the traced model counts positions from the step's length, not its input.

    True when the logits depend on an ``arange`` (over the step's tokens) and on the
    ``positions`` input only through the attention op's cache placement: the model
    computed its own positions (``arange(T) + cache length``, the length 0 without a
    cache), so every step but a first prefill would be embedded at the wrong positions.
    A model that reads the positions it is given (RoPE, learned embeddings, the hooks
    above) is never flagged; one without any position encoding has no such arange.
    """
    graph = ep.graph
    output = next(n for n in graph.nodes if n.op == "output")
    live, todo = set(), [output]
    while todo:
        node = todo.pop()
        if node in live:
            continue
        live.add(node)
        inputs = node.all_input_nodes
        if node.target is torch.ops.mlxgraph.update_and_attend.default:
            # where the keys go in the cache, not what the model computes from positions
            inputs = [a for a in node.args[:3] + node.args[4:] if isinstance(a, torch.fx.Node)]
        todo.extend(inputs)
    reads_positions = any(n.op == "placeholder" and n.name == "positions" for n in live)
    arange = any(n.op == "call_function" and "arange" in str(n.target) for n in live)
    return arange and not reads_positions
