"""One scheduler round in MLX: prefill chunks and pipelined decode steps of many sessions.

A job's prompt goes in as ``generation/loop.py`` feeds it (all but the last token in
``chunk``-token steps, then the last token, whose logits give the first new token), and
its decode is pipelined the same way: the step after token t is built on the still-lazy
token t and evaluated with the round, before the host reads token t. The decoding jobs'
steps go in as one batched step (``Program.step_batch``: the weights are read once for all
streams). The step fed after a job's last token is rewound when the job ends. Imported in
the scheduler thread only.
"""

import time

import mlx.core as mx

from mlxgraph.generation.sampling import make_sampler
from mlxgraph.generation.stop_text import StopText


class Stepper:
    """Runs rounds over a list of jobs.

    Args:
        chunk: prompt tokens per prefill step; also about the most prompt tokens one round
            prefills (one job's chunk is never split, so the split matches ``generate``).
    """

    def __init__(self, chunk: int, counters=None, on_batch=None):
        self.chunk = int(chunk)
        self.on_batch = on_batch or (lambda rows: None)  # rows of each decode evaluation
        # decode_steps: evaluations of decode rows; decode_rows: rows in them (their ratio
        # is the batch size the server reached); batch_fallbacks: refused batches.
        self.counters = counters if counters is not None else {}
        for key in ("decode_steps", "decode_rows", "batch_fallbacks"):
            self.counters.setdefault(key, 0)

    def begin(self, job, session, reused: int, info) -> None:
        """Attach a session holding ``reused`` prompt tokens and set up sampling and text."""
        job.session, job.fed, job.cached = session, reused, reused
        # every session has the probe's capacity (a leader's fork included)
        room = info.capacity - len(job.ids) + 1 if info.full_attention else job.max_tokens
        job.limit = max(1, min(job.max_tokens, room))
        job.sampler = make_sampler(job.sampling)
        job.sampler.begin(job.ids)
        tok = info.tokenizer
        job.decoder = tok.stream_decoder(job.ids) if tok is not None else None
        job.stops = StopText(job.stop)

    def round(self, jobs) -> list:
        """One round over ``jobs``; returns [(job, finish reason or Exception)] of those that
        ended (their sessions hold prompt + tokens but the last)."""
        decoding = [j for j in jobs if j.decoding]
        work, ended = [], []
        budget = self.chunk
        for job in jobs:
            if job.decoding or budget <= 0 or job.session is None:  # None: a leader's fork
                continue
            try:
                budget -= self._prefill(job, work)
            except Exception as e:  # noqa: BLE001 - this job's step failed; others go on
                ended.append((job, _bare(e)))
        ahead = [j for j in decoding if len(j.tokens) + 1 < j.limit]
        for job, logits in self._decode_logits(ahead):
            try:
                if isinstance(logits, Exception):
                    raise logits
                if job.constraint is not None:  # chosen once y is read and consumed
                    job.ahead_logits = logits
                    work.append(logits)
                    continue
                job.ahead, job.ahead_logprob = self._pick(job, logits)
                work += [job.ahead] + list(job.ahead_logprob or ())
            except Exception as e:  # noqa: BLE001
                ended.append((job, _bare(e)))
        mx.async_eval(work)
        failed = {id(j) for j, _ in ended}
        for job in decoding:
            if id(job) in failed:
                continue
            try:
                reason = self._deliver(job)
            except Exception as e:  # noqa: BLE001
                ended.append((job, _bare(e)))
                continue
            if reason is not None:
                ended.append((job, reason))
        return ended

    def _prefill(self, job, work) -> int:
        """Feed the job's next prompt chunk (and, once the body is in, its last token)."""
        body = len(job.ids) - 1
        fed = 0
        if job.fed < body:
            piece = job.ids[job.fed : min(job.fed + self.chunk, body)]
            start = job.session.length
            job.session.step(mx.array([piece], dtype=mx.int32),
                             range(start, start + len(piece)))
            job.fed += len(piece)
            fed = len(piece)
            work += job.session.cache_state()
        if job.fed == body:
            session = job.session
            start = session.length
            logits = session.step(mx.array([job.ids[-1:]], dtype=mx.int32), [start])[:, -1, :]
            # The other choices of the prompt (n > 1): forks of this session, each sampling
            # its own first token from the same logits.
            waiting = [f for f in job.followers  # a dropped one is released: no sampler
                       if f.session is None and f.sampler is not None and not f.cancelled]
            for twin in [job] + waiting:
                if twin is not job:
                    twin.session, twin.cached = session.fork(), len(job.ids)
                twin.y, twin.y_logprob = self._pick(twin, logits)
                twin.fed = len(job.ids)
                work += [twin.y] + list(twin.y_logprob or ())
            fed += 1
        return fed

    def _decode_logits(self, jobs) -> list:
        """[(job, last logits [1, vocab] or the Exception its step raised)] after feeding each
        job its still-lazy token. The rows go in one batched step (the weights are read once
        for all of them) when the graph allows it; a refused batch falls back to one step
        per job, so one bad row fails only its own job."""
        counters = self.counters
        rewound = {}
        if len(jobs) > 1 and jobs[0].session.program.batching.problem is None:
            lengths = [j.session.length for j in jobs]
            rows = [(j.session, j.y.reshape(1, 1), [n]) for j, n in zip(jobs, lengths)]
            try:
                outs = jobs[0].session.program.step_batch(rows)
                counters["decode_steps"] += 1
                counters["decode_rows"] += len(jobs)
                self.on_batch(len(jobs))
                return [(j, out[:, -1, :]) for j, out in zip(jobs, outs)]
            except Exception as e:  # noqa: BLE001 - find the bad row alone below
                counters["batch_fallbacks"] += 1
                # Nothing changed, but for a session whose earlier step failed its index
                # check: rewound, as its own step would leave it, and that is its error.
                rewound = {id(j): _bare(e) for j, n in zip(jobs, lengths)
                           if j.session.length != n}
        counters["decode_steps"] += len(jobs) - len(rewound)
        counters["decode_rows"] += len(jobs) - len(rewound)
        for _ in range(len(jobs) - len(rewound)):
            self.on_batch(1)
        done = []
        for job in jobs:
            if id(job) in rewound:
                done.append((job, rewound[id(job)]))
                continue
            start = job.session.length
            try:
                done.append((job, job.session.step(job.y.reshape(1, 1), [start])[:, -1, :]))
            except Exception as e:  # noqa: BLE001
                done.append((job, _bare(e)))
        return done

    def _pick(self, job, logits):
        """The job's lazy next token from ``logits`` [1, vocab], and its log-probabilities."""
        allowed = job.constraint.allowed() if job.constraint is not None else None
        token = job.sampler(logits, allowed)
        if job.logprobs is None:
            return token, None
        logp = logits.astype(mx.float32)
        logp = logp - mx.logsumexp(logp, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(logp, token.reshape(1, 1).astype(mx.int32), axis=-1)
        k = min(job.logprobs, logp.shape[-1])
        if k == 0:
            return token, (chosen,)
        top = mx.argpartition(-logp, k - 1, axis=-1)[:, :k]
        return token, (chosen, top, mx.take_along_axis(logp, top, axis=-1))

    def _deliver(self, job):
        """Read the job's token, post it, and return a finish reason when the job ends."""
        token = int(job.y.item())
        job.tokens.append(token)
        if len(job.tokens) == 1:
            job.first_token_at = time.perf_counter()
        if job.constraint is not None:
            job.constraint.consume(token)
        text, hit = job.stops.feed(job.decoder.add(token) if job.decoder is not None else "")
        reason = None
        if hit or token in job.stop_ids:
            reason = "stop"
        elif len(job.tokens) >= job.limit:
            reason = "length"
        job.post(("token", text, token, _logprob(job.y_logprob)))
        if reason is None:
            if job.constraint is not None:
                job.y, job.y_logprob = self._pick(job, job.ahead_logits)
            else:
                job.y, job.y_logprob = job.ahead, job.ahead_logprob
            job.ahead = job.ahead_logprob = job.ahead_logits = None
            return None
        if job.ahead is not None or job.ahead_logits is not None:
            job.session.trim(1)  # the step fed after the last token is not history
        else:
            job.session.check()  # the last steps' index checks (interpreter/index_guard.py)
        tail = "" if hit else (job.decoder.flush() if job.decoder is not None else "")
        tail, tail_hit = job.stops.feed(tail) if not hit else ("", True)
        tail += "" if tail_hit else job.stops.flush()
        if tail:
            job.post(("token", tail, None, None))
        return reason


def _bare(e: Exception) -> Exception:
    """``e`` without its traceback: kept in a list of this round, its frames (and the
    round's arrays they hold) would be a reference cycle, freed only by the collector."""
    e.__traceback__ = None
    return e


def _logprob(lp):
    """(chosen logprob, [(id, logprob), ...] best first) from the evaluated arrays, or None."""
    if lp is None:
        return None
    chosen = float(lp[0].item())
    if len(lp) == 1:
        return chosen, []
    ids, vals = lp[1].tolist()[0], lp[2].tolist()[0]
    return chosen, sorted(zip(ids, vals), key=lambda p: -p[1])


__all__ = ["Stepper"]
