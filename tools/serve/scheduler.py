"""The scheduler: the one thread that touches MLX, interleaving every active request.

It loads the Program itself (so every MLX array is made in this thread), then loops in
rounds. A round admits waiting jobs (up to ``max_sessions`` active; a job's session is a
fork of a kept one when their tokens share a prefix), prefills prompt chunks of waiting
jobs up to one chunk's worth of tokens, and queues one batched decode step for all decoding
jobs (``Program.step_batch``); all of it goes to one ``mx.async_eval``, and while that
runs the host reads the tokens the previous round computed and posts them. So one long
prompt costs the streams at most a chunk per token, never its whole prefill. Prefill
splits the prompt exactly as ``mlxgraph.generate`` does (``prefill_chunk`` tokens, then
the last token alone), so a greedy stream is token for token a solo ``generate`` of its
prompt (batched decode rows equal solo steps within float rounding).
A job cancelled by the event loop (client gone) is dropped at the start of the next round
with its session; a finished one leaves its session to the prefix cache.
"""

import collections
import logging
import threading
import time
from dataclasses import dataclass, replace

from mlxgraph.tools.serve.openai_requests import RequestError
from mlxgraph.tools.serve.options import ServeOptions

log = logging.getLogger("mlxgraph.serve")
COUNTERS = ("requests", "prefix_hits", "prompt_tokens", "reused_tokens", "completion_tokens",
            "cancelled", "failed", "refused_busy", "decode_steps", "decode_rows",
            "batch_fallbacks")


@dataclass
class ModelInfo:
    """What the request handlers need from the loaded graph (no MLX objects)."""

    tokenizer: object
    stop_ids: tuple
    vocab_size: int
    capacity: int
    full_attention: bool
    approximations: dict  # {layer_id: window} of full-attention layers under --window
    capacity_reason: str = ""  # why that capacity (session/capacity.py)


class Scheduler:
    """Owns the Program, the sessions and MLX; the event loop talks to it through
    :meth:`submit` and :meth:`cancel` (thread-safe) and reads :meth:`stats`."""

    def __init__(self, options: ServeOptions):
        self.options = options
        self.info = None
        self._cond = threading.Condition()
        self._pending = collections.deque()
        self._active = []
        self._closing = self._stopped = False
        self._loaded = threading.Event()
        self._load_error = None
        self._thread = threading.Thread(target=self._main, name="mlxgraph-scheduler", daemon=True)
        # Every key there from the start: stats() copies the dict while this thread counts,
        # and a key added during the copy would break it ("changed size during iteration").
        self.counters = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.metrics = None  # the app's Metrics (tools/serve/metrics.py), when it has one

    # ------------------------------------------------------------ event-loop side
    def start(self) -> ModelInfo:
        """Start the thread and wait until the graph is loaded.

        Raises:
            Exception: whatever loading the graph raised (ToolError for a bad file).
        """
        self._thread.start()
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.info

    def submit(self, jobs) -> None:
        """Queue a request's jobs (its choices, admitted together: at most max_sessions).
        Raises RequestError: 503 when closing, 429 when the queue is full."""
        with self._cond:
            if self._closing:
                raise RequestError("the server is shutting down", status=503,
                                   kind="server_error")
            opts = self.options
            waiting = sum(len(group) for group in self._pending)
            if len(self._active) + waiting + len(jobs) > opts.max_sessions + opts.max_queue:
                self.counters["refused_busy"] += 1
                raise RequestError(
                    f"too many requests: {len(self._active)} generating and "
                    f"{waiting} waiting; try again shortly",
                    status=429, kind="rate_limit_error", code="rate_limit_exceeded")
            self._pending.append(list(jobs))
            self._cond.notify()

    def cancel(self, job) -> None:
        """Stop a job (its client is gone); its session is freed at the next round."""
        job.cancelled = True
        with self._cond:
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, cancel the rest, stop the thread."""
        with self._cond:
            self._closing = self._stopped = True
            for job in self._jobs():
                job.cancelled = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def refuse_new(self) -> None:
        """From now on, submit answers 503 (graceful shutdown: streams in flight go on)."""
        with self._cond:
            self._closing = True

    def stats(self) -> dict:
        """Counters: requests, tokens prefilled and reused, decode steps and the rows they
        batched, kept sessions, active, waiting."""
        cache = getattr(self, "_cache", None)
        with self._cond:
            doc = dict(self.counters)
            doc.update(active=len(self._active),
                       waiting=sum(len(group) for group in self._pending))
        doc.update(kept_sessions=len(cache) if cache is not None else 0,
                   kept_bytes=cache.bytes if cache is not None else 0)
        return doc

    def _jobs(self) -> list:
        return [j for group in self._pending for j in group] + list(self._active)

    # ------------------------------------------------------------ scheduler thread
    def _main(self) -> None:
        try:
            self._load()
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._load_error = e
            self._loaded.set()
            return
        self._loaded.set()
        try:
            self._loop()
        finally:
            for job in self._jobs():
                self._fail(job, 503, "the server is shutting down")
            self._active.clear()
            self._cache.clear()

    def _load(self) -> None:
        from mlxgraph.generation.text import has_full_attention, stop_ids
        from mlxgraph.tools.output import ToolError
        from mlxgraph.tools.serve.prefix_cache import PrefixCache
        from mlxgraph.tools.serve.stepping import Stepper
        from mlxgraph.tools.text_options import open_session

        opts = self.options
        program, tokenizer = opts.source.open(need_tokenizer=False)
        self._program = program
        probe = open_session(program, opts.session, opts.source.graph)  # ToolError: exit 2
        try:
            eos = stop_ids(program, tokenizer)
        except Exception as e:  # noqa: BLE001 - a bad EOS list in the file
            raise ToolError(f"{opts.source.graph}: {e}") from None
        self.info = ModelInfo(tokenizer, eos, program.metadata.vocab_size, probe.capacity,
                              has_full_attention(program, probe), dict(probe.approximations),
                              probe.capacity_reason)
        # Every request gets the probe's capacity, what the handlers check prompts against
        # (a default bounded by memory could differ from one request to the next).
        self._session_options = replace(opts.session, capacity=probe.capacity)
        self._cache = PrefixCache(opts.cache_bytes)
        self._stepper = Stepper(opts.session.prefill_chunk, self.counters, self._batch)

    def _batch(self, rows: int) -> None:
        if self.metrics is not None:
            self.metrics.batch(rows)

    def _new_session(self):
        from mlxgraph.tools.output import ToolError
        from mlxgraph.tools.text_options import open_session

        opts = self.options
        try:
            return open_session(self._program, self._session_options, opts.source.graph)
        except ToolError as e:
            raise RequestError(str(e), status=500, kind="server_error") from None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._pending and not self._active:
                    self._cond.wait()
                if self._stopped:
                    return
                admitted = []  # a request's choices together (forks of one prompt)
                while self._pending and len(self._active) + len(admitted) + len(
                        self._pending[0]) <= self.options.max_sessions:
                    admitted += self._pending.popleft()
            for job in admitted:
                if not self._dropped(job):
                    self._admit(job)
            self._active = [j for j in self._active if not self._dropped(j)]
            if self._active:
                self._round()

    def _dropped(self, job) -> bool:
        # A choice waiting for its leader's prompt, the leader gone: the request has its error
        orphan = job.session is None and job.leader is not None and (
            job.leader.cancelled or job.leader.failed)
        if job.cancelled or orphan:
            self.counters["cancelled"] += 1
            job.release()
            return True
        return False

    def _admit(self, job) -> None:
        try:
            if job.leader is not None:  # a fork of the leader's session, once its prompt is in
                session, reused = None, 0
            else:
                session, reused = self._cache.take(job.ids)
                session = session if session is not None else self._new_session()
            self._stepper.begin(job, session, reused, self.info)
        except RequestError as e:
            self._fail(job, e.status, e.message)
            return
        except Exception as e:  # noqa: BLE001 - a bad request must not stop the server
            self._fail(job, 500, f"{type(e).__name__}: {e}")
            return
        if job.leader is None:
            self.counters["requests"] += 1
            self.counters["prompt_tokens"] += len(job.ids)
            self.counters["reused_tokens"] += reused
            self.counters["prefix_hits"] += reused > 0
        with self._cond:
            self._active.append(job)

    def _round(self) -> None:
        try:
            finished = self._stepper.round(self._active)
        except Exception as e:  # noqa: BLE001 - fail this round's jobs, keep serving
            log.exception("a scheduler round failed")
            for job in self._active:
                self._fail(job, 500, f"{type(e).__name__}: {e}")
            self._active = []
            return
        for job, outcome in finished:
            self._active.remove(job)
            if isinstance(outcome, Exception):
                self._fail(job, 500, f"{type(outcome).__name__}: {outcome}")
                continue
            self.counters["completion_tokens"] += len(job.tokens)
            if job.session is not None:
                self._cache.put(job.ids + job.tokens[:-1], job.session)
            log.info("request %d: %d prompt tokens (%d reused), %d generated, %s",
                     job.number, len(job.ids), job.cached, len(job.tokens), outcome)
            if self.metrics is not None:
                self.metrics.finished(job, time.perf_counter())
            job.post(("done", outcome, job.usage()))
            job.release()

    def _fail(self, job, status, message) -> None:
        self.counters["failed"] += 1
        job.failed = True
        job.post(("error", status, message))
        job.release()


__all__ = ["ModelInfo", "Scheduler"]
