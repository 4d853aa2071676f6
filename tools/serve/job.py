"""One request inside the scheduler: what was asked, where it stands, and its event channel.

The event loop creates a Job and reads its events; the scheduler thread fills in the run
state (session, lazy next token, tokens so far) and posts events. The only field both
threads write is ``cancelled`` (set by the event loop, read by the scheduler), a plain bool.

Events, in order: ``("token", text, token_id, logprob)`` per generated token (``text`` the
text it completed, maybe ''; ``logprob`` None or (logprob, [(id, logprob), ...])), then one
``("done", finish_reason, usage)`` or ``("error", status, message)``.
"""

import itertools
import time

from mlxgraph.tools.serve.openai_responses import usage

_ids = itertools.count(1)


class Job:
    """A generation request.

    Args:
        ids: the prompt's token ids (at least one).
        max_tokens: the most tokens to generate (the scheduler may lower it to the capacity).
        sampling: its SamplingOptions (generation/options.py).
        stop: stop strings; stop_ids: token ids that end generation.
        logprobs: None, or how many top alternatives to report per token (0: the chosen only).
        post: ``fn(event)`` the scheduler calls (from its thread) to deliver an event.
        constraint: None, or its grammar's Constraint (generation/constrained.py): each
            token is chosen within its mask, so its step is not pipelined ahead.
        leader: another choice of the same prompt (``n`` > 1): this job takes no prompt
            steps of its own but a fork of the leader's session once its prompt is in.
    """

    def __init__(self, ids, max_tokens, sampling, stop=(), stop_ids=(), logprobs=None,
                 post=None, leader=None, constraint=None):
        self.number = next(_ids)
        self.ids = list(ids)
        self.max_tokens = int(max_tokens)
        self.sampling = sampling
        self.stop, self.stop_ids, self.logprobs = tuple(stop), frozenset(stop_ids), logprobs
        self.post = post or (lambda event: None)
        self.cancelled = False
        self.constraint = constraint
        self.failed = False  # set by the scheduler: its waiting forks are dropped with it
        self.leader, self.followers = leader, []
        if leader is not None:
            leader.followers.append(self)
        self.submitted = time.perf_counter()
        self.first_token_at = None  # when the first token was read (the scheduler's)
        # Run state, the scheduler thread's only.
        self.session = None
        self.fed = 0  # prompt tokens in the session
        self.cached = 0  # of those, taken from a kept session
        self.limit = self.max_tokens
        self.sampler = self.decoder = self.stops = None
        self.y = self.y_logprob = None  # the lazy next token (and its log-probabilities)
        self.ahead = self.ahead_logprob = None  # the step queued after y
        self.ahead_logits = None  # constrained: its logits, chosen from once y is read
        self.tokens = []

    @property
    def decoding(self) -> bool:
        """True once the prompt is in and tokens are coming."""
        return self.y is not None

    def usage(self):
        """OpenAI's usage block (a Usage), with the prompt tokens a kept session supplied."""
        return usage(len(self.ids), len(self.tokens), self.cached)

    def release(self) -> None:
        """Drop the run state (the session's memory goes with it)."""
        self.session = self.sampler = self.y = self.y_logprob = None
        self.ahead = self.ahead_logprob = self.ahead_logits = self.constraint = None
        self.leader, self.followers = None, []  # no cycle between the choices


__all__ = ["Job"]
