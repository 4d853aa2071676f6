"""Token choice from logits, in MLX: greedy, or temperature / top-k / top-p / min-p sampling,
a repetition penalty (the logits processor of mlx-lm and transformers), and OpenAI's
presence and frequency penalties and logit bias.

Everything stays lazy (no evaluation here), so a sampler can be part of the step graph
that ``mx.async_eval`` runs while the host builds the next step. Random draws use an
explicit key chain from the seed, so a run is reproducible whatever else uses MLX's
global random state.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

import math
import os
from numbers import Real

import mlx.core as mx

from mlxgraph.generation.options import OptionError, SamplingOptions


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
    kth = mx.sort(logits, axis=-1)[..., vocab - k : vocab - k + 1]
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
    before = mx.cumsum(probs, axis=-1) - probs  # mass strictly above each token
    ranked = mx.where(before < p, ranked, -mx.inf)
    # Undo the sort: scatter the masked values back to vocabulary order.
    return mx.put_along_axis(
        mx.full(logits.shape, -mx.inf, dtype=logits.dtype), order, ranked, axis=-1
    )


def min_p_mask(logits: mx.array, min_p: float) -> mx.array:
    """Drop tokens less likely than ``min_p`` times the most likely one (min-p sampling).

    The most likely token is always kept. Args: logits [..., vocab]; min_p in [0, 1)
    (0 keeps everything).
    """
    if min_p <= 0.0:
        return logits
    # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
    floor = mx.max(logits, axis=-1, keepdims=True) + math.log(min_p)
    return mx.where(logits >= floor, logits, -mx.inf)


def repetition_penalty(logits: mx.array, context: mx.array, penalty: float) -> mx.array:
    """Penalise the tokens of ``context`` (CTRL's rule, as transformers and mlx-lm apply it):
    a positive logit is divided by ``penalty``, a negative one multiplied.

    Args:
        logits: [1, vocab]; context: [n] token ids (n may be 0); penalty: > 0, 1 = off.
    """
    if penalty == 1.0 or context.size == 0:
        return logits
    picked = logits[:, context]
    picked = mx.where(picked < 0, picked * penalty, picked / penalty)
    logits = logits.astype(picked.dtype) if logits.dtype != picked.dtype else logits
    logits[:, context] = picked
    return logits


def occurrence_penalty(logits: mx.array, counts: mx.array, presence: float,
                       frequency: float) -> mx.array:
    """OpenAI's presence and frequency penalties: ``logits - counts * frequency -
    (counts > 0) * presence``.

    Args:
        logits: [1, vocab] float32; counts: [vocab] how many times each token was generated.
    """
    if presence == 0.0 and frequency == 0.0:
        return logits
    return logits - (counts * frequency + (counts > 0).astype(mx.float32) * presence)


def bias_vector(logit_bias: dict, vocab: int) -> mx.array:
    """[vocab] float32: ``logit_bias``'s values at its token ids, 0 elsewhere.

    Raises:
        OptionError: a token id outside [0, vocab).
    """
    ids = sorted(logit_bias)
    if ids[-1] >= vocab:
        raise OptionError("logit_bias", f"token id {ids[-1]} is outside the vocabulary "
                          f"[0, {vocab})")
    bias = mx.zeros((vocab,), dtype=mx.float32)
    bias[mx.array(ids, dtype=mx.int32)] = mx.array([logit_bias[i] for i in ids],
                                                  dtype=mx.float32)
    return bias


class Sampler:
    """Chooses the next token from the last position's logits.

    Args:
        temperature, top_k, top_p, seed, min_p, repetition_penalty: as
            :class:`~mlxgraph.generation.options.SamplingOptions` takes them (which checks
            them), except that a ``seed`` of None is 0 (make_sampler draws one) and a greedy
            sampler takes any seed (it never draws).
        repetition_context: how many of the latest tokens the penalty looks at (mlx-lm's 20);
            the penalty applies to greedy choice too, and sees the prompt.
        presence_penalty, frequency_penalty, logit_bias: as SamplingOptions takes them; they
            apply to greedy choice too, in this order: repetition penalty, presence and
            frequency penalties (over the tokens generated since ``begin``), logit bias.
    Raises:
        OptionError (a ValueError): a setting SamplingOptions refuses, or a context < 1.
    """

    def __init__(
        self,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        repetition_context: int = 20,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: dict | None = None,
    ):
        greedy = isinstance(temperature, Real) and temperature == 0
        o = SamplingOptions(temperature, top_k, top_p, min_p, repetition_penalty,
                            None if greedy else seed, presence_penalty, frequency_penalty,
                            logit_bias or {})
        if isinstance(repetition_context, bool) or not isinstance(repetition_context, int) \
                or repetition_context < 1:
            raise OptionError("repetition_context", f"must be an integer >= 1, got "
                              f"{repetition_context!r}")
        self.temperature, self.top_k, self.top_p, self.seed = (
            o.temperature, o.top_k, o.top_p, o.seed or 0)
        self.min_p, self.repetition_penalty = o.min_p, o.repetition_penalty
        self.repetition_context = repetition_context
        self.presence_penalty, self.frequency_penalty = o.presence_penalty, o.frequency_penalty
        self.logit_bias = o.logit_bias
        self._key = mx.random.key(self.seed)
        self._context = mx.zeros((0,), dtype=mx.int32)
        self._counts = self._bias = None  # [vocab] arrays, made at the first choice

    @property
    def _counting(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def greedy(self) -> bool:
        """True when the choice is argmax."""
        return self.temperature == 0.0

    def begin(self, prompt_ids) -> None:
        """Start a generation: the penalty's context becomes the prompt's last tokens."""
        if self.repetition_penalty != 1.0:
            self._context = mx.array(list(prompt_ids)[-self.repetition_context :], dtype=mx.int32)
        self._counts = None  # the presence and frequency penalties count generated tokens

    def adjust(self, logits: mx.array) -> mx.array:
        """[1, vocab] logits as the choice sees them before temperature and the filters:
        the repetition penalty, the presence and frequency penalties and the logit bias
        applied (the logits themselves when none is set; lazy).

        Raises:
            OptionError: a logit_bias token id outside the vocabulary.
        """
        vocab = logits.shape[-1]
        if self.repetition_penalty != 1.0:
            logits = repetition_penalty(
                logits.astype(mx.float32), self._context, self.repetition_penalty
            )
        if self._counting:
            if self._counts is None:
                self._counts = mx.zeros((vocab,), dtype=mx.float32)
            logits = occurrence_penalty(logits.astype(mx.float32), self._counts,
                                        self.presence_penalty, self.frequency_penalty)
        if self.logit_bias:
            if self._bias is None or self._bias.shape[0] != vocab:
                self._bias = bias_vector(self.logit_bias, vocab)
            logits = logits.astype(mx.float32) + self._bias
        return logits

    def __call__(self, logits: mx.array, allowed=None) -> mx.array:
        """[1, vocab] logits -> [1] token ids (lazy); with a repetition penalty the token
        joins the context, with a presence or frequency penalty its count (lazily, so decode
        stays pipelined). ``allowed``: None, or [vocab] bools (a grammar's next tokens:
        generation/constrained.py), applied after the penalties and the bias, so no other
        token can be chosen, greedy or sampled."""
        logits = self.adjust(logits)
        if allowed is not None:
            logits = mx.where(mx.array(allowed), logits, -mx.inf)
        if self.greedy:
            token = mx.argmax(logits, axis=-1)
        else:
            logits = logits.astype(mx.float32) / self.temperature
            logits = min_p_mask(top_p_mask(top_k_mask(logits, self.top_k), self.top_p), self.min_p)
            self._key, key = mx.random.split(self._key)
            token = mx.random.categorical(logits, axis=-1, key=key)
        if self.repetition_penalty != 1.0:
            recent = mx.concatenate([self._context, token.astype(mx.int32).reshape(-1)])
            self._context = recent[-self.repetition_context :]
        if self._counting:
            hit = mx.arange(self._counts.shape[0]) == token.astype(mx.int32).reshape(-1)
            self._counts = self._counts + hit.astype(mx.float32)
        return token

    def describe(self) -> dict:
        """The settings, as the JSON documents report them."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "seed": None if self.greedy else self.seed,
            # OpenAI's settings, only when set (generate's documents stay as they were)
            **({"presence_penalty": self.presence_penalty} if self.presence_penalty else {}),
            **({"frequency_penalty": self.frequency_penalty} if self.frequency_penalty else {}),
            **({"logit_bias": {str(k): v for k, v in self.logit_bias.items()}}
               if self.logit_bias else {}),
        }


def make_sampler(options: SamplingOptions | None = None) -> Sampler:
    """The Sampler of ``options`` (greedy when None); a seed of None draws one.

    The one way the library, the command line and the server make a sampler.
    """
    options = options if options is not None else SamplingOptions()
    seed = options.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") >> 1
    return Sampler(options.temperature, options.top_k, options.top_p, seed, min_p=options.min_p,
                   repetition_penalty=options.repetition_penalty,
                   presence_penalty=options.presence_penalty,
                   frequency_penalty=options.frequency_penalty, logit_bias=options.logit_bias)


__all__ = [
    "Sampler",
    "bias_vector",
    "make_sampler",
    "min_p_mask",
    "occurrence_penalty",
    "repetition_penalty",
    "top_k_mask",
    "top_p_mask",
]
