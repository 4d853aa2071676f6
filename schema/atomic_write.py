"""Writing a file so that readers see the old file or the whole new one, never a part.

The bytes go to a temporary file created exclusively (``O_EXCL | O_NOFOLLOW``, a fresh
random name) in the target's own folder, are flushed to disk, and the temporary file is
renamed over the target. A symlink planted anywhere is never followed; a target that is
not a regular file (folder, device, FIFO, symlink) is refused rather than replaced; any
failure (a full disk, a file size limit, an interrupt) removes the temporary file and
leaves the old target untouched. Python's SIGINT and SIGTERM handlers are deferred while the
temporary file is created, so that no interrupt can fall between its creation and the
record its cleanup needs. (Blocking the signals on this thread is not enough: the process
has other threads, MLX's and BLAS's, and the kernel may hand the signal to one of them,
whose C handler still makes the main thread raise between two bytecodes.)
Used by every file mlxgraph writes: graph files (schema/writer.py) and cache files
(interpreter/cache/safetensors_io.py).
"""

import errno
import os
import secrets
import signal
import stat
import threading
from pathlib import Path

_CREATE = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def check_replaceable(path) -> None:
    """Raise unless ``path`` is absent or a regular file (not followed if a symlink).

    Raises:
        FileExistsError: the path is a folder, device, FIFO, socket or symlink.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a symlink"
            if stat.S_ISLNK(st.st_mode)
            else "a folder"
            if stat.S_ISDIR(st.st_mode)
            else "not a regular file (a device, FIFO or socket)"
        )
        raise FileExistsError(
            errno.EEXIST, f"exists and is {kind}; refusing to replace it", str(path)
        )


def write_atomically(path, fill, check=None) -> None:
    """Create or replace the file ``path`` with what ``fill(f)`` writes to a binary file ``f``.

    ``check(tmp)``, if given, is called with the temporary file's path once it is complete
    and on disk, before it takes ``path``'s place; whatever it raises aborts the write.

    Raises:
        FileExistsError: ``path`` exists and is not a regular file.
        OSError: the folder is missing or not writable, the disk is full, ...; the old
            file (if any) is unchanged and no temporary file is left.
        Whatever ``check`` raises (an interrupt too), with the same guarantee.
    """
    path = Path(path)
    check_replaceable(path)
    made = {}  # what exists to clean up: filled in while interrupts are held back
    try:
        _create(path, made)
        with os.fdopen(made.pop("fd"), "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(made["tmp"])
        check_replaceable(path)
        os.replace(made["tmp"], path)  # an interrupt after this finds no temporary to remove
    except BaseException:
        _clean(made)
        raise
    _sync_folder(path.parent)


def _create(path: Path, made: dict) -> None:
    """Create the temporary file; ``made`` gets its name and descriptor before an interrupt
    (SIGINT, SIGTERM: their Python handlers deferred meanwhile) can be raised."""
    umask = os.umask(0)
    os.umask(umask)
    with _interrupts_deferred():
        for _ in range(100):
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
            try:
                made["fd"] = os.open(tmp, _CREATE, 0o666 & ~umask)
            except FileExistsError:
                continue
            made["tmp"] = tmp
            return
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path.parent))


def _clean(made: dict) -> None:
    """Close and remove what ``_create`` made; a second interrupt does not stop it."""
    for _ in range(3):
        try:
            if "fd" in made:
                fd = made["fd"]
                del made["fd"]  # closed once, even if interrupted right after
                os.close(fd)
            if "tmp" in made:
                try:
                    os.unlink(made["tmp"])
                except OSError:
                    pass
                del made["tmp"]
            return
        except BaseException:  # noqa: BLE001 - an interrupt here: finish the cleanup first
            continue


class _interrupts_deferred:
    """Defer the Python handlers of SIGINT and SIGTERM: a signal that arrives inside the
    block is recorded and handed to the handler on leaving it.

    Python runs signal handlers only on the main thread, so elsewhere there is nothing
    to defer. A signal left at its OS default (SIG_DFL, SIG_IGN) is left alone: with no
    Python handler no cleanup could run anyway.
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.old, self.pending = {}, []
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for sig in self._SIGNALS:
                if callable(signal.getsignal(sig)):
                    self.old[sig] = signal.signal(sig, self._record)
        except BaseException:  # an interrupt while swapping: put every handler back
            self._restore()
            raise
        return self

    def _record(self, signum, frame):
        self.pending.append((signum, frame))

    def _restore(self):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc):
        self._restore()
        for signum, frame in self.pending:
            self.old[signum](signum, frame)  # KeyboardInterrupt, as it would have been
        return False


def _sync_folder(folder) -> None:
    """Make the rename durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
