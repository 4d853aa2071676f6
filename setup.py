"""The native part of the install: mlxgraph's CBLAS router (interpreter/native/blas_router.c).

Everything else is declared in pyproject.toml. The router is a plain C shared library
(no Python API) built with the machine's C compiler. It is optional: without a compiler,
or if the build fails, the install still succeeds and mlxgraph runs without it (the BLAS
line of the stats says "router absent"). Only Linux needs it (macOS uses Accelerate).
"""

import sys

from setuptools import Extension, setup

ROUTER = Extension(
    "mlxgraph.interpreter._blas_router",
    sources=["interpreter/native/blas_router.c"],
    libraries=["dl"],
    extra_compile_args=["-O2"],
    optional=True,
)

setup(ext_modules=[ROUTER] if sys.platform.startswith("linux") else [])
