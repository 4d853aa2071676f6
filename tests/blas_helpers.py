"""Shared by the BLAS router's tests: what this CPU can run."""

from pathlib import Path


def has_avx512() -> bool:
    """Whether this CPU (and kernel) offers AVX-512F: the router's many-row kernel needs it."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512f" in flags
