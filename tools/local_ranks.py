"""Start N ranks on this machine with ``mlx.launch`` (ring backend over loopback), bounded
in time, every process cleaned up: what the pipeline tests and benchmark use.

``mlx.launch -n N`` numbers the ranks' ports from ``--starting-port``; a block of free
ports is picked here, since other runs may share the machine. The launcher and its ranks
run in a new process group, killed when the run ends, however it ends. Note that
``mlx.launch`` itself exits 0 even when a rank fails: read the ranks' own output.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LocalRun:
    """What a local launch left: its wall seconds, stdout and stderr (all ranks mixed),
    and whether the deadline ended it."""

    seconds: float
    stdout: str
    stderr: str
    timed_out: bool


def free_port_block(n: int, tries: int = 200) -> int:
    """The first of ``n`` consecutive loopback ports that are free now.

    Raises:
        RuntimeError: none found in ``tries`` random blocks.
    """
    for _ in range(tries):
        base = random.randrange(20000, 60000 - n)
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free loopback ports")


def launcher() -> str:
    """The ``mlx.launch`` of this Python environment."""
    return str(Path(sys.executable).with_name("mlx.launch"))


def run_local_ranks(n: int, command, deadline: float, env=None) -> LocalRun:
    """Run ``command`` (a list) on ``n`` local ranks; kill them all after ``deadline`` s.

    Raises:
        RuntimeError: no free ports. OSError: mlx.launch cannot be started.
    """
    cmd = [launcher(), "-n", str(n), "--starting-port", str(free_port_block(n)), "--",
           *map(str, command)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, **(env or {})})
    timed_out = False
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        out, err = proc.communicate()
    finally:
        _kill_group(proc.pid)  # any rank the launcher left behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return LocalRun(time.monotonic() - t0, out.decode(errors="replace"),
                    err.decode(errors="replace"), timed_out)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
