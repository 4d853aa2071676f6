"""Held-out loss of a graph: the summed negative log-likelihood of token windows, in float64.

benchmarks/perplexity_bench.py and the tests use it to hold a graph's loss against
transformers' on the same tokens. Every window is a fresh prefill in its own session (no
cache carried over), which is exactly what one transformers forward of the window computes.
Bits per byte = total NLL in bits / the UTF-8 bytes of the predicted tokens.
"""

import math

import numpy as np


def windows(ids, length: int) -> list[list[int]]:
    """Windows of at most ``length + 1`` tokens, each starting on the previous one's last token.

    A window's first tokens are the input and its last ``len - 1`` the targets, so every
    token after the first is predicted exactly once.

    Raises:
        ValueError: ``length`` < 1.
    """
    if length < 1:
        raise ValueError(f"window length must be >= 1, got {length}")
    ids = [int(i) for i in ids]
    return [ids[s : s + length + 1] for s in range(0, len(ids) - 1, length)]


def nll_sum(logits, targets) -> float:
    """Summed negative log-likelihood (nats) of ``targets`` under ``logits`` [T, V], in float64."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(z - top).sum(axis=-1))
    picked = z[np.arange(len(targets)), np.asarray(targets)]
    return float((log_norm - picked).sum())


def graph_nll(program, window, **session_options) -> float:
    """Summed NLL (nats) of ``window[1:]`` given ``window[:-1]``, run by the graph ``program``.

    Args:
        program: a loaded mlxgraph Program; window: token ids (at least 2);
        session_options: passed to ``program.session`` (e.g. kv_dtype, kv_bits).
    Raises:
        SessionError: the window is longer than the graph's max T + 1, or a bad option.
    """
    import mlx.core as mx

    inputs = np.asarray(window[:-1], dtype=np.int32)[None]
    session = program.session(capacity=len(window) - 1, **session_options)
    logits = session.step(mx.array(inputs), range(inputs.shape[1]))[0]
    # numpy has no bfloat16: widen on the MLX side first.
    return nll_sum(np.array(logits.astype(mx.float32)), window[1:])


def bits_per_byte(nll_nats: float, nbytes: float) -> float:
    """Bits per byte of a summed NLL in nats over ``nbytes`` bytes of text."""
    return nll_nats / math.log(2) / nbytes


__all__ = ["windows", "nll_sum", "graph_nll", "bits_per_byte"]
