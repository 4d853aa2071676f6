"""Finding and naming CBLAS libraries: where pip's OpenBLAS lives, which file a loaded
symbol comes from, and what a loaded library says about itself (interpreter/native/blas.py).

This module must not import mlx (or anything that does).
"""

import ctypes
import importlib.util
import os
from pathlib import Path


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def file_of(symbol) -> str:
    """The real path of the library that defines a ctypes function ('' if unknown)."""
    try:
        info = _DlInfo()
        if (
            ctypes.CDLL(None).dladdr(ctypes.cast(symbol, ctypes.c_void_p), ctypes.byref(info))
            and info.dli_fname
        ):
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return ""


def identify(lib, prefix: str, report_threads: bool = True) -> tuple[str, str]:
    """(name, detail) of a loaded CBLAS, from its own introspection calls where it has them."""
    get_config = getattr(lib, f"{prefix}openblas_get_config", None)
    if get_config is not None:
        get_config.restype = ctypes.c_char_p
        config = get_config().decode(errors="replace").split()
        name = " ".join(config[:2]) if len(config) >= 2 else "OpenBLAS"
        threads = (
            getattr(lib, f"{prefix}openblas_get_num_threads", lambda: 0)() if report_threads else 0
        )
        core = ""
        corename = getattr(lib, f"{prefix}openblas_get_corename", None)
        if corename is not None:
            corename.restype = ctypes.c_char_p
            core = corename().decode(errors="replace")
        detail = ", ".join(x for x in (core, f"{threads} threads" if threads else "") if x)
        return name, detail
    if hasattr(lib, "MKL_Get_Max_Threads"):
        return "Intel MKL", f"{lib.MKL_Get_Max_Threads()} threads"
    if hasattr(lib, "bli_info_get_version_str"):
        lib.bli_info_get_version_str.restype = ctypes.c_char_p
        return f"BLIS {lib.bli_info_get_version_str().decode(errors='replace')}", ""
    return "CBLAS", ""


def pypi_openblas_file() -> str:
    """The OpenBLAS library of the installed scipy-openblas32 package ('' if not installed)."""
    spec = importlib.util.find_spec("scipy_openblas32")  # locating it does not import it
    if spec is None or not spec.submodule_search_locations:
        return ""
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    found = sorted(lib_dir.glob("libscipy_openblas*.so*")) if lib_dir.is_dir() else []
    return str(found[0]) if found else ""
