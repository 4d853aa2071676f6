"""Importing mlxgraph's optional MLX-primitive extensions (interpreter/native/*.cpp, built at
install by setup.py): nanobind modules in MLX's own nanobind domain, linked against libmlx.

Imports mlx: use only after the BLAS preload (see mlxgraph.interpreter.native.blas).
"""

import ctypes
import importlib
import os
from pathlib import Path

import mlx.core as mx


def import_mlx_extension(name: str):
    """(module, '') for ``mlxgraph.interpreter.native.<name>``, or (None, why it is not there).

    libmlx (already loaded by mlx.core, privately) is made global first, so the extension's
    MLX symbols resolve against the same library mlx.core uses."""
    full = f"mlxgraph.interpreter.native.{name}"
    if importlib.util.find_spec(full) is None:
        return None, "the native kernel was not built at install"
    libmlx = Path(mx.__file__).parent / "lib" / "libmlx.so"
    try:
        if libmlx.is_file():
            ctypes.CDLL(str(libmlx), mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        return importlib.import_module(full), ""
    except (OSError, ImportError) as e:
        return None, f"the native kernel does not load: {e}"
