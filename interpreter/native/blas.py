"""Load an optimised CBLAS ahead of MLX so MLX's matrix products use it (Linux).

The ``mlx[cpu]`` wheel links a bundled reference BLAS (netlib, ``mlx_cpu.libs/libblas-*``)
that is tens of times slower than OpenBLAS at ``cblas_sgemm``. ``libmlx.so`` leaves
``cblas_sgemm`` undefined and the dynamic linker binds it by looking in the global scope
first (the executable and every library loaded with ``RTLD_GLOBAL``) and only then in
libmlx's own dependencies. So loading an optimised CBLAS with ``RTLD_GLOBAL`` *before*
``mlx.core`` is first imported makes MLX use it; after that import it is too late.

What is made global is mlxgraph's CBLAS router (interpreter/native/blas_router.py) bound to the
chosen BLAS, so one-row products run as sgemv; without the router (no C compiler at
install) a plain CBLAS is made global itself and a prefixed one cannot be used.

Choice, in order: the ``MLXGRAPH_BLAS`` environment variable (a path, a library name, or
``scipy-openblas32``; ``none``/``off``/``0`` keeps the bundled one), else the first of
:data:`CANDIDATES` found: the OpenBLAS of the ``scipy-openblas32`` package (a dependency
on Linux, so no root is needed; faster here than Debian's 0.3.21, benchmarks/blas_bench.py),
then system libraries. ``MLXGRAPH_BLAS_ROUTER=0`` turns the matrix-vector routing off;
``MLXGRAPH_BLAS_THREADS`` sets the thread policy (blas_router.py: by default products of
1M multiply-adds and more run on every CPU, smaller ones on one). Never preload in a
process that also computes with torch: OpenBLAS's threads and torch's contend for the
same cores.

This module must not import mlx (or anything that does).
"""

import ctypes
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from mlxgraph.interpreter import knobs
from mlxgraph.interpreter.native.blas_libs import file_of, identify, pypi_openblas_file
from mlxgraph.interpreter.native.blas_router import (
    TILE_ALWAYS,
    TILE_NEVER,
    RouterError,
    bind_router,
    cblas_prefix,
    matvec_wanted,
    router_file,
    routing_wanted,
    set_router_matvec,
    set_router_threads,
    set_router_tile,
    threads_wanted,
    tiling_wanted,
)
from mlxgraph.schema.errors import Error

PYPI_OPENBLAS = "scipy-openblas32"
# Optimised CBLAS libraries, best first (benchmarks/blas_bench.py measured the order).
# A generic libblas.so.3 is not tried: it may well be the same reference BLAS.
CANDIDATES = (
    PYPI_OPENBLAS,  # pip's OpenBLAS (symbols prefixed scipy_; needs the router)
    "libopenblasp.so.0",  # Fedora / RHEL pthread build
    "libopenblas.so.0",  # Debian / Ubuntu (libopenblas0-pthread), conda, Arch
    "libmkl_rt.so.2",
    "libmkl_rt.so",
    "libblis.so.4",
)


TOO_LATE = "mlx was imported before the preload"
NEXT_TO_TORCH = "not preloaded: torch is loaded in this process"


class BlasError(Error, RuntimeError):
    """The BLAS named by MLXGRAPH_BLAS cannot be used (not found, or no cblas_sgemm)."""


class BlasPreloadWarning(RuntimeWarning):
    """mlxgraph.load() could not put an optimised BLAS under MLX (mlx or torch came first)."""


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX's matrix products use in this process."""

    name: str  # 'OpenBLAS 0.3.21', 'bundled reference BLAS', 'Accelerate', ...
    path: str  # the library file ('' when unknown)
    preloaded: bool  # True when this module loaded it ahead of mlx
    detail: str = ""  # build config, threads, or why nothing was preloaded
    router: str = ""  # 'on', 'off (...)', 'absent (...)'; '' when no BLAS was preloaded
    router_path: str = ""

    def describe(self) -> str:
        """One line for a stats block: name, detail, router and file."""
        parts = [self.name]
        if self.detail:
            parts.append(f"({self.detail})")
        if self.router:
            parts.append(f"router {self.router};")
        if self.path:
            parts.append(self.path)
        return " ".join(parts)

    def as_dict(self) -> dict:
        """The JSON form (generate's stats)."""
        return {
            "name": self.name,
            "path": self.path,
            "preloaded": self.preloaded,
            "detail": self.detail,
            "router": self.router,
            "router_path": self.router_path,
        }


_state: BlasInfo | None = None


def _where(candidate: str) -> str:
    """What to dlopen for a candidate name ('' when a package candidate is not installed)."""
    return pypi_openblas_file() if candidate == PYPI_OPENBLAS else candidate


def bundled_blas() -> BlasInfo:
    """What MLX uses without a preload: Accelerate on macOS, the wheel's reference BLAS on Linux."""
    if sys.platform == "darwin":
        return BlasInfo("Accelerate", "", False)
    path = ""
    spec = importlib.util.find_spec("mlx")  # locating the package does not import it
    if spec is not None and spec.submodule_search_locations:
        libs = Path(next(iter(spec.submodule_search_locations))).parent / "mlx_cpu.libs"
        found = sorted(libs.glob("libblas*.so*")) if libs.is_dir() else []
        path = str(found[0]) if found else ""
    return BlasInfo("bundled reference BLAS", path, False)


def _as_set(knob, env) -> str:
    """'NAME=value' as the environment holds it, for messages."""
    return f"{knob.name}={env.get(knob.name)}"


def _describe_tile(router, env) -> str:
    """Give the router its many-row kernel's mode (MLXGRAPH_BLAS_TILE) and say where
    many-row products go, for the stats line."""
    wanted = tiling_wanted(env)
    got = set_router_tile(router, wanted)
    if wanted == TILE_NEVER:
        return f"sgemm for many rows ({_as_set(knobs.BLAS_TILE, env)})"
    if got == TILE_NEVER:
        return "sgemm for many rows (the tile kernel needs AVX-512)"
    if got == TILE_ALWAYS:
        return f"tile kernel for every product of many rows ({_as_set(knobs.BLAS_TILE, env)})"
    return "tile kernel for 9..160 rows"


def _describe_matvec(router, env) -> str:
    """Give the router its one-row kernel's switch (MLXGRAPH_BLAS_MATVEC) and say where
    one-row products go, for the stats line."""
    if set_router_matvec(router, matvec_wanted(env)):
        return "matvec kernel for one row"
    return f"sgemv for one row ({_as_set(knobs.BLAS_MATVEC, env)})"


def _install(where: str, env) -> BlasInfo | str:
    """Load one CBLAS and make it (through the router when there is one) MLX's.

    Returns the BlasInfo, or a string saying why this library cannot be used.
    """
    try:
        lib = ctypes.CDLL(where, mode=os.RTLD_LOCAL)
    except OSError:
        return "it cannot be loaded"
    prefix = cblas_prefix(lib)
    if prefix is None:
        return "it has no cblas_sgemm"
    router_path, route, threads = router_file(), routing_wanted(env), threads_wanted(env)
    if not router_path:
        if prefix:
            return (f"its symbols carry the prefix {prefix!r} and the BLAS router was not built "
                    "at install")
        router = "absent (not built at install: no C compiler?)"
    elif not route and not prefix:
        router, router_path = f"off ({_as_set(knobs.BLAS_ROUTER, env)})", ""
    else:
        try:
            bound = bind_router(router_path, lib, prefix, route)
        except RouterError as e:
            return str(e)
        router = "on" if route else f"off ({_as_set(knobs.BLAS_ROUTER, env)}; forwarding only)"
        if route:
            router += ", " + _describe_matvec(bound, env) + ", " + _describe_tile(bound, env)
        if threads.many and set_router_threads(bound, threads):
            router += f", {threads.describe()}"
    if not prefix:
        # Global too, after the router: LAPACK and the rest of the BLAS names resolve here.
        ctypes.CDLL(where, mode=ctypes.RTLD_GLOBAL)
    name, detail = identify(lib, prefix, report_threads="threads" not in router)
    path = file_of(getattr(lib, f"{prefix}cblas_sgemm")) or where
    return BlasInfo(name, path, True, detail, router, router_path)


def preload_blas(env: dict | None = None) -> BlasInfo:
    """Load the best available CBLAS globally, before mlx is imported; idempotent.

    Args:
        env: the environment to read the MLXGRAPH_* knobs from (default os.environ);
            every knob is checked here (interpreter/knobs.py), the BLAS ones used.
    Returns:
        The BlasInfo of the BLAS MLX will use (also kept for :func:`blas_in_use`).
    Raises:
        BlasError: MLXGRAPH_BLAS names a library that cannot be loaded or has no
            cblas_sgemm (an explicit request that fails is not silently ignored), or an
            MLXGRAPH_BLAS* knob holds a value it does not take.
        KnobError: another MLXGRAPH_* knob holds a value it does not take.
    """
    global _state
    if _state is not None:
        return _state
    env = os.environ if env is None else env
    try:
        choice = knobs.BLAS.read(env)
        for knob in (knobs.BLAS_ROUTER, knobs.BLAS_THREADS, knobs.BLAS_TILE):
            knob.read(env)
    except knobs.KnobError as e:
        raise BlasError(str(e)) from None
    knobs.check_environment(env)  # the other knobs: a bad value fails now, not at a kernel
    bundled = bundled_blas()
    if sys.platform == "darwin":
        _state = bundled
        return _state
    if choice == "bundled":
        _state = BlasInfo(bundled.name, bundled.path, False, _as_set(knobs.BLAS, env))
        return _state
    if "mlx.core" in sys.modules:
        # Too late: libmlx's cblas_sgemm is already bound to the bundled library.
        _state = BlasInfo(bundled.name, bundled.path, False, TOO_LATE)
        return _state
    if "torch" in sys.modules:
        _state = BlasInfo(bundled.name, bundled.path, False, NEXT_TO_TORCH)
        return _state
    candidates = list(CANDIDATES) if choice == "auto" else [choice]
    for cand in candidates:
        where = _where(cand)
        result = _install(where, env) if where else f"the {cand} package is not installed"
        if isinstance(result, BlasInfo):
            _state = result
            return _state
        if choice != "auto":
            raise BlasError(
                f"{_as_set(knobs.BLAS, env)}: {result} (set {knobs.BLAS.name}=none to use the "
                "bundled BLAS)"
            )
    _state = BlasInfo(
        bundled.name,
        bundled.path,
        False,
        f"no optimised CBLAS found; pip install {PYPI_OPENBLAS}, or on Debian/Ubuntu: "
        "apt-get install libopenblas0-pthread",
    )
    return _state


_FIXES = {
    TOO_LATE: "call mlxgraph.preload_blas() (or mlxgraph.load()) before anything imports mlx",
    NEXT_TO_TORCH: "run the graph in a process that does not import torch",
}
_warned = False


def ensure_preloaded() -> BlasInfo:
    """:func:`preload_blas`, warning once per process when it came too late to help.

    Raises:
        BlasError: as :func:`preload_blas`.
    """
    global _warned
    info = preload_blas()
    fix = _FIXES.get(info.detail)
    if fix and not _warned:
        _warned = True
        warnings.warn(
            f"mlxgraph: {info.detail}, so MLX's matrix products run on its bundled reference "
            f"BLAS (prefill ~15x and decode ~3x slower); {fix}",
            BlasPreloadWarning,
            stacklevel=3,
        )
    return info


def blas_in_use() -> BlasInfo:
    """The BLAS MLX's matrix products use in this process (preloaded or bundled)."""
    if _state is not None:
        return _state
    if "mlx.core" in sys.modules:
        b = bundled_blas()
        return BlasInfo(b.name, b.path, False, "no preload was attempted before mlx was imported")
    return bundled_blas()


__all__ = [
    "BlasError",
    "BlasInfo",
    "BlasPreloadWarning",
    "ensure_preloaded",
    "CANDIDATES",
    "PYPI_OPENBLAS",
    "blas_in_use",
    "bundled_blas",
    "preload_blas",
    "pypi_openblas_file",
]
