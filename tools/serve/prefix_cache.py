"""Kept sessions for prefix reuse: recent finished sessions, least recently used first out,
under a memory budget.

A new request whose token ids share a prefix with a kept session's history forks that
session (a fork shares the buffers: interpreter/session/state.py), rewinds the fork to the
longest shared prefix it can rewind to (a recurrent state's kept snapshots, a ring's
window: ``Session.rewind_target``) and prefills only the rest: the chat case, where each
turn re-sends the whole conversation. Used by the scheduler thread only (it touches MLX arrays).
"""

from collections import OrderedDict

from mlxgraph.generation.chat_session import common_prefix


def cache_bytes(session) -> int:
    """Bytes the session's KV buffers hold (shared buffers counted in full)."""
    return sum(int(a.nbytes) for a in session.cache_state())


class PrefixCache:
    """Kept sessions keyed by the token ids they hold.

    Args:
        budget_bytes: the most bytes of KV buffers kept (0: keep nothing).
        max_entries: the most sessions kept, whatever their size.
    """

    def __init__(self, budget_bytes: int, max_entries: int = 256):
        self.budget, self.max_entries = int(budget_bytes), int(max_entries)
        self._entries = OrderedDict()  # key -> (tokens tuple, session, bytes); newest last
        self._key = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, ids):
        """(a session holding the longest kept prefix of ``ids``, its length), or (None, 0).

        The session is a fork rewound to the shared prefix; at least the last id of ``ids``
        is left to feed (its logits give the first new token).
        """
        best, best_n = None, 0
        for key, (tokens, session, _) in self._entries.items():
            n = min(common_prefix(tokens, ids), len(ids) - 1)
            if n > best_n:
                # Where the session can rewind to: a sliding-window ring only so far back,
                # a recurrent state only to the snapshots it keeps (the step starts).
                n = session.rewind_target(n)
            if n > best_n:
                best, best_n = key, n
        if best is None:
            return None, 0
        tokens, session, _ = self._entries[best]
        self._entries.move_to_end(best)
        fork = session.fork()
        fork.trim(fork.length - best_n)
        return fork, best_n

    def put(self, tokens, session) -> bool:
        """Keep ``session`` (holding ``tokens``); returns False when it does not fit at all.

        Kept sessions whose tokens are a prefix of ``tokens`` are dropped: this one serves
        every request they would.
        """
        tokens = tuple(tokens)
        if not tokens or self.budget <= 0:
            return False
        size = cache_bytes(session)
        if size > self.budget:
            return False
        for key, (held, _, _) in list(self._entries.items()):
            if len(held) <= len(tokens) and tokens[: len(held)] == held:
                self._drop(key)
        self._key += 1
        self._entries[self._key] = (tokens, session, size)
        self.bytes += size
        while self.bytes > self.budget or len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key) -> None:
        _, _, size = self._entries.pop(key)
        self.bytes -= size

    def clear(self) -> None:
        """Forget every kept session."""
        self._entries.clear()
        self.bytes = 0


__all__ = ["PrefixCache", "cache_bytes"]
