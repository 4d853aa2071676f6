"""Reading a graph file safely: regular files only, the structure read once, constants on demand.

A graph file is never mapped. Its FlatBuffer part is read into memory once (so a file
truncated or rewritten later cannot make a FlatBuffer read fault: no SIGBUS, no torn
read) and its constants are read with ``pread`` when asked for, each read first checking
that the file is still the one that was verified (same size and modification time on
the open descriptor). Opening never blocks: a FIFO, device or folder is refused before
(and, against a swap in between, after) it is opened.
"""

import os
import stat

from mlxgraph.schema.errors import Error, GraphFormatError
from mlxgraph.schema.format import MAX_FLATBUFFER_BYTES

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
# The FlatBuffer part is read in growing pieces until the root table's fields are inside.
_FIRST_READ = 1 << 16


class NotRegularFileError(Error, OSError):
    """The path names a folder, FIFO, socket or device rather than a regular file."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path) -> tuple:
    """Open ``path`` for reading without blocking; returns (fd, os.stat_result).

    Raises:
        NotRegularFileError: the path is not a regular file (checked before opening, so a
            FIFO or device is never opened, and again on the descriptor).
        OSError: the file cannot be opened.
    """
    for check in ("path", "descriptor"):
        if check == "path":
            st = os.stat(path)
        else:
            fd = os.open(path, _OPEN_FLAGS)
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
        if not stat.S_ISREG(st.st_mode):
            if check == "descriptor":
                os.close(fd)
            raise NotRegularFileError(0, f"{_kind(st.st_mode)}, not a regular file", str(path))
    return fd, st


def pread_exact(fd: int, offset: int, length: int, into=None) -> memoryview:
    """``length`` bytes at ``offset`` (into the writable buffer ``into`` when given).

    Raises:
        EOFError: the file ends first (it was truncated). OSError: the read fails.
    """
    buf = memoryview(into if into is not None else bytearray(length)).cast("B")
    done = 0
    while done < length:
        n = os.preadv(fd, [buf[done:length]], offset + done)
        if n == 0:
            raise EOFError(f"the file ends at byte {offset + done}, {length - done} bytes short")
        done += n
    return buf[:length]


class FileConstants:
    """Reads byte ranges of one open graph file, refusing a file changed since it was opened.

    Args:
        path: the file's name (messages). fd: an open descriptor. st: its stat at opening.
    """

    def __init__(self, path, fd: int, st):
        self.path, self.fd = path, fd
        self._identity = (st.st_size, st.st_mtime_ns)

    def read(self, offset: int, length: int, into=None) -> memoryview:
        """The bytes [offset, offset + length) of the file (into ``into`` when given).

        Raises:
            GraphFormatError: the file was closed, changed or truncated since it was opened.
        """
        if self.fd is None:
            raise GraphFormatError(
                "the graph file was closed; open it again to read its constants", self.path
            )
        try:
            st = os.fstat(self.fd)
            if (st.st_size, st.st_mtime_ns) != self._identity:
                raise GraphFormatError(
                    "the file changed since it was opened (size or modification time); "
                    "open it again",
                    self.path,
                )
            return pread_exact(self.fd, offset, length, into)
        except (OSError, EOFError) as e:
            raise GraphFormatError(f"cannot read constants: {e}", self.path) from None

    def close(self) -> None:
        """Close the descriptor (later reads raise GraphFormatError)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        self.close()


class MemoryConstants:
    """Byte ranges of a graph file held in memory (bytes); same interface as FileConstants."""

    def __init__(self, data):
        self.data = data

    def read(self, offset: int, length: int, into=None) -> memoryview:
        """The bytes [offset, offset + length) (copied into ``into`` when given)."""
        view = memoryview(self.data).cast("B")[offset : offset + length]
        if into is None:
            return view
        out = memoryview(into).cast("B")
        out[:length] = view
        return out[:length]

    def close(self) -> None:
        """Nothing to close."""


def read_structure(fd: int, size: int, segment_offset) -> bytes:
    """The file's FlatBuffer part (or, for a file too broken to say where it ends, its start).

    Args:
        fd: the open file. size: its size.
        segment_offset: ``fn(prefix bytes) -> int | None``: where the FlatBuffer part ends,
            None when the root table's fields do not lie inside the prefix.
    Raises:
        OSError / EOFError: the read fails or the file shrinks meanwhile.
    """
    limit = min(size, MAX_FLATBUFFER_BYTES)
    want = min(limit, _FIRST_READ)
    while True:
        data = bytes(pread_exact(fd, 0, want))
        seg = segment_offset(data)
        if seg is not None and want < seg <= limit:
            return bytes(pread_exact(fd, 0, seg))
        if seg is not None and seg <= want:
            return data[:seg] if seg >= 8 else data  # exactly the FlatBuffer part
        if seg is not None or want >= limit:
            return data
        want = min(limit, want * 4)
