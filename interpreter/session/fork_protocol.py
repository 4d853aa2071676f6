"""copy/deepcopy fork, pickle refuses: one protocol for sessions and stores.

Both hold MLX arrays that must never be aliased between two histories, so a shallow copy
would share a KV store; copying forks instead, and pickling names the supported ways.
"""


class ForksOnCopy:
    """Mixin: ``copy.copy`` and ``copy.deepcopy`` call ``fork()``; pickling raises TypeError.

    A class sets ``_PICKLE_ADVICE`` (what to use instead) and defines ``fork()``.
    """

    _PICKLE_ADVICE = "use fork() for an independent copy"

    def __copy__(self):
        return self.fork()

    def __deepcopy__(self, memo):
        # What a fork shares (the immutable Program) is shared on purpose.
        return self.fork()

    def __reduce_ex__(self, protocol):
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled (it holds MLX arrays): "
            f"{self._PICKLE_ADVICE}"
        )
