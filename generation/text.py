"""Text in, text out: ``generate`` and ``stream_generate`` over a loaded Program.

The prompt is text (the chat template applied when the tokenizer has one, as mlx-lm does),
a list of chat messages, or token ids. Generation stops like transformers: at any EOS id of
the model's config and generation_config (plus ``extra_eos``), at a stop string (checked on
the decoded text; the stop string itself is not returned), at ``max_tokens``, or when the
KV cache is full. Text streams through the tokenizer's incremental decoder, holding back
what could still become a stop string.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlxgraph.generation.defaults import DEFAULT_MAX_TOKENS, DEFAULT_PREFILL_CHUNK
from mlxgraph.generation.loop import GenerationStats
from mlxgraph.generation.loop import generate as generate_ids
from mlxgraph.generation.options import SamplingOptions, SessionOptions
from mlxgraph.generation.sampling import make_sampler
from mlxgraph.generation.stop_text import StopText
from mlxgraph.interpreter.text.tokenizer import TokenizerError

if TYPE_CHECKING:  # annotations only
    from mlxgraph.interpreter.program import Program
    from mlxgraph.interpreter.session.session import Session

# What a prompt may be: text, chat messages ({"role", "content"}), or token ids.
Prompt = str | Sequence[dict] | Sequence[int]


@dataclass
class GenerationResponse:
    """One step of :func:`stream_generate`: the text the token completed (maybe ''), the
    token, the live stats, and on the last response the stop reason."""

    text: str
    token: int | None
    stats: GenerationStats
    stop_reason: str | None = None


@dataclass
class GenerationResult:
    """What :func:`generate` returns."""

    text: str
    prompt_ids: list
    token_ids: list
    stop_reason: str  # eos | stop_string | max_tokens | capacity
    stats: GenerationStats


def prompt_to_ids(
    tokenizer, prompt, chat_template: bool | None = None, system_prompt: str | None = None
) -> list:
    """The prompt's token ids.

    Args:
        tokenizer: the graph's tokenizer (may be None for token ids).
        prompt: text, a list of chat messages ({"role", "content"}), or token ids.
        chat_template: None = apply the tokenizer's chat template to text when it has one;
            True = require it; False = encode the text as it is.
        system_prompt: a system message before the text (needs the chat template).
    Raises:
        TokenizerError: no tokenizer for text, no chat template when one is required, or
            text that encodes to no tokens.
    """
    if isinstance(prompt, (list, tuple)) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        if not prompt:
            raise TokenizerError("the prompt has no token ids")
        return [int(t) for t in prompt]
    if tokenizer is None:
        raise TokenizerError("a text prompt needs a tokenizer")
    if isinstance(prompt, str):
        use = chat_template if chat_template is not None else tokenizer.chat_template is not None
        if not use:
            if system_prompt is not None:
                raise TokenizerError("a system prompt needs the chat template (not applied here)")
            ids = tokenizer.encode(prompt)
            if not ids:
                raise TokenizerError("the prompt encodes to no tokens")
            return ids
        prompt = (
            [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        ) + [{"role": "user", "content": prompt}]
    elif chat_template is False:
        raise TokenizerError("chat messages need the chat template")
    ids = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
    if not ids:
        raise TokenizerError("the chat template renders to no tokens")
    return ids


def stop_ids(program, tokenizer=None, extra_eos=(), ignore_eos: bool = False) -> tuple:
    """Every id that ends generation: the graph's EOS ids (config and generation_config),
    the tokenizer's generation_config EOS ids, and ``extra_eos`` (ids or token strings).

    Raises:
        TokenizerError: an extra EOS token that is not in the vocabulary.
    """
    ids = [] if ignore_eos else list(program.metadata.eos_token_ids)
    if tokenizer is not None and not ignore_eos:
        ids += list(tokenizer.generation_eos_ids)
    for token in extra_eos:
        if isinstance(token, int) or (isinstance(token, str) and token.isdigit()):
            ids.append(int(token))
            continue
        found = tokenizer.token_id(token) if tokenizer is not None else None
        if found is None:
            raise TokenizerError(f"extra EOS token {token!r} is not in the vocabulary")
        ids.append(found)
    vocab = program.metadata.vocab_size
    bad = [i for i in ids if i < 0 or (vocab and i >= vocab)]
    if bad:
        raise TokenizerError(f"EOS id {bad[0]} is outside the vocabulary [0, {vocab})")
    return tuple(dict.fromkeys(ids))


def has_full_attention(program, session=None) -> bool:
    """True when some layer attends to the whole history (its cache fills up); sliding-window
    and chunked-attention layers keep a bounded window, and so does a full-attention layer
    that ``session`` windows (an approximation, e.g. generate --window)."""
    windowed = session.approximations if session is not None else {}
    return any(
        lc.sliding_window == 0 and getattr(lc, "attention_chunk", 0) == 0 and not windowed.get(lid)
        for lid, lc in program.layers.items()
    )


def _room(program, session, prompt_len: int, max_tokens: int) -> int:
    """How many tokens fit: the last generated token is never fed back, so with full
    attention capacity - (history + prompt) + 1 do."""
    if not has_full_attention(program, session):
        return max_tokens
    used = session.length + prompt_len
    if used > session.capacity:
        raise ValueError(
            f"the prompt has {prompt_len} tokens, more than the KV capacity of "
            f"{session.capacity - session.length} left"
        )
    return min(max_tokens, session.capacity - used + 1)


def stream_generate(
    program: "Program",
    prompt: Prompt,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    sampler: Callable | None = None,
    stop: str | Sequence[str] = (),
    extra_eos: Sequence[int | str] = (),
    ignore_eos: bool = False,
    chat_template: bool | None = None,
    system_prompt: str | None = None,
    tokenizer: Any = None,
    session: "Session | None" = None,
    capacity: int | None = None,
    kv_dtype: str | None = None,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    stats: GenerationStats | None = None,
    on_prefilled: "Callable[[Session], None] | None" = None,
    **sampling: Any,
) -> Iterator[GenerationResponse]:
    """Generate from ``prompt``, yielding a :class:`GenerationResponse` per token.

    Args:
        program: a loaded Program (mlxgraph.load).
        prompt: text, chat messages, or token ids (see :func:`prompt_to_ids`).
        max_tokens: the most tokens to generate.
        sampler: a Sampler; else one from ``sampling`` (temperature / temp, top_k, top_p,
            min_p, repetition_penalty, seed); greedy by default.
        stop: stop strings (not part of the returned text).
        extra_eos: more ids, or token strings, that end generation; ignore_eos: none do.
        chat_template, system_prompt: see :func:`prompt_to_ids`.
        tokenizer: overrides the graph's own (program.tokenizer).
        session: continue this session (the prompt follows its history); else a new one
            with ``capacity`` and ``kv_dtype``.
        prefill_chunk: prompt tokens per prefill step.
        stats: a GenerationStats to fill in (read it after an interruption).
        on_prefilled: ``fn(session)`` once the prompt but its last token is in the session.
    Raises:
        TokenizerError: the prompt cannot be tokenised, or a bad EOS token.
        ValueError: a bad option, an id outside the vocabulary, a prompt longer than the
            cache; the session's own errors pass through (SessionError, CacheError,
            GraphRuntimeError), leaving it as it was before the failing step.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if sampler is not None and sampling:
        raise ValueError(f"give a sampler or sampling settings ({', '.join(sampling)}), not both")
    # the settings first: a bad one (a seed with temperature 0...) is refused before any work
    sampler = sampler if sampler is not None else make_sampler(SamplingOptions.of(**sampling))
    if tokenizer is None and not _is_ids(prompt):
        tokenizer = program.tokenizer
    elif tokenizer is None:
        tokenizer = _optional_tokenizer(program)
    ids = prompt_to_ids(tokenizer, prompt, chat_template, system_prompt)
    vocab = program.metadata.vocab_size
    bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
    eos = stop_ids(program, tokenizer, extra_eos, ignore_eos)
    if session is None:
        options = SessionOptions(capacity=capacity, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk)
        session = options.open(program)
    limit = _room(program, session, len(ids), max_tokens)
    stats = stats if stats is not None else GenerationStats()
    decoder = tokenizer.stream_decoder(ids) if tokenizer is not None else None
    stops = StopText(stop)
    steps = generate_ids(
        session, ids, sampler, limit, eos, prefill_chunk, stats, on_prefilled=on_prefilled
    )
    try:
        for token in steps:
            text, hit = stops.feed(decoder.add(token) if decoder is not None else "")
            if hit:
                stats.stop_reason = "stop_string"
                yield GenerationResponse(text, token, stats, "stop_string")
                return
            yield GenerationResponse(text, token, stats)
    finally:
        # Ends the loop now (stop string, or the caller stopped early): the step it queued
        # ahead is rewound before anyone reads the session.
        steps.close()
    if stats.stop_reason == "max_tokens" and limit < max_tokens:
        stats.stop_reason = "capacity"
    tail = decoder.flush() if decoder is not None else ""
    text, hit = stops.feed(tail)
    yield GenerationResponse(
        text + ("" if hit else stops.flush()),
        None,
        stats,
        "stop_string" if hit else stats.stop_reason,
    )


def generate(program: "Program", prompt: Prompt, **kwargs: Any) -> GenerationResult:
    """Generate from ``prompt`` and return the whole result (text, ids, stop reason, stats).

    Takes the arguments of :func:`stream_generate`; raises what it raises.
    """
    stats = kwargs.pop("stats", None) or GenerationStats()
    tokenizer = kwargs.get("tokenizer")
    if tokenizer is None:
        tokenizer = program.tokenizer if not _is_ids(prompt) else _optional_tokenizer(program)
        kwargs["tokenizer"] = tokenizer
    ids = prompt_to_ids(tokenizer, prompt, kwargs.get("chat_template"), kwargs.get("system_prompt"))
    pieces, tokens, reason = [], [], ""
    for r in stream_generate(
        program,
        ids,
        stats=stats,
        **{k: v for k, v in kwargs.items() if k not in ("chat_template", "system_prompt")},
    ):
        pieces.append(r.text)
        if r.token is not None:
            tokens.append(r.token)
        reason = r.stop_reason or reason
    return GenerationResult("".join(pieces), ids, tokens, reason, stats)


def _is_ids(prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    )


def _optional_tokenizer(program):
    """The graph's tokenizer, or None when it has none (token-id prompts need none)."""
    try:
        return program.tokenizer
    except TokenizerError:
        return None


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PREFILL_CHUNK",
    "GenerationResponse",
    "GenerationResult",
    "generate",
    "has_full_attention",
    "prompt_to_ids",
    "stop_ids",
    "stream_generate",
]
