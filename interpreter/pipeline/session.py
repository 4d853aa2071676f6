"""PipelineSession: one stage of a pipeline-parallel session; the same API as Session.

Every rank calls the same methods with the same arguments (``step``, ``trim``, ``reset``,
``fork``).
A call first *agrees*: each rank checks the call on its own stage (inputs, positions, every
store's ``begin``), builds its part of the step lazily, and tells every rank whether it
can go ahead (pipeline_link.py ``agree``). When any rank cannot, or the ranks disagree on
the call, every rank rejects it before any store is written and raises the same error.
Then the step runs: receive the previous stage's activations, compute, send to the next,
and the last stage's outputs reach every rank. Stores commit only after that, so a step
that fails anywhere (an index out of range on one rank, a lost peer) leaves every cache
as it was. A step evaluates before it returns (the transfers are the evaluation).
"""

import zlib

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.errors import GraphRuntimeError, PipelineError, SessionError
from mlxgraph.interpreter.node_runner import last_position
from mlxgraph.interpreter.session.lock import handle
from mlxgraph.interpreter.session.options import window_per_layer
from mlxgraph.interpreter.session.session import Session
from mlxgraph.interpreter.session.step_inputs import bind_inputs, checked_tokens, host_positions
from mlxgraph.schema.spec import op_spec

_STEP, _TRIM, _RESET, _OPEN, _FORK = 1, 2, 3, 4, 5
_OK, _SESSION, _CACHE, _RUNTIME = 0, 1, 2, 3
_KINDS = {SessionError: _SESSION, CacheError: _CACHE, GraphRuntimeError: _RUNTIME}


class PipelineSession(Session):
    """A Session over one pipeline stage: this rank's nodes, weights, KV stores and
    recurrent states.

    Made by ``program.session(...)`` on a Program loaded with ``pipeline=``, on every rank
    with the same arguments (a collective call too: a setting one rank's stores refuse is
    refused on every rank). ``fork`` is collective too; ``save`` and ``restore`` are refused.

    Raises (besides Session's):
        PipelineError: a rank was lost; this session cannot continue.
    """

    _PICKLE_ADVICE = "use fork() on every rank for a copy"

    def __init__(self, program, **options):
        # Every rank gets the same arguments: windows may name any layer of the graph (checked
        # against all of them), and this rank's stores take their own layers' windows.
        self._asked_windows = options.get("windows")  # what a fork is made with again
        every = {lc.layer_id: lc for lc in program.metadata.layers}
        self._every_window = window_per_layer(
            every, options.get("windows"), lambda reason: SessionError(
                f"{program.path or '<bytes>'}: {reason}"))
        if isinstance(options.get("windows"), dict):
            options["windows"] = {lid: w for lid, w in options["windows"].items()
                                  if lid in program.layers}
        self.program, self._link, self._stage = program, program.link, program.stage
        self._lost = None  # the PipelineError that ended this pipeline
        error = None
        try:
            super().__init__(program, **options)
        except (SessionError, CacheError) as e:  # e.g. a window only this rank's stores refuse
            error = e
        self._agree_or_raise((_OPEN, 0, 0, 0), error)
        if options.get("capacity") is None:  # the same on every rank: all gather
            self._agree_on_capacity()

    def _agree_on_capacity(self) -> None:
        """Every rank takes the smallest default capacity: each bounds its own by its own
        memory and its own layers (session/capacity.py), and a step must fit on all."""
        agreed = min(c for c, in self._link.gather([self.capacity]))
        if agreed < self.capacity:
            self.capacity = self._options["capacity"] = agreed
            if self._options["max_step"] is None:
                self.max_step = min(agreed, 512)
            self.capacity_reason = "the memory of another rank of the pipeline"
            self._reset()

    @property
    def approximations(self) -> dict:
        """{layer_id: window} of the full-attention layers given a window, on every rank
        (each rank knows the whole graph's layers and the same arguments)."""
        layers = {lc.layer_id: lc for lc in self.program.metadata.layers}
        return {lid: w for lid, w in self._every_window.items()
                if w and not layers[lid].sliding_window and not layers[lid].attention_chunk}

    def fork(self):
        """An independent session with the same history, on every rank (each rank must call
        it, as ``step``): each rank forks its own stores as Session.fork does (cheaply, the
        states and KV buffers shared until either session writes them), after the ranks
        agree on it; the twin's ranks agree as a new session's do. ``copy.copy`` forks."""
        with self._exclusive():
            self._agree_or_raise((_FORK, self._length, 0, 0), None)
            stores, length = {lid: s.fork() for lid, s in self.stores.items()}, self._length
            # The twin holds handles of this session's arrays, not the arrays (session/lock.py).
            self._lock.schedule([a for s in stores.values() for a in s.rebind(handle)])
        twin = type(self)(self.program, **{**self._options, "windows": self._asked_windows})
        twin.capacity_reason = self.capacity_reason
        twin.adopt_stores(stores, length)
        return twin

    # ------------------------------------------------------------ refused
    def save(self, path, tokens=None) -> int:
        """Refused: each rank holds only its own layers' cache."""
        raise self._fail("save() is not supported by a pipeline session")

    def restore(self, path) -> None:
        """Refused: each rank holds only its own layers' cache."""
        raise self._fail("restore() is not supported by a pipeline session")

    # ------------------------------------------------------------ collective calls
    def reset(self) -> None:
        """Forget all history, on every rank (each rank must call it)."""
        with self._exclusive():
            self._agree_or_raise((_RESET, 0, 0, 0), None)
            self._reset()

    def trim(self, n: int) -> int:
        """Rewind the last ``n`` tokens on every rank (each rank must call it); returns the
        new length. Rejected on every rank when one rank's stores cannot rewind that far."""
        with self._exclusive():
            error = None
            try:
                count = self._check_trim(n)
            except (SessionError, CacheError) as e:
                count, error = 0, e
            self._agree_or_raise((_TRIM, self._length, count, 0), error)
            return self._trim(count)

    def check(self) -> None:
        """Nothing to read back: a pipeline step checks its indices before it returns."""
        with self._exclusive():
            self._usable()

    def _step(self, tokens, positions, observer, last_only=False):
        start, begun, flags, error = self._length, [], [], None
        n_new, digest, built = 0, 0, None
        try:
            positions = host_positions(positions, self._length, self._fail)
            n_new = len(positions)
            host = np.array(tokens) if isinstance(tokens, mx.array) else np.asarray(tokens)
            tokens, _ = checked_tokens(host, self.program.metadata.vocab_size, self._fail)
            digest = zlib.crc32(np.ascontiguousarray(tokens, dtype=np.int64).tobytes())
            tensors = list(self.program.initial_tensors)
            values = [None] * self.program.value_count
            shapes = bind_inputs(self._input_plan, {"tokens": tokens, "positions": positions},
                                 tensors, values, self._fail)
            for store in self.stores.values():
                store.begin(n_new)
                begun.append(store)
            built = self._build(tensors, values, dict(shapes), observer, flags,
                                shapes not in self.program.checked_shapes)
        except (SessionError, CacheError, GraphRuntimeError) as e:
            error = e
        except BaseException:
            self._rollback(begun)
            raise
        try:
            self._agree_or_raise((_STEP, start, n_new, digest), error)
            outputs, failed = self._exchange(built, flags)
        except BaseException as e:
            self._rollback(begun)
            if isinstance(e, PipelineError):
                self._lost = e
            raise
        if failed:
            self._rollback(begun)
            raise self._index_error(failed, start, n_new)
        if last_only:   # the stages exchange declared shapes: the head computes every row
            try:
                outputs = last_position(outputs, n_new, self._fail)
            except BaseException:
                self._rollback(begun)
                raise
        for store in self.stores.values():
            store.commit()
        if len(self.program.checked_shapes) < 4096:
            self.program.checked_shapes.add(shapes)
        self._length += n_new
        return next(iter(outputs.values())) if len(outputs) == 1 else outputs

    # ------------------------------------------------------------ parts of a step
    def _build(self, tensors, values, dims, observer, flags, check_sizes):
        """This stage's part of the step as lazy arrays: (received, sent, outputs)."""
        link, stage, dtypes = self._link, self._stage, self.program.tensor_dtypes
        received = []
        for slot in stage.receives:
            tensors[slot] = link.recv(self._shape(slot, dims), dtypes[slot])
            received.append(tensors[slot])
        self._run(tensors, values, observer, flags, check_sizes)
        sent = [self._declared(tensors, s, dims) for s in stage.sends]
        outputs = {}
        for name, slot in self.program.outputs.items():
            shape = self._shape(slot, dims)
            outputs[name] = (self._declared(tensors, slot, dims) if stage.is_last
                             else mx.zeros(shape, dtype=dtypes[slot]))
        return received, sent, outputs

    def _exchange(self, built, flags):
        """Run the transfers in order; returns (outputs, {rank: failing node index})."""
        link = self._link
        received, sent, outputs = built
        where = f"step at position {self._length}"
        for arr in received:  # one at a time: messages between two ranks keep their order
            link.wait(arr, f"receiving the activations of the {where} from rank {link.rank - 1}")
        for arr in sent:
            link.wait(link.send(arr), f"sending the activations of the {where} to rank "
                      f"{link.rank + 1}")
        failing = mx.zeros((link.size,), dtype=mx.float32)
        if flags:
            at = mx.max(mx.stack([mx.where(f, float(node.index + 1), 0.0) for node, f in flags]))
            failing = mx.where(mx.arange(link.size) == link.rank, at, failing)
        if link.size == 1:
            link.wait([*outputs.values(), failing], f"computing the {where}")
        else:
            flat = [a.reshape(-1).astype(mx.float32) for a in outputs.values()]
            total = link.all_sum(mx.concatenate([*flat, failing]))
            link.wait(total, f"sharing the outputs of the {where} (all_sum)")
            parts = mx.split(total, np.cumsum([a.size for a in flat]).tolist())
            outputs = {name: part.reshape(a.shape).astype(a.dtype)
                       for (name, a), part in zip(outputs.items(), parts)}
            failing = parts[-1]
            mx.eval(outputs)
        failed = {r: int(i) - 1 for r, i in enumerate(failing.tolist()) if i > 0}
        return outputs, failed

    def _shape(self, slot, dims) -> tuple:
        """A slot's declared shape with the step's symbol values."""
        return tuple(dims[d] if isinstance(d, str) else d
                     for d in self.program.graph.tensors[slot].shape)

    def _declared(self, tensors, slot, dims):
        """``tensors[slot]``, checked against its declared shape (the message size)."""
        arr, want = tensors[slot], self._shape(slot, dims)
        if tuple(arr.shape) != want:
            raise GraphRuntimeError(self.program.path, None, "pipeline", None,
                                    f"tensor %{slot} has shape {tuple(arr.shape)}, its declared "
                                    f"shape is {want}: it cannot be sent between stages")
        return arr

    # ------------------------------------------------------------ agreement
    def _usable(self) -> None:
        if self._lost is not None:
            raise PipelineError(f"{self._lost} (this pipeline session has ended)")

    def _agree_or_raise(self, fields, error) -> None:
        """Agree with every rank on ``fields``; raise (on every rank alike) when a rank
        reported an error or the ranks disagree. Nothing has been written yet."""
        self._usable()
        kind = _OK if error is None else _KINDS.get(type(error), _SESSION)
        try:
            votes = self._link.agree(fields, kind, "" if error is None else str(error))
        except PipelineError as e:
            self._lost = e
            raise
        for rank, (status, _, message) in enumerate(votes):
            if status != _OK:
                if error is not None:
                    raise error
                cls = CacheError if status == _CACHE else SessionError
                raise cls(f"rank {rank} rejected the call, so every rank did: {message}")
        if len({f for _, f, _ in votes}) > 1:
            said = "; ".join(f"rank {r}: {_describe(f)}" for r, (_, f, _) in enumerate(votes))
            raise self._fail(f"the pipeline ranks disagree on the call ({said}); every rank "
                             "must make the same calls with the same arguments")

    def _rollback(self, begun) -> None:
        for store in begun:
            store.rollback()

    def _index_error(self, failed, start, n_new) -> GraphRuntimeError:
        rank, index = min(failed.items())
        rec = self.program.graph.nodes[index]
        return GraphRuntimeError(self.program.path, index, op_spec(rec.op).short_name,
                                 rec.provenance,
                                 f"an index outside its table on rank {rank}, in the step at "
                                 f"positions {start}..{start + n_new - 1}; the step was "
                                 "rejected on every rank")


def _describe(fields) -> str:
    op, length, count, digest = fields
    if op == _STEP:
        return f"step of {count} token(s) at position {length} (tokens crc {digest & 0xFFFFFFFF:x})"
    if op == _TRIM:
        return f"trim({count}) at length {length}"
    if op == _FORK:
        return f"fork() at length {length}"
    return {_RESET: "reset()", _OPEN: "session()"}.get(op, f"call {op}")
