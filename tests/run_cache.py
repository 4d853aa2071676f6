"""Artifacts built once per test run and shared by every pytest-xdist worker of the run.

A module-level cache is per process: with ``make test``'s workers each would export the
same built-in again. These live in the run's temporary base (the parent of each worker's
own base), so they never outlive the run and never see another run's source; a file lock
makes the first worker that asks build one while the others wait for it.
"""

import fcntl
import os
from pathlib import Path


def run_folder(tmp_path_factory) -> Path:
    """The run's shared folder (created on first use)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's base is <run base>/popen-gwN
        base = base.parent
    folder = base / "shared"
    folder.mkdir(exist_ok=True)
    return folder


def build_once(tmp_path_factory, name: str, build) -> Path:
    """The path of ``name`` in the run's shared folder, built first by ``build(path)``.

    ``build`` must leave either a complete file or none (an export's verified write does);
    callers must not modify the file.
    """
    path = run_folder(tmp_path_factory) / name
    with open(path.with_name(name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not path.exists():
            build(path)
    return path
