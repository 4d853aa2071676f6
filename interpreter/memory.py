"""How many bytes this process may still allocate: the smaller of the machine's available
memory and MLX's memory limit. Used to refuse a cache allocation that cannot succeed
(MLX would abort or crash at evaluation instead of raising)."""

import os

import mlx.core as mx


def _available_system_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages, else None."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def allocatable_bytes() -> int | None:
    """The most bytes a new allocation may take now (None when nothing is known)."""
    limits = [b for b in (_available_system_bytes(), mx.get_memory_limit()) if b]
    return min(limits) if limits else None

