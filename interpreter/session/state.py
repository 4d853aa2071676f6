"""A Session's state as a value: fork, copy semantics, policy, describe, save and load.

Mixed into Session (session.py), whose attributes it reads: ``program``, ``stores``,
``_length``, ``_options`` (the constructor's keyword arguments), ``_windows``, ``_ctx``,
and ``_exclusive()`` (the session's one-call-at-a-time lock).
"""

from __future__ import annotations

from mlxgraph.interpreter.session.fork_protocol import ForksOnCopy
from mlxgraph.interpreter.session.lock import handle


class SessionState(ForksOnCopy):
    """fork / save / load / describe of a Session (see the module docstring)."""

    _PICKLE_ADVICE = (
        "use session.fork() for an independent copy, session.save(path) and "
        "program.restore(path) across processes"
    )

    def fork(self):
        """An independent session with the same history (and policy) over the same Program.

        Cheap: the stores share their buffers until one of the two sessions writes (then
        that store copies once, see cache_state). Stepping either never changes the other.

        Raises:
            CacheError: a step is open (only possible from inside an observer).
        """
        with self._exclusive():
            stores, length = {lid: store.fork() for lid, store in self.stores.items()}, self._length
            pending = self._pending.copy()  # a bad lazy token in the history fails both
            # The twin holds handles of this session's arrays, not the arrays (lock.py).
            self._lock.schedule([a for store in stores.values() for a in store.rebind(handle)]
                                + pending.rebind(handle))
        twin = type(self)(self.program, **self._options)
        twin.capacity_reason = self.capacity_reason
        twin.adopt_stores(stores, length)
        twin._pending = pending
        return twin

    @property
    def policy(self) -> dict:
        """The cache policy as plain data: what a saved file records and restore rebuilds."""
        o = self._options
        dtype = self.kv_dtype
        return {
            "capacity": self.capacity,
            "kv_dtype": None if dtype is None else str(dtype).rsplit(".", 1)[-1],
            "kv_bits": int(o.get("kv_bits") or 0),
            "kv_group_size": int(o.get("kv_group_size") or 64),
            "windows": {str(lid): int(w) for lid, w in self._windows.items()},
            "preallocate": bool(o.get("preallocate")),
            "max_step": self.max_step,
        }

    @property
    def approximations(self) -> dict:
        """{layer_id: window} of full-attention layers given a window (they see only the
        last ``window`` tokens: an approximation of the model, like mlx-lm's max_kv_size).
        Chunked-attention layers keep their chunk whatever the window: never approximated."""
        layers = self.program.layers
        return {lid: w for lid, w in self._windows.items()
                if w and not layers[lid].sliding_window and not layers[lid].attention_chunk}

    def describe(self) -> dict:
        """What the session holds, per layer (kind, positions, window, dtype or bits, bytes).

        JSON-ready; the same view as ``mlxgraph cache inspect`` gives for a saved file.

        Raises:
            SessionError / GraphRuntimeError: a pending index check failed (see ``check``).
        """
        with self._exclusive():
            self._raise_failed_checks(keep_latest=False)
            layers = [store.describe() for store in self.stores.values()]
        return {
            "graph": self.program.fingerprint,
            "length": self._length,
            "policy": self.policy,
            "approximations": {str(k): v for k, v in self.approximations.items()},
            "bytes": sum(la["bytes"] for la in layers),
            # What one more position costs over every KV layer (a latent-attention layer
            # keeps its key row alone); null entries (no step yet) count 0.
            "bytes_per_token": sum(la.get("bytes_per_token") or 0 for la in layers),
            # Recurrent states (format 1.3): the states and their kept snapshots.
            "state_bytes": sum(la["bytes"] + la["snapshot_bytes"] for la in layers
                               if "snapshot_bytes" in la),
            "layers": layers,
        }

    def save(self, path, tokens=None) -> int:
        """Save the cache to ``path`` (safetensors, see interpreter/cache/file.py).

        Args:
            path: the file (replaced atomically).
            tokens: optional token ids of the history (``length`` of them), for reuse.
        Returns:
            The file's size in bytes.
        Raises:
            CacheError: a step is open. ValueError: wrong token count. OSError.
            SessionError / GraphRuntimeError: a pending index check failed (see
                ``check``): the session is rewound and nothing is saved.
        """
        from mlxgraph.interpreter.cache.file import save_session

        with self._exclusive():
            # A restored file has no pending checks: a bad lazy token must fail here.
            self._raise_failed_checks(keep_latest=False)
            return save_session(self, path, tokens)

    def restore(self, path) -> None:
        """Replace this session's cache with the one saved in ``path``.

        Raises:
            CacheFileError: unreadable, truncated or changed file, another graph, another
                policy, or a store that refuses its snapshot. The session is unchanged.
        """
        from mlxgraph.interpreter.cache.file import CacheFile, load_into

        cache = path if isinstance(path, CacheFile) else CacheFile(path, check_seal=False)
        with self._exclusive():
            load_into(self, cache)

    def adopt(self, states: dict, length: int) -> None:
        """Install checked store snapshots ({layer_id: checked_snapshot(...)}) and the length."""
        for lid, state in states.items():
            self.stores[lid].load_snapshot(state)
        self._length = length
        # Any thread may continue, and the snapshots' arrays are not the session's (lock.py).
        self._lock.schedule(self._rehandle())

    def adopt_stores(self, stores: dict, length: int) -> None:
        """Take over ``stores`` (e.g. forks) and the length."""
        self.stores = stores
        self._ctx = type(self._ctx)(stores)
        self._length = length
