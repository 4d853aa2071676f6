"""Typed options of a generation: how its session is made, and how tokens are chosen.

``SessionOptions`` and ``SamplingOptions`` are frozen dataclasses that check every value when
they are made (the one place these values are checked above the interpreter, which guards
its own API again), so the command line, the server and ``stream_generate`` refuse a bad
setting the same way, before anything is loaded. A bad value raises :class:`OptionError`
naming the option by its field name; the command line turns that name into its flag.

Imports nothing heavy (in particular not mlx): the command line builds these before the
BLAS preload. ``SessionOptions.open`` and ``make_sampler`` (sampling.py) use them.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real

from mlxgraph.generation.defaults import DEFAULT_PREFILL_CHUNK
from mlxgraph.schema.errors import Error

KV_DTYPES = ("float32", "float16", "bfloat16")
KV_BITS = (4, 8)
KV_GROUP_SIZES = (32, 64, 128)
DEFAULT_KV_GROUP_SIZE = 64
# MLX array dimensions are 32-bit: no count of tokens can be larger.
MAX_COUNT = 2**31 - 1


class OptionError(Error, ValueError):
    """A generation option with a bad value (a ValueError too).

    Attributes:
        option: the field's name (``top_p``); requirement: what it must be, and what it was.
    """

    def __init__(self, option: str, requirement: str):
        super().__init__(f"{option} {requirement}")
        self.option, self.requirement = option, requirement


def _int(options, name: str, lo: int, hi: int, optional: bool = False, shown: str = "") -> None:
    """Check (and normalise to int) an integer field in [lo, hi] (``shown``: how the message
    writes the range); None passes when ``optional``."""
    value = getattr(options, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or not lo <= value <= hi:
        shown = shown or f"[{lo}, {hi}]"
        raise OptionError(name, f"must be an integer in {shown}, got {value!r}")
    object.__setattr__(options, name, int(value))


def _number(options, name: str, ok, requirement: str) -> None:
    """Check (and normalise to float) a finite number field for which ``ok(value)`` holds."""
    value = getattr(options, name)
    good = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if not good or not ok(value):
        raise OptionError(name, f"must be {requirement}, got {value!r}")
    object.__setattr__(options, name, float(value))


def _choice(options, name: str, choices: tuple) -> None:
    """Check a field that must be None or one of ``choices``."""
    value = getattr(options, name)
    if value is not None and (isinstance(value, bool) or value not in choices):
        shown = ", ".join(str(c) for c in choices)
        raise OptionError(name, f"must be one of {shown} (or unset), got {value!r}")


@dataclass(frozen=True)
class SessionOptions:
    """How a generation's session (its KV cache) is made.

    Args:
        capacity: KV cache capacity in tokens (None: the model's own maximum, bounded by
            memory; interpreter/session/capacity.py).
        prefill_chunk: prompt tokens per prefill step; also the session's largest step.
        kv_dtype: the KV cache's storage dtype, one of KV_DTYPES (None: the compute dtype).
        kv_bits: store the KV cache quantized to 4 or 8 bits (None: floats).
        kv_group_size: elements per quantization group of ``kv_bits`` (32, 64 or 128).
        window: full-attention layers keep only the last ``window`` tokens (an approximation
            of the model; sliding-window layers keep their own window). None: all of them.
    Raises:
        OptionError: a value of the wrong type or out of its range.
    """

    capacity: int | None = None
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    kv_dtype: str | None = None
    kv_bits: int | None = None
    kv_group_size: int = DEFAULT_KV_GROUP_SIZE
    window: int | None = None

    def __post_init__(self):
        _int(self, "capacity", 1, MAX_COUNT, optional=True)
        _int(self, "prefill_chunk", 1, MAX_COUNT)
        _choice(self, "kv_dtype", KV_DTYPES)
        _choice(self, "kv_bits", KV_BITS)
        if self.kv_group_size not in KV_GROUP_SIZES or isinstance(self.kv_group_size, bool):
            shown = ", ".join(str(g) for g in KV_GROUP_SIZES)
            raise OptionError("kv_group_size", f"must be one of {shown}, got "
                              f"{self.kv_group_size!r}")
        _int(self, "window", 1, MAX_COUNT, optional=True)

    def open(self, program):
        """A new session of ``program`` with these options.

        Raises:
            SessionError, CacheError: a setting this graph cannot honour (a capacity past
                its context, a head dim that is not a multiple of the group size...).
        """
        windows = None
        if self.window is not None:  # full-attention layers only: a sliding window is math
            windows = {lid: lc.sliding_window or self.window for lid, lc in program.layers.items()}
        return program.session(capacity=self.capacity, kv_dtype=self.kv_dtype,
                               max_step=self.prefill_chunk, windows=windows,
                               kv_bits=self.kv_bits or 0, kv_group_size=self.kv_group_size)


MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on a logit_bias value
MAX_PENALTY = 2.0  # OpenAI's bound on presence_penalty and frequency_penalty


def _logit_bias(options) -> None:
    """Check (and normalise to {int: float}) the ``logit_bias`` mapping: token ids >= 0 to
    numbers in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]."""
    value = options.logit_bias
    if not isinstance(value, Mapping):
        raise OptionError("logit_bias", f"must be a mapping of token ids to numbers, got "
                          f"{type(value).__name__}")
    out = {}
    for token, bias in value.items():
        if isinstance(token, bool) or not isinstance(token, Integral) or not \
                0 <= token <= MAX_COUNT:
            raise OptionError("logit_bias", f"keys must be token ids in [0, {MAX_COUNT}], got "
                              f"{token!r}")
        good = isinstance(bias, Real) and not isinstance(bias, bool) and math.isfinite(bias)
        if not good or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise OptionError("logit_bias", f"values must be numbers in [-{MAX_LOGIT_BIAS:g}, "
                              f"{MAX_LOGIT_BIAS:g}], got {bias!r} for token {token}")
        out[int(token)] = float(bias)
    object.__setattr__(options, "logit_bias", out)


# What greedy choice (temperature 0) ignores, with the value that means "off": set to
# anything else it would be silently ignored, so it is refused. The penalties and the logit
# bias change the logits before the argmax: they apply to greedy choice too.
SAMPLING_ONLY = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": None}
GREEDY_IGNORES = ("has no effect with temperature 0 (greedy choice): give a temperature > 0 "
                  "(--temp) to sample, or leave it out")


def _no_filters_when_greedy(options) -> None:
    """Refuse a sampling-only setting under greedy choice (it would be silently ignored)."""
    if options.temperature == 0.0:
        for name, off in SAMPLING_ONLY.items():
            if getattr(options, name) != off:
                raise OptionError(name, GREEDY_IGNORES)


@dataclass(frozen=True)
class SamplingOptions:
    """How the next token is chosen (greedy by default).

    Args:
        temperature: 0 = greedy (argmax); > 0 divides the logits before sampling.
        top_k: keep only the k most likely tokens (0 = off).
        top_p: nucleus sampling mass in (0, 1] (1.0 = off).
        min_p: drop tokens below min_p times the top token's probability, in [0, 1) (0 = off).
        repetition_penalty: > 1 discourages recent tokens, as mlx-lm does (1.0 = off); > 0.
        seed: starts the sampler's key chain, in [0, 2**64) (None: one is drawn).
        top_k, top_p, min_p and seed choose among sampled tokens: set with temperature 0
        they would change nothing, and are refused (the penalties and the bias apply).
        presence_penalty: subtracted from the logit of every token generated so far, in
            [-2, 2] (OpenAI's; 0 = off). The prompt's tokens do not count.
        frequency_penalty: subtracted from a token's logit once per time it was generated,
            in [-2, 2] (OpenAI's; 0 = off).
        logit_bias: {token id: bias in [-100, 100]} added to those logits before every
            choice (OpenAI's; empty = off).
    Raises:
        OptionError: a value of the wrong type or out of its range, or a sampling-only
            setting with temperature 0.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping = field(default_factory=dict)

    def __post_init__(self):
        _number(self, "temperature", lambda v: v >= 0, "a finite number >= 0")
        _int(self, "top_k", 0, 2**64 - 1, shown="[0, 2**64)")
        _number(self, "top_p", lambda v: 0 < v <= 1, "a number in (0, 1]")
        _number(self, "min_p", lambda v: 0 <= v < 1, "a number in [0, 1)")
        _number(self, "repetition_penalty", lambda v: v > 0, "a finite number > 0")
        _int(self, "seed", 0, 2**64 - 1, optional=True, shown="[0, 2**64)")
        for name in ("presence_penalty", "frequency_penalty"):
            _number(self, name, lambda v: -MAX_PENALTY <= v <= MAX_PENALTY,
                    f"a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]")
        _logit_bias(self)
        _no_filters_when_greedy(self)

    @classmethod
    def of(cls, temperature=None, temp=None, **settings) -> "SamplingOptions":
        """The options of keyword settings; ``temp`` is mlx-lm's name for ``temperature``.

        Raises:
            OptionError: a bad value, or both ``temp`` and ``temperature``.
            TypeError: an unknown setting.
        """
        if temp is not None:
            if temperature not in (0.0, None):
                raise OptionError("temperature", "or temp: give one, not both")
            temperature = temp
        return cls(temperature=temperature or 0.0, **settings)


__all__ = [
    "DEFAULT_KV_GROUP_SIZE",
    "KV_BITS",
    "KV_DTYPES",
    "KV_GROUP_SIZES",
    "MAX_LOGIT_BIAS",
    "MAX_PENALTY",
    "OptionError",
    "SAMPLING_ONLY",
    "SamplingOptions",
    "SessionOptions",
]
