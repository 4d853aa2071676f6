"""``batch_generate``: many prompts, one program, decoded together in batched steps.

Each prompt gets its own session and is prefilled alone, in the chunks ``generate`` uses;
then every unfinished row's next token goes into one ``Program.step_batch`` (the weights
are read once for all rows). A row leaves the batch when it ends (an EOS id, a stop
string, ``max_tokens``, or a full KV cache), exactly as ``generate`` would end it.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from mlxgraph.generation.defaults import DEFAULT_MAX_TOKENS, DEFAULT_PREFILL_CHUNK
from mlxgraph.generation.loop import GenerationStats, prefill
from mlxgraph.generation.options import SamplingOptions, SessionOptions
from mlxgraph.generation.sampling import make_sampler
from mlxgraph.generation.stop_text import StopText
from mlxgraph.generation.text import (
    GenerationResult,
    Prompt,
    _is_ids,
    _optional_tokenizer,
    _room,
    prompt_to_ids,
    stop_ids,
)

if TYPE_CHECKING:  # annotations only
    from mlxgraph.interpreter.program import Program


class _Row:
    """One prompt's generation: its session, sampler, text filters and result so far."""

    def __init__(self, ids, session, sampler, limit, decoder, stops):
        self.ids, self.session, self.sampler, self.limit = ids, session, sampler, limit
        self.decoder, self.stops = decoder, stops
        self.tokens, self.pieces, self.reason, self.y, self.t_first = [], [], "", None, 0.0
        self.stats = GenerationStats(prompt_tokens=len(ids))


def batch_generate(
    program: "Program",
    prompts: Sequence[Prompt],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    stop: str | Sequence[str] = (),
    extra_eos: Sequence[int | str] = (),
    ignore_eos: bool = False,
    chat_template: bool | None = None,
    system_prompt: str | None = None,
    tokenizer: Any = None,
    capacity: int | None = None,
    kv_dtype: str | None = None,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    **sampling: Any,
) -> list[GenerationResult]:
    """Generate from every prompt of ``prompts``; return a GenerationResult per prompt, in
    prompt order (what :func:`mlxgraph.generate` returns for it).

    Greedy results equal ``generate``'s for each prompt alone (the batched step's logits
    equal a solo step's within float rounding). With sampling, every prompt gets its own
    sampler seeded with ``seed`` (a seed drawn per prompt when it is None), as ``generate``
    of that prompt alone would be: with a seed the results are reproducible run to run,
    and each equals ``generate(program, prompt, seed=seed, ...)`` unless batched rounding
    tips a draw. A graph whose steps cannot batch (``program.batching.problem``) steps its
    rows one by one, with the same results.

    Args:
        program: a loaded Program (mlxgraph.load).
        prompts: a list of prompts, each text, chat messages or token ids (as ``generate``
            takes them; the chat template applied to text when the tokenizer has one).
        max_tokens, stop, extra_eos, ignore_eos, chat_template, system_prompt, tokenizer,
            capacity, kv_dtype, prefill_chunk: as ``generate`` takes them, for every prompt
            (``capacity``: each prompt's own KV cache).
        sampling: temperature / temp, top_k, top_p, min_p, repetition_penalty, seed,
            presence_penalty, frequency_penalty, logit_bias; greedy by default.
    Raises:
        TypeError: ``prompts`` is not a list of prompts (one text, or one list of ids).
        TokenizerError, ValueError, OptionError: as ``generate``, before any step runs; the
            sessions' own errors (SessionError, CacheError, GraphRuntimeError) pass through.
    """
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or (
            prompts and _is_ids(prompts)) or not all(isinstance(p, (str, list, tuple))
                                                     for p in prompts):
        raise TypeError("prompts must be a list of prompts, each text, chat messages or token "
                        "ids (for one prompt use generate)")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    options = SamplingOptions.of(**sampling)  # a bad setting is refused before any work
    session_options = SessionOptions(capacity=capacity, kv_dtype=kv_dtype,
                                     prefill_chunk=prefill_chunk)
    if tokenizer is None:
        texts = any(not _is_ids(p) for p in prompts)
        tokenizer = program.tokenizer if texts else _optional_tokenizer(program)
    all_ids = [prompt_to_ids(tokenizer, p, chat_template, system_prompt) for p in prompts]
    vocab = program.metadata.vocab_size
    for ids in all_ids:
        bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
    eos = frozenset(stop_ids(program, tokenizer, extra_eos, ignore_eos))
    rows = []
    for ids in all_ids:
        session = session_options.open(program)
        limit = _room(program, session, len(ids), max_tokens)
        decoder = tokenizer.stream_decoder(ids) if tokenizer is not None else None
        rows.append(_Row(ids, session, make_sampler(options), limit, decoder, StopText(stop)))
    for row in rows:
        _prefill(row, session_options.prefill_chunk)
    live = list(rows)
    while live:
        mx.eval([row.y for row in live])
        now = time.perf_counter()
        for row in live:
            row.stats.decode_seconds = now - row.t_first
        live = [row for row in live if not _take(row, int(row.y.item()), eos, max_tokens)]
        _decode_step(program, live)
    return [_result(row) for row in rows]


def _prefill(row, chunk: int) -> None:
    """Feed the row's prompt as ``generate`` does; its first token is ``row.y`` (lazy)."""
    t0 = time.perf_counter()
    row.sampler.begin(row.ids)
    last = (len(row.ids) - 1) // chunk * chunk
    prefill(row.session, row.ids[:last], chunk)
    session = row.session
    start = session.length
    piece = mx.array([row.ids[last:]], dtype=mx.int32)
    logits = session.step(piece, range(start, start + piece.shape[1]), last_only=True)
    row.y = row.sampler(logits[:, -1, :])
    mx.eval(row.y)
    row.t_first = time.perf_counter()
    row.stats.prefill_seconds = row.t_first - t0


def _take(row, token: int, eos, max_tokens: int) -> bool:
    """Hand ``token`` to the row; True when the row has ended (its reason set)."""
    row.tokens.append(token)
    row.stats.generated_tokens = len(row.tokens)
    text, hit = row.stops.feed(row.decoder.add(token) if row.decoder is not None else "")
    row.pieces.append(text)
    if hit:
        row.reason = "stop_string"
    elif token in eos:
        row.reason = "eos"
    elif len(row.tokens) >= row.limit:
        row.reason = "max_tokens" if row.limit >= max_tokens else "capacity"
    else:
        return False
    row.session.check()  # the last steps' index checks (interpreter/index_guard.py)
    if not hit:
        tail = row.decoder.flush() if row.decoder is not None else ""
        text, hit = row.stops.feed(tail)
        row.pieces.append(text + ("" if hit else row.stops.flush()))
        row.reason = "stop_string" if hit else row.reason
    row.stats.stop_reason = row.reason
    return True


def _decode_step(program, live) -> None:
    """Feed every live row its last token in one batched step; sample the next (lazy)."""
    if not live:
        return
    feed = [(r.session, r.y.reshape(1, 1), [r.session.length]) for r in live]
    if len(live) > 1 and program.batching.problem is None:
        outs = program.step_batch(feed)
    else:  # a graph that cannot batch: the same steps, one by one
        outs = [s.step(tokens, positions, last_only=True) for s, tokens, positions in feed]
    for row, logits in zip(live, outs):
        row.y = row.sampler(logits[:, -1, :])


def _result(row) -> GenerationResult:
    return GenerationResult("".join(row.pieces), row.ids, row.tokens, row.reason, row.stats)


__all__ = ["batch_generate"]
