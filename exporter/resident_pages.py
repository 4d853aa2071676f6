"""Giving back the resident pages of weights read from a mapped file, once they are read.

transformers maps a folder's safetensors (private, copy-on-write) and a float32 model's
parameters are views of that mapping: each page comes into memory as the export first
reads it (the non-finite check, quantizing) and then stays, counted in the process's
memory, until the exit. On the small Llama of benchmarks/quantize_export_bench.py all
623 MB of float weights were resident beside the quantized ones at the end: 1.2 GB, 1.9x
mlx-lm's convert, which holds one weight at a time.

Where the mapping holds no page of its own (``Anonymous: 0 kB`` in /proc/self/smaps:
nothing ever wrote to it, so each of its pages is still the file's), the whole pages of a
weight that was read are given back with madvise(MADV_DONTNEED). A later read maps the
page cache's page again: the file's same bytes, at the cost of a minor fault per page.
Anywhere else (no /proc, as on macOS; an array in anonymous memory; a mapping written to,
whose copied pages DONTNEED would discard) nothing is done.
"""

import bisect
import ctypes
import mmap
import re

_SMAPS = "/proc/self/smaps"
# "start-end perms offset dev inode [path]"
_HEADER = re.compile(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ (\d+)")


def _clean_file_mappings(text: str) -> list:
    """[(start, end)] of the file mappings in smaps ``text`` holding no anonymous page."""
    clean, current = [], None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            start, end, inode = header.groups()
            current = (int(start, 16), int(end, 16)) if inode != "0" else None
        elif current is not None and line.startswith("Anonymous:"):
            if line.split()[1] == "0":
                clean.append(current)
            current = None
    return sorted(clean)


class ResidentPages:
    """The process's clean file mappings, read once; ``release(array)`` gives back the whole
    pages of a C-contiguous numpy array lying in one of them."""

    def __init__(self):
        try:
            with open(_SMAPS) as f:
                self._mappings = _clean_file_mappings(f.read())
            self._madvise = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):  # no /proc, or no madvise
            self._mappings = []
        self._starts = [start for start, _ in self._mappings]

    def release(self, array) -> bool:
        """Give back ``array``'s whole pages where they are a clean file mapping's; whether
        they were."""
        if not self._mappings or not array.flags.c_contiguous or array.nbytes == 0:
            return False
        address = array.ctypes.data
        first = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (address + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        i = bisect.bisect_right(self._starts, address) - 1
        if last <= first or i < 0 or address + array.nbytes > self._mappings[i][1]:
            return False
        # (an optimization: a refusal leaves the pages resident, nothing more)
        return self._madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first),
                             mmap.MADV_DONTNEED) == 0


__all__ = ["ResidentPages"]
