"""Token choice from logits, in MLX: greedy, or temperature / top-k / top-p sampling.

Everything stays lazy (no evaluation here), so a sampler can be part of the step graph
that ``mx.async_eval`` runs while the host builds the next step. Random draws use an
explicit key chain from the seed, so a run is reproducible whatever else uses MLX's
global random state.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.blas).
"""

import math

import mlx.core as mx


def top_k_mask(logits: mx.array, k: int) -> mx.array:
    """Keep the ``k`` largest logits along the last axis; the rest become -inf.

    Args:
        logits: [..., vocab].
        k: how many to keep; k <= 0 or k >= vocab keeps everything.
    """
    vocab = logits.shape[-1]
    if k <= 0 or k >= vocab:
        return logits
    # The k-th largest value is the threshold; ties at the threshold are kept.
    kth = mx.sort(logits, axis=-1)[..., vocab - k: vocab - k + 1]
    return mx.where(logits >= kth, logits, -mx.inf)


def top_p_mask(logits: mx.array, p: float) -> mx.array:
    """Keep the smallest set of most likely tokens whose probability reaches ``p``.

    The most likely token is always kept. Args: logits [..., vocab]; p in (0, 1]
    (p >= 1 keeps everything).
    """
    if p >= 1.0:
        return logits
    order = mx.argsort(-logits, axis=-1)
    ranked = mx.take_along_axis(logits, order, axis=-1)
    probs = mx.softmax(ranked, axis=-1)
    before = mx.cumsum(probs, axis=-1) - probs      # mass strictly above each token
    ranked = mx.where(before < p, ranked, -mx.inf)
    # Undo the sort: scatter the masked values back to vocabulary order.
    return mx.put_along_axis(
        mx.full(logits.shape, -mx.inf, dtype=logits.dtype), order, ranked, axis=-1
    )


class Sampler:
    """Chooses the next token from the last position's logits.

    Args:
        temperature: 0 = greedy (argmax); > 0 divides the logits before sampling.
        top_k: keep only the k most likely tokens (0 = off).
        top_p: nucleus sampling mass (1.0 = off).
        seed: starts the key chain (sampling only).
    Raises:
        ValueError: a negative or non-finite temperature, a negative top_k or seed, or top_p
            outside (0, 1].
    """

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0):
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {top_k}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top-p must be in (0, 1], got {top_p}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        self.temperature, self.top_k, self.top_p, self.seed = (
            float(temperature),
            int(top_k),
            float(top_p),
            int(seed),
        )
        self._key = mx.random.key(self.seed)

    @property
    def greedy(self) -> bool:
        """True when the choice is argmax."""
        return self.temperature == 0.0

    def __call__(self, logits: mx.array) -> mx.array:
        """[batch, vocab] logits -> [batch] uint32 token ids (lazy)."""
        if self.greedy:
            return mx.argmax(logits, axis=-1)
        logits = logits.astype(mx.float32) / self.temperature
        logits = top_k_mask(logits, self.top_k)
        logits = top_p_mask(logits, self.top_p)
        self._key, key = mx.random.split(self._key)
        return mx.random.categorical(logits, axis=-1, key=key)


__all__ = ["Sampler", "top_k_mask", "top_p_mask"]
