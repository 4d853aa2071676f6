"""The transport of a pipeline: MLX's distributed layer (``mx.distributed``), every wait
under a deadline.

Rank r runs stage r: activations go r -> r+1 with ``send`` / ``recv`` (neighbours on the
ring), the graph's outputs reach every rank with one ``all_sum`` (the other ranks add
zeros, which is exact), and every collective call first agrees with ``all_gather`` on what
each rank is about to do. A peer that dies closes its sockets, and MLX raises at the next
wait: that becomes a :class:`PipelineError`. A peer that hangs cannot be noticed by MLX
(a ``recv`` blocks in C++), so a watchdog thread ends this process once a wait passes the
deadline, with one line on stderr; its sockets close and every other rank then stops too.
"""

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext

import mlx.core as mx
import numpy as np

from mlxgraph.interpreter.errors import PipelineError

DEFAULT_TIMEOUT = 300.0  # seconds one rank waits for another (a stage's whole compute included)
EXIT_HUNG = 3  # the process exit status when the watchdog ends a rank (README's exit codes)
_FIELDS = 6  # status, then the caller's fields (operation, length, count, digest), message length
_MESSAGE = 240  # bytes of a rejection message carried to every rank


def connect(pipeline, timeout=None) -> "PipelineLink":
    """The link for ``pipeline``: True for the ring of the ranks ``mlx.launch`` started
    (one rank alone when this process was not launched by it), or an
    ``mx.distributed.Group`` of any backend.

    Raises:
        PipelineError: the ring cannot be set up (the host file, ports or peers).
        ValueError: ``pipeline`` is neither, or a timeout that is not a positive number.
    """
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"pipeline timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(pipeline, mx.distributed.Group):
        return PipelineLink(pipeline, float(timeout))
    if pipeline is not True:
        raise ValueError(f"pipeline must be True or an mx.distributed.Group, got {pipeline!r}")
    launched = "MLX_RANK" in os.environ or "MLX_HOSTFILE" in os.environ
    rank = os.environ.get("MLX_RANK", "?")
    with _outside_watch(rank, float(timeout)) if launched else nullcontext():
        try:
            group = mx.distributed.init(strict=launched, backend="ring")
        except RuntimeError as e:
            raise PipelineError(f"rank {rank}: cannot set up the ring backend: {e} (start the "
                                "ranks with mlx.launch; docs/pipeline.md)") from None
    return PipelineLink(group, float(timeout))


# The watcher of a connect: exits when its stdin closes, else tells why and ends the rank.
_WATCH = """import os, select, signal, sys
pid, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if not select.select([sys.stdin], [], [], timeout)[0]:
    sys.stderr.write(message + "\\n"); sys.stderr.flush(); os.kill(pid, signal.SIGTERM)
"""


@contextmanager
def _outside_watch(rank, timeout: float):
    """Like Watchdog.armed, from another process: MLX holds Python's lock while the ring
    connects, so no thread of this process could run if a peer never comes up."""
    message = (f"mlxgraph: pipeline rank {rank}: could not connect the ring in {timeout:g} s "
               "(a rank did not start, or a host or port in the host file is unreachable); "
               "ending this rank")
    watcher = subprocess.Popen([sys.executable, "-c", _WATCH, str(os.getpid()), str(timeout),
                                message], stdin=subprocess.PIPE)
    try:
        yield
    finally:
        watcher.stdin.close()
        watcher.wait()


class Watchdog:
    """Ends this process when an armed wait passes its deadline (a peer hung: MLX would
    block forever). Python threads keep running while MLX waits, so this thread can."""

    def __init__(self, rank, timeout: float):
        self.rank, self.timeout = rank, timeout
        self._cond = threading.Condition()
        self._deadline, self._what = None, ""
        threading.Thread(target=self._watch, daemon=True, name="mlxgraph-pipeline-watch").start()

    def _watch(self):
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    sys.stderr.write(
                        f"mlxgraph: pipeline rank {self.rank}: no answer for {self.timeout:g} s "
                        f"while {self._what} (another rank hung, died or is unreachable); "
                        "ending this rank so that every rank stops\n")
                    sys.stderr.flush()
                    os._exit(EXIT_HUNG)
                self._cond.wait(left)

    @contextmanager
    def armed(self, what: str):
        """Arm the deadline for the block's duration; ``what`` names the wait."""
        with self._cond:
            self._deadline, self._what = time.monotonic() + self.timeout, what
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None


class PipelineLink:
    """One rank's connections: its group, its neighbours and the watchdog."""

    def __init__(self, group, timeout: float):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.timeout = timeout
        self._watchdog = Watchdog(self.rank, timeout)

    def wait(self, arrays, what: str) -> None:
        """Evaluate ``arrays`` (their sends and receives happen now) under the deadline.

        Raises:
            PipelineError: a peer's connection was lost (it died or its machine is gone).
        """
        with self._watchdog.armed(what):
            try:
                mx.eval(arrays)
            except RuntimeError as e:
                raise PipelineError(f"rank {self.rank}: lost another rank while {what} ({e}); "
                                    "the pipeline cannot continue") from None

    def recv(self, shape, dtype):
        """A lazy array that receives the previous rank's next message."""
        return mx.distributed.recv(shape, dtype, self.rank - 1, group=self.group)

    def send(self, array):
        """A lazy array whose evaluation sends ``array`` to the next rank."""
        return mx.distributed.send(array, self.rank + 1, group=self.group)

    def all_sum(self, array):
        """A lazy sum of ``array`` over every rank."""
        return mx.distributed.all_sum(array, group=self.group)

    def agree(self, fields, status: int, message: str = "") -> list:
        """Tell every rank what this one is about to do and whether it can; returns
        ``(status, fields, message)`` of every rank, in rank order. ``fields``: four ints
        that must be equal on every rank for the call to go ahead."""
        if self.size == 1:
            return [(status, tuple(fields), message)]
        raw = message.encode("utf-8", "replace")[:_MESSAGE]
        row = np.zeros(_FIELDS + _MESSAGE, dtype=np.int32)
        row[:_FIELDS] = [status, *[np.int32(np.int64(f) % 2**32 - 2**31) for f in fields],
                         len(raw)]
        row[_FIELDS:_FIELDS + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        everyone = mx.distributed.all_gather(mx.array(row), group=self.group)
        self.wait(everyone, "agreeing on the next call with every rank")
        rows = np.array(everyone).reshape(self.size, -1)
        out = []
        for r in rows:
            text = bytes(r[_FIELDS:_FIELDS + r[_FIELDS - 1]].astype(np.uint8)).decode(
                "utf-8", "replace")
            out.append((int(r[0]), tuple(int(f) for f in r[1:_FIELDS - 1]), text))
        return out

    def gather(self, values) -> list:
        """Every rank's ``values`` (a list of ints below 2**62), in rank order: e.g. the peak
        memory of each rank, or rank 0's sampling seed."""
        mine = mx.array([int(v) for v in values], dtype=mx.int64)
        if self.size == 1:
            return [[int(v) for v in values]]
        everyone = mx.distributed.all_gather(mine, group=self.group)
        self.wait(everyone, "gathering a value from every rank")
        return np.array(everyone).reshape(self.size, -1).tolist()
