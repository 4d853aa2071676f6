"""One call at a time on a session, from any thread.

The lock is taken without waiting: a second thread gets a clear SessionError instead of
blocking or interleaving with a running step. A step built in another thread and not yet
evaluated cannot be continued: MLX evaluates a lazy array only in the thread whose stream
built it, so that case is refused too, with what to do.
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

    def hold(self, cache_state):
        """Take the lock for one call (use as ``with lock.hold(...)``).

        Args:
            cache_state: ``fn() -> arrays`` the session's cache (evaluated on a thread change).
        Raises:
            SessionError: another thread is inside a call, or the last step was built by
                another thread and is not evaluated.
        """
        if not self._lock.acquire(blocking=False):
            raise self._fail("the session is in use by another thread (one step at a time)")
        try:
            me = threading.get_ident()
            if me != self._thread:
                try:
                    mx.eval(cache_state())
                except RuntimeError:
                    raise self._fail(
                        "the last step was built in another thread and is not evaluated yet; "
                        "evaluate it there (mx.eval(session.cache_state())) first"
                    ) from None
                self._thread = me
        except BaseException:
            self._lock.release()
            raise
        return _Held(self._lock)


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
