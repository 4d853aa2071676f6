"""Tokenizing in a process of its own, killed past its deadline.

The tokenizers library runs a tokenizer's regexes in Oniguruma, whose backtracking limit
turns an exponential pattern into an error but lets a merely slow one (``(a+)+$`` on runs
of 22 ``a``: 0.2 s a run) go on for as long as the text is long, and no Python thread can
stop a call into the library (it holds the GIL: not even a timer thread runs meanwhile).
So a Hugging Face tokenizer's chat template and encode run in a worker process (under a
4 GiB address-space limit) wherever a deadline matters: ``mlxgraph serve`` has one per
tokenizing thread, and a request past ``--tokenize-timeout`` has its process killed (a
400; the next request starts a fresh one); ``generate`` and ``chat`` have one
(tools/command_deadline.py). A process the library crashes is one failed call, not a dead
server.

Protocol: one JSON line each way. The parent first sends ``{"files", "origin"}`` and reads
``{"ready": true}``; then each request ``{"text"}`` or ``{"messages", "limits"}`` gets
``{"ids": [...]}`` or ``{"error": "one line"}``.

    python -m mlxgraph.tools.tokenize_process      (started by TokenizerProcess)
"""

import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import time
from dataclasses import asdict

from mlxgraph.interpreter.errors import TokenizerError

MEMORY_LIMIT = 4 << 30  # bytes of address space a worker may map
START_SECONDS = 60.0  # to import the library and load the tokenizer


class TokenizerProcess:
    """One worker process holding the tokenizer; ``encode`` and ``apply_chat_template`` as
    the tokenizer's, with a deadline. Not thread-safe: one caller at a time (a pool hands
    each to one thread).

    Args:
        tokenizer: the HFTokenizer loaded in this process (its files go to the worker).
        timeout: seconds one call may take before the worker is killed.
    """

    def __init__(self, tokenizer, timeout: float):
        self.name, self.chat_template = tokenizer.name, tokenizer.chat_template
        self._files, self.timeout, self._proc = tokenizer.files, float(timeout), None
        self._starting = False

    def start(self) -> None:
        """Start the worker without waiting for it (the first call waits for it to be ready)."""
        self.close()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mlxgraph.tools.tokenize_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        self._proc.stdin.write(json.dumps({"files": self._files, "origin": self.name}).encode()
                               + b"\n")
        self._proc.stdin.flush()
        self._starting = True

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        """Raises TokenizerError (the tokenizer's own, or past the deadline)."""
        return self._call({"text": text, "special": add_special_tokens})

    def apply_chat_template(self, messages, add_generation_prompt=True, limits=None, **extra):
        """``extra``: more template variables (JSON values). Raises TokenizerError (the
        template's own, or past the deadline)."""
        return self._call({"messages": [dict(m) for m in messages],
                           "generation_prompt": add_generation_prompt, "extra": extra,
                           "limits": asdict(limits) if limits is not None else None})

    def close(self) -> None:
        """Kill the worker (a later call starts a new one)."""
        # Taken first: the server's shutdown closes a worker that a request's thread may be
        # closing too (past its deadline); both must not kill and wait the same process.
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()

    def _call(self, request: dict) -> list:
        if self._proc is None or self._proc.poll() is not None:
            self.start()
        if self._starting:
            reply = self._exchange(None, START_SECONDS)
            self._starting = False
            if "error" in reply:
                raise TokenizerError(reply["error"])
        reply = self._exchange(request, self.timeout)
        if "error" in reply:
            raise TokenizerError(reply["error"])
        return reply["ids"]

    def _exchange(self, message: dict, timeout: float) -> dict:
        """Send one line (unless None), read one line within ``timeout``; a worker that dies
        or runs past it is killed and the call raises TokenizerError."""
        proc, deadline = self._proc, time.monotonic() + timeout
        try:
            if message is not None:  # None: read the reply to what start() sent
                proc.stdin.write(json.dumps(message).encode() + b"\n")
                proc.stdin.flush()
            while not select.select([proc.stdout], [], [], max(0.0, deadline -
                                                                time.monotonic()))[0]:
                if time.monotonic() >= deadline:
                    self.close()
                    raise TokenizerError(f"the {self.name} tokenizer took more than "
                                         f"{timeout:g} s on this request (stopped)")
            line = proc.stdout.readline()
        except OSError:
            line = b""
        if not line:
            code = proc.wait()
            self.close()
            raise TokenizerError(f"the {self.name} tokenizer crashed on this request "
                                 f"(its process ended with {code})")
        return json.loads(line)


class TokenizerPool:
    """``count`` TokenizerProcesses, each lent to one thread at a time (``with
    pool.borrow() as tok``); ``warm()`` starts them all (the first requests do not wait)."""

    def __init__(self, tokenizer, count: int, timeout: float):
        self._all = [TokenizerProcess(tokenizer, timeout) for _ in range(count)]
        self._free = queue.Queue()
        for proc in self._all:
            self._free.put(proc)

    @contextlib.contextmanager
    def borrow(self):
        proc = self._free.get()
        try:
            yield proc
        finally:
            self._free.put(proc)

    def warm(self) -> None:
        for _ in self._all:
            with self.borrow() as proc:
                try:
                    proc.encode("")
                except TokenizerError:
                    pass

    def close(self) -> None:
        for proc in self._all:
            proc.close()


def _worker() -> None:
    """The worker's loop: read a request line, answer a line, until stdin closes."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    from mlxgraph.interpreter.text.chat_template import TemplateLimits
    from mlxgraph.interpreter.text.hf_tokenizer import HFTokenizer

    out = sys.stdout.buffer
    tok, origin = None, "embedded"
    for line in sys.stdin.buffer:
        request = json.loads(line)
        try:
            if tok is None:
                origin = request["origin"]
                tok = HFTokenizer(request["files"], origin)
                reply = {"ready": True}
            elif "messages" in request:
                limits = TemplateLimits(**request["limits"]) if request["limits"] else None
                reply = {"ids": tok.apply_chat_template(
                    request["messages"], request["generation_prompt"], limits=limits,
                    **request["extra"])}
            else:
                reply = {"ids": tok.encode(request["text"], request["special"])}
        except TokenizerError as e:
            reply = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - one failed request, reported in one line
            reply = {"error": f"the {origin} tokenizer failed: "
                              f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _worker()
