"""Session: per-session state (KV stores keyed by layer_id, value slots) and the step loop.

A step builds one lazy MLX graph: no node forces an evaluation, because everything that
decides a shape (the positions, the cache length) is known on the host. A step that is
rejected, or whose graph fails to build, leaves the session exactly as it was: the KV
stores stage their writes and only commit once every node has run.
"""

import threading
from numbers import Integral

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.errors import GraphRuntimeError, SessionError
from mlxgraph.interpreter.kv_cache import CacheError, CachePolicy, LayerGeometry, make_store
from mlxgraph.interpreter.memory import allocatable_bytes
from mlxgraph.interpreter.mlx_dtypes import to_mx_dtype
from mlxgraph.interpreter.node_plan import TENSOR, TENSOR_LIST, VALUE
from mlxgraph.interpreter.session_state import SessionState

DEFAULT_CAPACITY = 4096
# MLX array dimensions are 32-bit: a cache longer than this cannot be allocated.
MAX_CAPACITY = 2**31 - 1


class StepContext:
    """What stateful kernels see of the running step: the session's KV stores (positions
    are not here: the session checked them against the stores before the step began)."""

    __slots__ = ("stores",)

    def __init__(self, stores):
        self.stores = stores

    def store(self, layer_id):
        """The KV store of ``layer_id``."""
        return self.stores[layer_id]


class Session(SessionState):
    """Runs a Program's main chain step by step with its own KV cache. ``fork()``, ``save``,
    ``restore``, ``describe`` are in session_state.py (copy/deepcopy fork; pickle is refused).

    Args:
        program: the loaded Program.
        capacity: the most tokens of history a full-attention layer holds
            (default: the graph's max context, else 4096).
        kv_dtype: storage dtype of the cache ('float16', mx.float16, ...); None = compute dtype.
        windows: ring window per layer: an int for every layer, or {layer_id: window};
            default the graph's own sliding windows. On a sliding layer it only sizes the
            ring (>= the layer's window; 0 = a flat store), never the math; on a
            full-attention layer a window is an approximation (``session.approximations``).
        preallocate: allocate full-attention stores to capacity at once (static) instead of
            growing them by doubling (dynamic).
        max_step: the largest step expected (sizes ring buffers; larger steps still work).
        kv_bits: 0 (floats), 4 or 8: store k/v group-wise affine quantized (mx.quantize).
        kv_group_size: elements per quantization group (32, 64 or 128).
    A session may be used from any thread, one call at a time: a step, trim or reset
    while another thread is inside one raises SessionError (nothing changes).

    Raises:
        SessionError: a bad override (capacity or max_step not an int in [1, 2**31 - 1],
            kv_dtype name, windows naming unknown layers).
        CacheError: a policy a store cannot honour (a non-floating kv_dtype, a negative
            window, a ring window smaller than the layer's own sliding window, kv_bits the
            head dims cannot take), or ``preallocate=True`` asking for more memory than the
            process can allocate.
    """

    def __init__(self, program, capacity=None, kv_dtype=None, windows=None, preallocate=False, max_step=None,
                 kv_bits=0, kv_group_size=64):
        self.program = program
        self._lock = threading.Lock()
        self._thread = threading.get_ident()
        self._options = {"capacity": capacity, "kv_dtype": kv_dtype, "windows": windows, "preallocate": preallocate,
                         "max_step": max_step, "kv_bits": kv_bits, "kv_group_size": kv_group_size}
        meta = program.metadata
        default = meta.max_context if 0 < meta.max_context <= MAX_CAPACITY else DEFAULT_CAPACITY
        self.capacity = self._count("capacity", default if capacity is None else capacity)
        try:
            self.kv_dtype = to_mx_dtype(kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
        except KeyError:
            raise self._fail(f"kv_dtype {kv_dtype!r} is not a dtype name (float32, float16, bfloat16)") from None
        self.max_step = self._count("max_step", min(self.capacity, 512) if max_step is None else max_step)
        self._windows = self._window_per_layer(windows)
        self._preallocate = bool(preallocate)
        self.stores = {}
        self._reset()
        if self._preallocate:
            self._check_preallocation()
        self._input_plan = self._plan_inputs()

    def _fail(self, reason: str) -> SessionError:
        """A SessionError naming the graph file."""
        path = self.program.path
        return SessionError(f"{path if path else '<bytes>'}: {reason}")

    def _count(self, name: str, value) -> int:
        """An option that must be an int in [1, MAX_CAPACITY] (0 is not "the default")."""
        if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= MAX_CAPACITY:
            raise self._fail(f"{name} must be an int in [1, {MAX_CAPACITY}], got {value!r}")
        return int(value)

    def _check_preallocation(self) -> None:
        """Refuse a static cache the process cannot allocate (MLX would crash at evaluation)."""
        itemsize = self.kv_dtype.size if self.kv_dtype is not None else 4  # compute dtype <= float32
        need = sum(s.preallocation_elements() for s in self.stores.values()) * itemsize
        room = allocatable_bytes()
        if room is not None and need > room:
            raise CacheError(f"{self.program.path or '<bytes>'}: preallocate=True needs {need / 2**30:.2f} GiB "
                             f"for capacity {self.capacity}, more than the {room / 2**30:.2f} GiB this process "
                             "can allocate; use a smaller capacity or a growing cache")

    def _window_per_layer(self, windows) -> dict:
        layers = self.program.layers
        if windows is None:
            return {lid: lc.sliding_window for lid, lc in layers.items()}
        if isinstance(windows, Integral) and not isinstance(windows, bool):
            windows = dict.fromkeys(layers, int(windows))
        if not isinstance(windows, dict):
            raise self._fail(f"windows must be an int or a {{layer_id: window}} dict, got {windows!r}")
        unknown = set(windows) - set(layers)
        if unknown:
            raise self._fail(f"windows names layers {sorted(unknown, key=str)}, the graph has {sorted(layers)}")
        for lid, w in windows.items():
            if isinstance(w, bool) or not isinstance(w, Integral) or not 0 <= w <= MAX_CAPACITY:
                raise self._fail(f"window of layer {lid} must be an int in [0, {MAX_CAPACITY}], got {w!r}")
        return {lid: int(windows.get(lid, lc.sliding_window)) for lid, lc in layers.items()}

    def _plan_inputs(self):
        g = self.program.graph
        plan = []
        for name, slot in g.inputs.items():
            t = g.tensors[slot]
            dims = []
            for axis, d in enumerate(t.shape):
                if isinstance(d, str):
                    sym = next(s for s in g.symbols if s.name == d)
                    dims.append((axis, sym))
                else:
                    dims.append((axis, d))
            plan.append((name, slot, to_mx_dtype(t.dtype) if t.dtype else None, dims))
        return plan

    # ------------------------------------------------------------------ state
    @property
    def length(self) -> int:
        """Tokens in the cache: the position the next step must start at."""
        return self._length

    def cache_state(self) -> list:
        """The arrays that hold the KV cache now, e.g. to evaluate after a prefill chunk
        (``mx.eval(*session.cache_state())``) without computing that chunk's logits."""
        return [a for store in self.stores.values() for a in store.state]

    def reset(self) -> None:
        """Forget all history.

        Raises:
            SessionError: another thread is inside a call on this session.
        """
        with self._exclusive():
            self._reset()

    def _reset(self) -> None:
        self.stores = {}
        bits, group = int(self._options["kv_bits"] or 0), int(self._options["kv_group_size"])
        for lid, lc in self.program.layers.items():
            # The geometry is the model's (its own window decides the math); the session's
            # window only decides how the store keeps history (make_store checks the two).
            geometry = LayerGeometry(lid, lc.kv_heads, lc.head_dim, lc.v_head_dim, lc.sliding_window)
            policy = CachePolicy(self.capacity, self.kv_dtype, self._preallocate, self._windows[lid], self.max_step,
                                 bits, group)
            self.stores[lid] = make_store(geometry, policy)
        self._ctx = StepContext(self.stores)
        self._length = 0

    def trim(self, n: int) -> int:
        """Rewind the last ``n`` tokens; returns the new length.

        Raises:
            SessionError: n is not an int between 0 and the length, or another thread is
                inside a call on this session.
            CacheError: a ring store cannot rewind that far (the message says how far it can);
                no store is changed.
        """
        with self._exclusive():
            return self._trim(n)

    def _trim(self, n) -> int:
        if isinstance(n, bool) or not isinstance(n, Integral):
            raise self._fail(f"trim needs an int, got {n!r}")
        n = int(n)
        if n < 0 or n > self._length:
            raise self._fail(f"trim({n}): must be between 0 and the length {self._length}")
        if n == 0:
            return self._length
        # Check every store can rewind before changing any of them.
        for lid, store in self.stores.items():
            limit = getattr(store, "max_trim", None)
            if limit is not None and n > limit:
                raise CacheError(f"layer {lid}: cannot rewind {n} tokens, at most {limit}")
        for store in self.stores.values():
            store.trim(n)
        self._length -= n
        return self._length

    # ------------------------------------------------------------------ step
    def step(self, tokens, positions, observer=None):
        """Run the main chain on one step of tokens.

        Args:
            tokens: [1, T] ints (mx.array, numpy or nested lists).
            positions: [T] host ints (list, range, numpy); must be length .. length+T-1.
            observer: optional ``fn(node_index, node_record, outputs)`` called after each
                node with its outputs (a list); for tools that compare runs.
        Returns:
            The graph's output (``logits`` [1, T, vocab]) as a lazy mx.array; a dict when
            the graph has several outputs.
        Raises:
            SessionError / CacheError: the step is rejected; nothing changed.
            GraphRuntimeError: a node failed; nothing changed.
            Any exception (KeyboardInterrupt included) leaves the session as it was.
        """
        with self._exclusive():
            return self._step(tokens, positions, observer)

    def _exclusive(self):
        """The session's lock, taken without waiting: one call at a time, from any thread.

        A step built in another thread and not yet evaluated cannot be continued here: MLX
        evaluates a lazy array only in the thread whose stream built it.
        """
        if not self._lock.acquire(blocking=False):
            raise self._fail("the session is in use by another thread (one step at a time)")
        try:
            me = threading.get_ident()
            if me != self._thread:
                try:
                    mx.eval(self.cache_state())
                except RuntimeError:
                    raise self._fail("the last step was built in another thread and is not evaluated yet; "
                                     "evaluate it there (mx.eval(session.cache_state())) first") from None
                self._thread = me
        except BaseException:
            self._lock.release()
            raise
        return _Held(self._lock)

    def _step(self, tokens, positions, observer):
        positions = self._host_positions(positions)
        n_new = len(positions)
        if not isinstance(tokens, mx.array):
            tokens = self._host_tokens(tokens)
        elif not mx.issubdtype(tokens.dtype, mx.integer):
            raise self._fail(f"tokens must be integers, got {tokens.dtype}")
        tensors = list(self.program.initial_tensors)
        values = [None] * self.program.value_count
        self._bind_inputs({"tokens": tokens, "positions": positions}, tensors, values)
        begun = []
        try:
            # Every store checks the step fits before any of them is written.
            for store in self.stores.values():
                store.begin(n_new)
                begun.append(store)
            self._run(tensors, values, observer)
        except BaseException:
            # KeyboardInterrupt and SystemExit too: a store left open refuses every later step.
            for store in begun:
                store.rollback()
            raise
        for store in self.stores.values():
            store.commit()
        self._length += n_new
        outs = {name: tensors[slot] for name, slot in self.program.outputs.items()}
        return next(iter(outs.values())) if len(outs) == 1 else outs

    def _host_tokens(self, tokens) -> np.ndarray:
        """Host token ids, checked against the vocabulary: an out-of-range id would index
        past the embedding table and silently give garbage. (Token arrays already in MLX,
        such as a sampler's lazy output, are not read back: that would force an evaluation.)"""
        arr = np.asarray(tokens)
        if arr.dtype.kind not in "iu":
            raise self._fail(f"tokens must be integers, got {arr.dtype}")
        vocab = self.program.metadata.vocab_size
        if arr.size and (arr.min() < 0 or (vocab and arr.max() >= vocab)):
            bad = arr[(arr < 0) | (arr >= vocab)] if vocab else arr[arr < 0]
            raise self._fail(f"token id {int(bad.reshape(-1)[0])} is outside the vocabulary [0, {vocab})")
        return arr

    def _host_positions(self, positions) -> list:
        if isinstance(positions, range):
            pos = list(positions)  # what generation loops pass: no numpy round trip
        else:
            if isinstance(positions, mx.array):
                positions = np.array(positions)
            arr = np.asarray(positions)
            if arr.size and arr.dtype.kind not in "iu":
                # 3.9 is not position 3: a float (or bool) position is a caller's bug.
                raise self._fail(f"positions must be integers, got {arr.dtype}")
            pos = [int(p) for p in arr.reshape(-1)]
        if not pos:
            raise self._fail("a step needs at least one token")
        want = list(range(self._length, self._length + len(pos)))
        if pos != want:
            raise self._fail(
                f"positions {pos[0]}..{pos[-1]} disagree with the cache: the next step must start at "
                f"position {self._length} and be consecutive"
            )
        return pos

    def _bind_inputs(self, given, tensors, values):
        bound = {}
        for name, slot, dtype, dims in self._input_plan:
            if name not in given:
                raise self._fail(f"the graph needs input {name!r}; step() gives tokens and positions")
            arr = given[name]
            arr = arr if isinstance(arr, mx.array) else mx.array(np.asarray(arr))
            if dtype is not None and arr.dtype != dtype:
                arr = arr.astype(dtype)
            if arr.ndim != len(dims):
                raise self._fail(f"input {name}: expected {len(dims)} dims, got shape {tuple(arr.shape)}")
            for axis, d in dims:
                size = arr.shape[axis]
                if isinstance(d, int):
                    if size != d:
                        raise self._fail(f"input {name}: axis {axis} must be {d}, got {size}")
                    continue
                if size < d.min or (d.max is not None and size > d.max):
                    raise self._fail(f"input {name}: {d.name}={size} outside the graph's bounds [{d.min}, {d.max}]")
                if bound.setdefault(d.name, size) != size:
                    raise self._fail(f"input {name}: {d.name}={size} disagrees with {bound[d.name]} from another input")
                if d.value is not None:
                    values[d.value] = size
            tensors[slot] = arr

    def _run(self, tensors, values, observer):
        ctx = self._ctx
        for node in self.program.nodes:
            kw = node.fixed.copy()
            for name, slot in node.tensor_reads:
                kw[name] = tensors[slot]
            for name, how, where in node.reads:
                if how == VALUE:
                    kw[name] = values[where]
                elif how == TENSOR_LIST:
                    kw[name] = [tensors[i] for i in where]
                else:  # OPERAND_LIST: tensors, runtime ints and literals mixed
                    kw[name] = [tensors[w] if h == TENSOR else values[w] if h == VALUE else w for h, w in where]
            if node.needs_context:
                kw["ctx"] = ctx
            try:
                result = node.fn(**kw)
            except Exception as e:
                raise self._node_error(node, e) from e
            if node.out_kind == "value":
                values[node.out_slots[0]] = result
                outputs = [result]
            else:
                outputs = [result] if node.out_kind == "tensor" else list(result)
                for i, (slot, dtype) in enumerate(zip(node.out_slots, node.out_dtypes)):
                    arr = outputs[i]
                    if dtype is not None and isinstance(arr, mx.array) and arr.dtype != dtype:
                        arr = arr.astype(dtype)
                        outputs[i] = arr
                    tensors[slot] = arr
            if observer is not None:
                observer(node.index, node.record, outputs)

    def _node_error(self, node, e: Exception) -> Exception:
        """A kernel's exception, located: the file, node index, op and source."""
        rec = node.record
        if isinstance(e, CacheError):
            # Still a CacheError (the step is rejected, nothing changed), now located.
            return CacheError(f"{self.program.path or '<bytes>'}: node {node.index} ({rec.op[:-4]}): {e}")
        return GraphRuntimeError(self.program.path, node.index, rec.op[:-4], rec.provenance, f"{type(e).__name__}: {e}")


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


__all__ = ["Session", "StepContext", "SessionError"]
