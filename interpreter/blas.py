"""Load an optimised CBLAS ahead of MLX so MLX's matrix products use it (Linux).

The ``mlx[cpu]`` wheel links a bundled reference BLAS (netlib, ``mlx_cpu.libs/libblas-*``)
that is tens of times slower than OpenBLAS at ``cblas_sgemm``. ``libmlx.so`` leaves
``cblas_sgemm`` undefined and the dynamic linker binds it by looking in the global scope
first (the executable and every library loaded with ``RTLD_GLOBAL``) and only then in
libmlx's own dependencies. So loading an optimised CBLAS with ``RTLD_GLOBAL`` *before*
``mlx.core`` is first imported makes MLX use it; after that import it is too late.

Choice, in order: the ``MLXGRAPH_BLAS`` environment variable (a path or library name;
``none``/``off``/``0`` keeps the bundled one), else the first known optimised CBLAS the
system's loader finds (OpenBLAS, MKL, BLIS). Never preload in a process that also
computes with torch: OpenBLAS's threads and torch's contend for the same cores.

This module must not import mlx (or anything that does).
"""

import ctypes
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "MLXGRAPH_BLAS"
_OFF = ("", "0", "none", "off", "bundled", "reference")
# Optimised CBLAS libraries by soname, best first. A generic libblas.so.3 is not tried:
# it may well be the same reference BLAS.
CANDIDATES = (
    "libopenblasp.so.0",   # Fedora / RHEL pthread build
    "libopenblas.so.0",    # Debian / Ubuntu (libopenblas0-pthread), conda, Arch
    "libmkl_rt.so.2",
    "libmkl_rt.so",
    "libblis.so.4",
)


class BlasError(RuntimeError):
    """The BLAS named by MLXGRAPH_BLAS cannot be used (not found, or no cblas_sgemm)."""


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX's matrix products use in this process."""

    name: str          # 'OpenBLAS 0.3.21', 'bundled reference BLAS', 'Accelerate', ...
    path: str          # the library file ('' when unknown)
    preloaded: bool    # True when this module loaded it ahead of mlx
    detail: str = ""   # build config, threads, or why nothing was preloaded

    def describe(self) -> str:
        """One line for a stats block: name, detail and file."""
        parts = [self.name]
        if self.detail:
            parts.append(f"({self.detail})")
        if self.path:
            parts.append(self.path)
        return " ".join(parts)


_state: BlasInfo | None = None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _file_of(symbol) -> str:
    """The real path of the library that defines a ctypes function ('' if unknown)."""
    try:
        info = _DlInfo()
        if (ctypes.CDLL(None).dladdr(ctypes.cast(symbol, ctypes.c_void_p), ctypes.byref(info))
            and info.dli_fname):
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return ""


def _identify(lib) -> tuple[str, str]:
    """(name, detail) of a loaded CBLAS, from its own introspection calls where it has them."""
    if hasattr(lib, "openblas_get_config"):
        lib.openblas_get_config.restype = ctypes.c_char_p
        config = lib.openblas_get_config().decode(errors="replace").split()
        name = " ".join(config[:2]) if len(config) >= 2 else "OpenBLAS"
        threads = (
            lib.openblas_get_num_threads() if hasattr(lib, "openblas_get_num_threads") else None
        )
        core = ""
        if hasattr(lib, "openblas_get_corename"):
            lib.openblas_get_corename.restype = ctypes.c_char_p
            core = lib.openblas_get_corename().decode(errors="replace")
        detail = ", ".join(x for x in (core, f"{threads} threads" if threads else "") if x)
        return name, detail
    if hasattr(lib, "MKL_Get_Max_Threads"):
        return "Intel MKL", f"{lib.MKL_Get_Max_Threads()} threads"
    if hasattr(lib, "bli_info_get_version_str"):
        lib.bli_info_get_version_str.restype = ctypes.c_char_p
        return f"BLIS {lib.bli_info_get_version_str().decode(errors='replace')}", ""
    return "CBLAS", ""


def _load(name_or_path: str):
    """dlopen with global visibility; returns the handle or None. Checks for cblas_sgemm."""
    try:
        lib = ctypes.CDLL(name_or_path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    return lib if hasattr(lib, "cblas_sgemm") else False


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


def preload_blas(env: dict | None = None) -> BlasInfo:
    """Load the best available CBLAS globally, before mlx is imported; idempotent.

    Args:
        env: the environment to read MLXGRAPH_BLAS from (default os.environ).
    Returns:
        The BlasInfo of the BLAS MLX will use (also kept for :func:`blas_in_use`).
    Raises:
        BlasError: MLXGRAPH_BLAS names a library that cannot be loaded or has no
            cblas_sgemm (an explicit request that fails is not silently ignored).
    """
    global _state
    if _state is not None:
        return _state
    env = os.environ if env is None else env
    requested = env.get(ENV_VAR)
    bundled = bundled_blas()
    if sys.platform == "darwin":
        _state = bundled
        return _state
    if requested is not None and requested.strip().lower() in _OFF:
        _state = BlasInfo(bundled.name, bundled.path, False, f"{ENV_VAR}={requested}")
        return _state
    if "mlx.core" in sys.modules:
        # Too late: libmlx's cblas_sgemm is already bound to the bundled library.
        _state = BlasInfo(bundled.name, bundled.path, False, "mlx was imported before the preload")
        return _state
    if "torch" in sys.modules:
        _state = BlasInfo(
            bundled.name, bundled.path, False, "not preloaded: torch is loaded in this process"
        )
        return _state
    candidates = [requested.strip()] if requested is not None else list(CANDIDATES)
    for cand in candidates:
        lib = _load(cand)
        if lib:
            name, detail = _identify(lib)
            _state = BlasInfo(name, _file_of(lib.cblas_sgemm) or cand, True, detail)
            return _state
        if requested is not None:
            why = "it has no cblas_sgemm" if lib is False else "it cannot be loaded"
            raise BlasError(
                f"{ENV_VAR}={requested}: {why} (set {ENV_VAR}=none to use the bundled BLAS)"
            )
    _state = BlasInfo(
        bundled.name,
        bundled.path,
        False,
        "no optimised CBLAS found; on Debian/Ubuntu: apt-get install libopenblas0-pthread",
    )
    return _state


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
    "CANDIDATES",
    "ENV_VAR",
    "blas_in_use",
    "bundled_blas",
    "preload_blas",
]
