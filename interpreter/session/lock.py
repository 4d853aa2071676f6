"""One call at a time on a session, from any thread, and no MLX array touched by two threads.

The lock is taken without waiting: a second thread gets a clear SessionError instead of
blocking or interleaving with a running call.

A call holding the lock is not the whole story: the lazy arrays a step returns are
evaluated later, by its caller, outside the lock, and MLX must never evaluate one graph
from two threads at once (it crashes: SIGSEGV in a kernel). So before a step returns, the
arrays the session keeps (the KV cache, the index-check flags) are handed to
``mx.async_eval`` (``schedule``) on the stepping thread: from then on no thread evaluates
them again, every later evaluation only waits for them (on any thread: MLX waits for an
array another stream computes through its event, even after that thread has ended).

Waiting is not read-only either: MLX clears an array's event when a wait finds it
signalled (``array::wait``, and every evaluation whose graph reads the array), without a
lock, so two threads waiting on one array race (one tests the event, the other clears it,
the first locks a null mutex: SIGSEGV in ``Event::is_signaled``). So the session never
holds an MLX array that anything outside it holds: a step's outputs read the cache and
flags it keeps, so it keeps ``handle``s of them instead (new arrays of the same values,
no copy), and a fork or ``cache_state`` hands out handles of its arrays; every handle is
queued before the call returns. The caller's graph and the session then share values but
no array, and each array is only ever waited on by its owner.
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


def handle(array):
    """A new MLX array of ``array``'s value (it shares the buffer: no copy), None for None.

    Queued (``schedule``) inside the lock, it no longer refers to ``array`` itself, so
    whoever holds ``array`` and whoever holds the handle wait on different arrays.
    """
    return None if array is None else mx.stop_gradient(array)


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
