"""The CBLAS router (interpreter/native/blas_router.c, built at install by setup.py).

MLX's CPU matmul calls ``cblas_sgemm`` for every float32 product, one-row products of
decode included, and an optimised sgemm with M == 1 packs its operands and runs at a
third of the memory speed its ``cblas_sgemv`` reaches. The router exports the three
``cblas_*`` names libmlx binds and sends M == 1 / N == 1 products to its own decode kernel
(native/matvec_f32.c) when the weight is read along k (x @ W.T), else to the target BLAS's
sgemv, products with 2..8 rows (or columns) to its own kernel (native/small_gemm.c: the
weight is read once for all rows), the rest to the BLAS's sgemm. Each call gets a number
of threads by its size (:class:`ThreadPolicy`); the router runs a threaded call itself, in
chunks claimed by sleeping helper threads (native/pool.c), each chunk a one-thread BLAS
call, so a busy machine cannot stall a product on a descheduled BLAS worker. It also maps
prefixed builds (scipy-openblas32's ``scipy_cblas_sgemm``) to the plain names MLX looks for.

This module must not import mlx (or anything that does).
"""

import ctypes
import importlib.machinery
import os
from dataclasses import dataclass
from pathlib import Path

from mlxgraph.interpreter.knobs import BLAS_MATVEC, BLAS_ROUTER, BLAS_THREADS, BLAS_TILE
from mlxgraph.schema.errors import Error

# Products of fewer multiply-adds than this run on one thread: waking a second thread costs
# more than it gains there (benchmarks/blas_bench.py measures the crossing; README, "Fast BLAS").
DEFAULT_MIN_WORK = 1 << 20
MAX_THREADS = 8  # the router's few-row kernel's bound; more rarely helps a memory-bound product
_BIND_SYMBOLS = ("cblas_sgemm", "cblas_sgemv", "cblas_dgemm", "cblas_cgemm")
_HERE = Path(__file__).resolve().parent


class RouterError(Error, RuntimeError):
    """The router library exists but cannot be loaded or bound to the target BLAS."""


def router_file() -> str:
    """The built router library next to this module ('' when the install did not build it)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / f"_blas_router{suffix}"
        if path.is_file():
            return str(path)
    return ""


def routing_wanted(env) -> bool:
    """False when ``MLXGRAPH_BLAS_ROUTER`` switches the matrix-vector routing off.

    Raises:
        KnobError: it holds a value that is neither on nor off.
    """
    return BLAS_ROUTER.read(env)


# Modes of the router's many-row kernel (native/tile_gemm.c; blas_router.c, wants_tile).
TILE_NEVER, TILE_WHERE_FASTER, TILE_ALWAYS = 0, 1, 2


def tiling_wanted(env) -> int:
    """The many-row kernel's mode from ``MLXGRAPH_BLAS_TILE``: unset or on, where it beats
    the BLAS (9..160 rows against a large weight); off, never; "always", for every
    product that is neither matrix-vector nor few-row (tests, measurements).

    Raises:
        KnobError: any other value.
    """
    modes = {"off": TILE_NEVER, "on": TILE_WHERE_FASTER, "always": TILE_ALWAYS}
    return modes[BLAS_TILE.read(env)]


def set_router_tile(router, mode: int) -> int:
    """Give the bound router the many-row kernel's mode (TILE_*). Returns the mode in force:
    TILE_NEVER on a CPU without AVX-512, whatever was asked."""
    router.mlxgraph_router_tile.argtypes = (ctypes.c_int,)
    return int(router.mlxgraph_router_tile(int(mode)))


def matvec_wanted(env) -> bool:
    """False when ``MLXGRAPH_BLAS_MATVEC`` sends one-row products to the BLAS's sgemv rather
    than the router's own kernel (native/matvec_f32.c).

    Raises:
        KnobError: it holds a value that is neither on nor off.
    """
    return BLAS_MATVEC.read(env)


def set_router_matvec(router, on: bool) -> bool:
    """Give the bound router its one-row kernel's switch; returns the switch in force."""
    router.mlxgraph_router_matvec.argtypes = (ctypes.c_int,)
    return bool(router.mlxgraph_router_matvec(int(on)))


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


@dataclass(frozen=True)
class ThreadPolicy:
    """Threads per product: ``many`` for products of >= ``min_work`` multiply-adds, 1 below
    (``many`` = 0: leave the BLAS's own setting). ``source`` says where it came from."""

    many: int
    min_work: int
    source: str

    def describe(self) -> str:
        """For the stats line, e.g. 'threads 2 from 1M multiply-adds, 1 below (auto)'."""
        if not self.many:
            return f"threads: the BLAS's own ({self.source})"
        if self.min_work <= 1 or self.many == 1:
            return f"threads {self.many} ({self.source})"
        w = self.min_work
        work = f"{w / 2**20:g}M" if w % 2**18 == 0 else str(w)
        return f"threads {self.many} from {work} multiply-adds, 1 below ({self.source})"


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_wanted(env) -> ThreadPolicy:
    """The thread policy: MLXGRAPH_BLAS_THREADS ("auto", "N": every product on N threads,
    "N:MIN_WORK": N threads from MIN_WORK multiply-adds, 1 below); unset, the BLAS's own
    setting when OPENBLAS_NUM_THREADS is set, else "auto" (every available CPU, up to
    :data:`MAX_THREADS`, from :data:`DEFAULT_MIN_WORK` multiply-adds).

    Raises:
        KnobError: MLXGRAPH_BLAS_THREADS is none of those forms (positive integers).
    """
    setting, raw = BLAS_THREADS.read(env), BLAS_THREADS.raw(env)
    if raw is None and env.get("OPENBLAS_NUM_THREADS"):
        return ThreadPolicy(0, 0, "OPENBLAS_NUM_THREADS")
    if setting is None:
        return ThreadPolicy(min(available_cpus(), MAX_THREADS), DEFAULT_MIN_WORK, "auto")
    many, min_work = setting
    return ThreadPolicy(many, min_work, f"{BLAS_THREADS.name}={raw}")


def set_router_threads(router, policy: ThreadPolicy) -> bool:
    """Give the bound router its thread policy; False if the BLAS cannot set its threads."""
    router.mlxgraph_router_threads.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long)
    return router.mlxgraph_router_threads(1, policy.many, policy.min_work) == 0


COUNTS = ("sgemv", "small", "sgemm", "threaded", "tile", "matvec")


def router_counts(path: str) -> dict:
    """How many cblas_sgemm calls the router (already loaded from ``path``) sent to sgemv,
    to its few-row kernel, to sgemm, to its many-row kernel ("tile") and to its one-row
    kernel ("matvec") in this process,
    and how many of them were given more than one thread (zeros when no router is loaded)."""
    if not path:
        return dict.fromkeys(COUNTS, 0)
    router = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    out = (ctypes.c_long * len(COUNTS))()
    router.mlxgraph_router_counts(out, len(COUNTS))
    return dict(zip(COUNTS, out))


__all__ = [
    "COUNTS",
    "DEFAULT_MIN_WORK",
    "MAX_THREADS",
    "ThreadPolicy",
    "available_cpus",
    "RouterError",
    "bind_router",
    "cblas_prefix",
    "router_counts",
    "router_file",
    "matvec_wanted",
    "routing_wanted",
    "set_router_matvec",
    "set_router_threads",
    "set_router_tile",
    "TILE_ALWAYS",
    "TILE_NEVER",
    "TILE_WHERE_FASTER",
    "tiling_wanted",
    "threads_wanted",
]
