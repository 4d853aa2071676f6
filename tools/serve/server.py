"""Running the app under uvicorn on a socket of our own, and stopping it gracefully.

SIGTERM or SIGINT: new requests get 503 (``Retry-After``), the listening socket closes, the
streams in flight finish; one second before ``shutdown_timeout`` the ones still going end
with an error event (``server_error``, "the server is shutting down") and their sessions
are freed; the scheduler thread stops, and the process exits 0 (SIGTERM) or 130 (SIGINT,
as every command exits when interrupted). Whatever a thread is still doing (a request's
tokenization, a round), the process is gone 2 seconds after ``shutdown_timeout``.
"""

import logging
import os
import signal
import socket
import sys
import threading
import time

import uvicorn

from mlxgraph.tools.serve.app import build_app

log = logging.getLogger("mlxgraph.serve")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: the system picks a free one). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # socket says it is TCP, and without it each response waits out a delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


HARD_EXIT_GRACE = 2.0  # seconds past the shutdown timeout before the process exits anyway


class _Server(uvicorn.Server):
    """uvicorn's server; a stop signal makes the scheduler refuse new requests, ends the
    streams still going one second before the timeout, and arms the hard exit."""

    def __init__(self, config, scheduler, shutdown_timeout, received):
        super().__init__(config)
        self.scheduler, self.shutdown_timeout, self.received = (
            scheduler, shutdown_timeout, received)
        self._stopping = False

    def handle_exit(self, sig, frame) -> None:
        self.received.append(sig)
        self.scheduler.refuse_new()
        super().handle_exit(sig, frame)
        if self._stopping:
            return
        self._stopping = True
        end = threading.Timer(max(0.0, self.shutdown_timeout - 1.0), self.scheduler.close,
                              kwargs={"timeout": 1.0})
        end.daemon = True
        end.start()
        threading.Thread(target=_hard_exit, args=(self.shutdown_timeout, self.received),
                         name="mlxgraph-hard-exit", daemon=True).start()


def _hard_exit(timeout: float, received) -> None:
    time.sleep(timeout + HARD_EXIT_GRACE)
    busy = [t.name for t in threading.enumerate() if t is not threading.current_thread()
            and not t.daemon and t is not threading.main_thread()]
    print(f"mlxgraph serve: stopped past the shutdown timeout (still busy: "
          f"{', '.join(busy) or 'the event loop'})", file=sys.stderr, flush=True)
    os._exit(_exit_code(received))


def _exit_code(received) -> int:
    return 130 if signal.SIGINT in received and signal.SIGTERM not in received else 0


def serve(scheduler, sock, model_id: str, shutdown_timeout: float = 10.0,
          log_level: str = "warning", tokenize_timeout: float = 5.0) -> int:
    """Serve until a stop signal; returns the exit code (0 SIGTERM, 130 SIGINT)."""
    app = build_app(scheduler, model_id, tokenize_timeout=tokenize_timeout)
    # Writing to a client that went away: asyncio says so once per write; the handler
    # logs the one line that matters ("request N: ... cancelled").
    logging.getLogger("asyncio").addFilter(
        lambda record: "socket.send() raised exception" not in record.getMessage())
    config = uvicorn.Config(app, log_level=log_level, lifespan="off",
                            timeout_graceful_shutdown=shutdown_timeout, access_log=False)
    received = []
    server = _Server(config, scheduler, shutdown_timeout, received)
    # uvicorn re-raises the signal it caught once it has shut down: with these handlers in
    # place the process ends through our exit code instead of the default action.
    previous = {s: signal.signal(s, lambda sig, frame: received.append(sig))
                for s in (signal.SIGTERM, signal.SIGINT)}
    host, port = sock.getsockname()[:2]
    print(f"mlxgraph serve: {model_id} on http://{_host(host)}:{port} "
          f"(up to {scheduler.options.max_sessions} requests at once, "
          f"context {scheduler.info.capacity} tokens: {scheduler.info.capacity_reason})",
          file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        scheduler.close()
        app.state.handlers.tokens.close()
        sock.close()
    print("mlxgraph serve: stopped", file=sys.stderr, flush=True)
    return _exit_code(received)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["bind", "serve"]
