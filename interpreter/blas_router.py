"""The CBLAS router (interpreter/native/blas_router.c, built at install by setup.py).

MLX's CPU matmul calls ``cblas_sgemm`` for every float32 product, one-row products of
decode included, and an optimised sgemm with M == 1 packs its operands and runs at a
third of the memory speed its ``cblas_sgemv`` reaches. The router exports the three
``cblas_*`` names libmlx binds and sends M == 1 / N == 1 products to the target BLAS's
sgemv, the rest to its sgemm. It also maps prefixed builds (scipy-openblas32's
``scipy_cblas_sgemm``) to the plain names MLX looks for.

This module must not import mlx (or anything that does).
"""

import ctypes
import importlib.machinery
import os
from pathlib import Path

ROUTER_ENV = "MLXGRAPH_BLAS_ROUTER"  # 0/off/none: no matrix-vector routing
THREADS_ENV = "MLXGRAPH_BLAS_THREADS"  # "N" or "MATVEC,MATMUL": BLAS threads per shape class
# benchmarks/blas_bench.py measured 1 and 2 threads on 2 cores: see the README, "Fast BLAS".
DEFAULT_THREADS = (1, 1)
_OFF = ("0", "off", "none", "no", "false")
_BIND_SYMBOLS = ("cblas_sgemm", "cblas_sgemv", "cblas_dgemm", "cblas_cgemm")
_HERE = Path(__file__).resolve().parent


class RouterError(RuntimeError):
    """The router library exists but cannot be loaded or bound to the target BLAS."""


def router_file() -> str:
    """The built router library next to this module ('' when the install did not build it)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / f"_blas_router{suffix}"
        if path.is_file():
            return str(path)
    return ""


def routing_wanted(env) -> bool:
    """False when ``MLXGRAPH_BLAS_ROUTER`` switches the matrix-vector routing off."""
    return env.get(ROUTER_ENV, "1").strip().lower() not in _OFF


def cblas_prefix(lib) -> str | None:
    """'' for a plain CBLAS, 'scipy_' for scipy-openblas's build, None without cblas_sgemm."""
    for prefix in ("", "scipy_"):
        if hasattr(lib, f"{prefix}cblas_sgemm"):
            return prefix
    return None


def bind_router(path: str, target, prefix: str, route: bool):
    """Load the router at ``path`` and bind it to ``target`` (a ctypes library handle).

    The router is loaded privately, bound, and only then made global, so libmlx can
    never find an unbound ``cblas_sgemm``.
    Raises:
        RouterError: the router cannot be loaded, or the target lacks a symbol it forwards.
    """
    try:
        router = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        router.mlxgraph_router_bind.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
        missing = router.mlxgraph_router_bind(target._handle, prefix.encode(), int(route))
    except (OSError, AttributeError) as e:
        raise RouterError(f"{path}: cannot load the BLAS router ({e})") from None
    if missing:
        raise RouterError(f"the BLAS has no {prefix}{_BIND_SYMBOLS[missing - 1]}")
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def threads_wanted(env) -> tuple[int, int]:
    """(matrix-vector, other) BLAS threads: MLXGRAPH_BLAS_THREADS, else (0, 0) = the BLAS's
    own setting when OPENBLAS_NUM_THREADS is set, else :data:`DEFAULT_THREADS`.

    Raises:
        ValueError: MLXGRAPH_BLAS_THREADS is not "N" or "N,M" with positive integers.
    """
    raw = env.get(THREADS_ENV)
    if raw is None:
        return (0, 0) if env.get("OPENBLAS_NUM_THREADS") else DEFAULT_THREADS
    parts = raw.split(",")
    try:
        counts = tuple(int(p) for p in parts)
    except ValueError:
        counts = ()
    if len(counts) not in (1, 2) or min(counts) < 1:
        raise ValueError(f"{THREADS_ENV}={raw}: expected N or MATVEC,MATMUL (positive integers)")
    return (counts[0], counts[-1])


def set_router_threads(router, threads: tuple[int, int]) -> bool:
    """Give the bound router its per-class thread counts; False if the BLAS cannot set them."""
    return router.mlxgraph_router_threads(*threads) == 0


def router_counts(path: str) -> dict:
    """How many cblas_sgemm calls the router (already loaded from ``path``) sent to sgemv
    and to sgemm in this process (zeros when no router is loaded)."""
    if not path:
        return {"sgemv": 0, "sgemm": 0}
    router = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    gemv, gemm = ctypes.c_long(), ctypes.c_long()
    router.mlxgraph_router_counts(ctypes.byref(gemv), ctypes.byref(gemm))
    return {"sgemv": gemv.value, "sgemm": gemm.value}


__all__ = [
    "DEFAULT_THREADS",
    "ROUTER_ENV",
    "THREADS_ENV",
    "RouterError",
    "bind_router",
    "cblas_prefix",
    "router_counts",
    "router_file",
    "routing_wanted",
    "set_router_threads",
    "threads_wanted",
]
