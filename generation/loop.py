"""The generation loop: chunked prefill, then a pipelined decode, timed.

Prefill runs the prompt in chunks, evaluating only the KV cache between chunks (so the
unused logits of those positions are never computed, and memory stays bounded by the
chunk); the last chunk's step (``last_only``: the LM head computes its last row alone)
gives the first generated token. With ``on_prefilled`` the last prompt token is a step of
its own, so the hook sees the cache without it.

Decode pipelines: step t+1's graph is built from the still-lazy token of step t and
handed to ``mx.async_eval`` before the host waits for token t, so graph building on the
host overlaps the evaluation of the previous step; from the second token on, since
building a step while the prompt computes would take CPU time from the prefill.

Imports mlx: import this only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

import time
from dataclasses import dataclass

import mlx.core as mx


@dataclass
class GenerationStats:
    """Timings and counts of one generation (filled in as it runs)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0  # start .. first generated token known on the host
    decode_seconds: float = 0.0  # first .. last generated token known on the host
    stop_reason: str = ""  # 'eos' | 'max_tokens' (callers add 'stop_string', 'capacity', ...)
    cached_tokens: int = 0  # history already in the session, not prefilled (chat turns)

    @property
    def prefill_tps(self) -> float:
        """Prompt tokens per second (prompt processing plus the first token)."""
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second after the first one."""
        n = self.generated_tokens - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0


def _step(session, tokens, sampler):
    """One lazy step: feed ``tokens`` ([1, T]) and sample from the last position's logits
    (the only ones computed: the LM head runs on that row alone)."""
    start = session.length
    logits = session.step(tokens, range(start, start + tokens.shape[1]), last_only=True)
    return sampler(logits[:, -1, :])


def _queue_step(session, y, sampler):
    """The next token after the lazy token ``y``, its step queued (``mx.async_eval``)."""
    next_y = _step(session, y.reshape(1, 1), sampler)
    mx.async_eval(next_y)
    return next_y


def prefill(session, prompt_ids, chunk: int) -> None:
    """Feed ``prompt_ids``, ``chunk`` tokens per evaluated step (the cache only: no logits)."""
    for i in range(0, len(prompt_ids), chunk):
        piece = mx.array([prompt_ids[i : i + chunk]], dtype=mx.int32)
        logits = session.step(piece, range(session.length, session.length + piece.shape[1]),
                              last_only=True)
        arrays = session.cache_state()
        mx.eval(arrays if arrays else logits)


def generate(
    session,
    prompt_ids,
    sampler,
    max_tokens: int,
    stop_ids=(),
    prefill_chunk: int = 512,
    stats: GenerationStats | None = None,
    on_prefilled=None,
):
    """Yield generated token ids (ints) one by one.

    Args:
        session: a fresh (or continued) Session; the prompt starts at ``session.length``.
        prompt_ids: the prompt's token ids (at least one).
        sampler: ``[1, vocab] logits -> [1] token`` (lazy), e.g. tools.sampling.Sampler.
        max_tokens: the most tokens to generate (>= 1).
        stop_ids: token ids that end generation (yielded, then the loop stops).
        prefill_chunk: prompt tokens per prefill step.
        stats: a GenerationStats to fill in (times, counts, stop reason).
        on_prefilled: optional ``fn(session)`` called once the prompt but its last token
            is in the cache (e.g. to save it); its time is not counted as prefill.
    Raises:
        ValueError: an empty prompt or max_tokens < 1; the session's own errors
            (SessionError, CacheError, GraphRuntimeError) pass through.
    On return the session holds the prompt and every generated token except the last.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    stats = stats if stats is not None else GenerationStats()
    stats.prompt_tokens, stats.generated_tokens = len(prompt_ids), 0
    stop = frozenset(int(s) for s in stop_ids)
    if hasattr(sampler, "begin"):
        sampler.begin(prompt_ids)
    # The history to leave: the prompt and every token handed over but the last.
    start, handed = session.length, 0
    t0 = time.perf_counter()
    chunk, ids = max(1, int(prefill_chunk)), list(prompt_ids)
    # The prompt's last step (its last chunk, or its last token alone when on_prefilled
    # must see the cache without it) is sampled from: one forward pass, as other engines
    # prefill, not a chunk and then a one-token step.
    last = len(ids) - 1 if on_prefilled is not None else (len(ids) - 1) // chunk * chunk
    prefill(session, ids[:last], chunk)
    if on_prefilled is not None:
        t_hook = time.perf_counter()
        on_prefilled(session)
        t0 += time.perf_counter() - t_hook
    y = _step(session, mx.array([ids[last:]], dtype=mx.int32), sampler)
    mx.async_eval(y)
    t_first = None
    try:
        for n in range(1, max_tokens + 1):
            # Queue step n+1 on the lazy token n before waiting for token n, but not while
            # the prompt computes: building a step takes CPU time from the prefill (its
            # first token came ~10% later on this 2-core machine).
            if 1 < n < max_tokens:
                next_y = _queue_step(session, y, sampler)
            token = int(y.item())
            now = time.perf_counter()
            if t_first is None:
                t_first = now
                stats.prefill_seconds = now - t0
            stats.decode_seconds = now - t_first
            stats.generated_tokens = handed = n
            yield token
            if token in stop:
                stats.stop_reason = "eos"
                return
            if n == 1 and n < max_tokens:
                # Step 2 is queued only after the first token is handed over: MLX's
                # async_eval blocks while many of its CPU kernels are in flight (queueing a
                # small-model decode step returned after ~25 of its ~34 ms), so queueing it
                # first held the first token back by most of a decode step.
                next_y = _queue_step(session, y, sampler)
            if n < max_tokens:
                y = next_y
        stats.stop_reason = "max_tokens"
    finally:
        # A step fed ahead is not part of the history, nor one that went in before an
        # exception (Ctrl-C, the sampler) cut its queueing short: rewound by the lengths.
        extra = session.length - (start + len(ids) + max(handed - 1, 0))
        if extra > 0:
            session.trim(extra)  # (also reads back every pending index check)
        else:
            session.check()  # the last steps' index checks (interpreter/index_guard.py)


__all__ = ["GenerationStats", "generate", "prefill"]
