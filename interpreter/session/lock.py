"""One call at a time on a session, from any thread, and no evaluation raced by another.

The lock is taken without waiting: a second thread gets a clear SessionError instead of
blocking or interleaving with a running call.

A call holding the lock is not the whole story: the lazy arrays a step returns are
evaluated later, by its caller, outside the lock, and MLX must never evaluate one graph
from two threads at once (it crashes: SIGSEGV in a kernel). So before a step returns, the
arrays the session keeps (the KV cache, the index-check flags) are handed to
``mx.async_eval`` (``schedule``) on the stepping thread: from then on no thread evaluates
them again, every later evaluation only waits for them (on any thread: MLX waits for an
array another stream computes through its event, even after that thread has ended). The
step's own outputs are the caller's; what the session builds next only reads the cache,
so a caller evaluating them can race nothing the session touches. The cost is one
``async_eval`` call per step (the graph's traversal is shared with the caller's
evaluation, which then finds the cache part already queued).
"""

import threading

import mlx.core as mx


class SessionLock:
    """The lock of one session and the thread that last used it.

    Args:
        fail: ``fn(reason) -> SessionError`` naming the graph file.
    """

    def __init__(self, fail):
        self._lock = threading.Lock()
        self._thread = threading.get_ident()
        self._fail = fail

    def hold(self, cache_state, settle=True):
        """Take the lock for one call (use as ``with lock.hold(...)``).

        Args:
            cache_state: ``fn() -> arrays`` the session's cache (waited for on a thread
                change, so the new thread never builds on arrays still being computed).
            settle: False for a call that drops the cache (reset): nothing to wait for.
        Raises:
            SessionError: another thread is inside a call, or the last step was built by
                another thread and cannot be evaluated here.
        """
        if not self._lock.acquire(blocking=False):
            raise self._fail("the session is in use by another thread (one step at a time)")
        try:
            me = threading.get_ident()
            if me != self._thread:
                if settle:
                    try:
                        mx.eval(cache_state())
                    except RuntimeError:
                        raise self._fail(
                            "the last step was built in another thread and is not evaluated "
                            "yet; evaluate it there (mx.eval(session.cache_state())) first"
                        ) from None
                self._thread = me
        except BaseException:
            self._lock.release()
            raise
        return _Held(self._lock)

    @staticmethod
    def schedule(arrays) -> None:
        """Queue the evaluation of what the session keeps (inside the call that built it)."""
        if arrays:
            mx.async_eval(arrays)


class _Held:
    """Releases a lock already taken when its ``with`` block ends."""

    __slots__ = ("lock",)

    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False
