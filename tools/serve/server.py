"""Running the app under uvicorn on a socket of our own, and stopping it gracefully.

SIGTERM or SIGINT: new requests get 503 (``Retry-After``), the listening socket closes, the
streams in flight finish (or, past ``shutdown_timeout`` seconds, are cancelled, which frees
their sessions), the scheduler thread stops, and the process exits 0 (SIGTERM) or 130
(SIGINT, as every command exits when interrupted).
"""

import logging
import signal
import socket
import sys

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


class _Server(uvicorn.Server):
    """uvicorn's server; a stop signal first makes the scheduler refuse new requests."""

    def __init__(self, config, scheduler):
        super().__init__(config)
        self.scheduler = scheduler

    def handle_exit(self, sig, frame) -> None:
        self.scheduler.refuse_new()
        super().handle_exit(sig, frame)


def serve(scheduler, sock, model_id: str, shutdown_timeout: float = 10.0,
          log_level: str = "warning") -> int:
    """Serve until a stop signal; returns the exit code (0 SIGTERM, 130 SIGINT)."""
    app = build_app(scheduler, model_id)
    config = uvicorn.Config(app, log_level=log_level, lifespan="off",
                            timeout_graceful_shutdown=shutdown_timeout, access_log=False)
    server = _Server(config, scheduler)
    received = []
    # uvicorn re-raises the signal it caught once it has shut down: with these handlers in
    # place the process ends through our exit code instead of the default action.
    previous = {s: signal.signal(s, lambda sig, frame: received.append(sig))
                for s in (signal.SIGTERM, signal.SIGINT)}
    host, port = sock.getsockname()[:2]
    print(f"mlxgraph serve: {model_id} on http://{_host(host)}:{port} "
          f"(up to {scheduler.options.max_sessions} requests at once, "
          f"context {scheduler.info.capacity} tokens)", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        scheduler.close()
        sock.close()
    print("mlxgraph serve: stopped", file=sys.stderr, flush=True)
    return 130 if signal.SIGINT in received and signal.SIGTERM not in received else 0


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["bind", "serve"]
