"""The native part of the install, optional: without a compiler, or if a build fails, the
install still succeeds and mlxgraph runs without it (the stats say so).

- mlxgraph's CBLAS router (interpreter/native/blas_router.c): a plain C shared library (no
  Python API). Only Linux needs it (macOS uses Accelerate). The BLAS line of the stats says
  "router absent" without it.
- the native matrix-vector kernels (interpreter/native/quantized_matvec.cpp: quantized
  weights, and half_matvec.h: float16/bfloat16 weights): MLX primitives in a nanobind
  extension, compiled against the headers of the MLX wheel and in MLX's nanobind domain
  (both are build requirements, pyproject.toml). Without it, QuantizedLinear and
  half-precision Linear run on MLX's own ops.
- float32 sigmoid and SiLU (interpreter/native/activations.cpp), the attention softmax
  (attention_softmax.cpp), RMSNorm and RoPE (norm_rope.cpp), MLX primitives built the same
  way: MLX's x86-64 CPU exp runs one element at a time, and its RMSNorm and RoPE are chains
  of ops. Without them, MLX's own ops.

Everything else is declared in pyproject.toml.
"""

import platform
import sys
from pathlib import Path

from setuptools import Extension, setup

ROUTER = Extension(
    "mlxgraph.interpreter.native._blas_router",
    sources=["interpreter/native/blas_router.c", "interpreter/native/matvec_f32.c",
             "interpreter/native/small_gemm.c", "interpreter/native/tile_gemm.c",
             "interpreter/native/pool.c"],
    depends=["interpreter/native/matvec_f32.h", "interpreter/native/small_gemm.h",
             "interpreter/native/tile_gemm.h", "interpreter/native/tile_kernel.h",
             "interpreter/native/pool.h"],
    libraries=["dl"],
    # -Wno-psabi: matvec_f32.c's and small_gemm.c's vectors change ABI only inside their own
    # static functions.
    extra_compile_args=["-O2", "-pthread", "-Wno-psabi"],
    extra_link_args=["-pthread"],
    optional=True,
)


# Headers a native module's source includes (a change rebuilds it).
HEADERS = {"quantized_matvec": ["interpreter/native/cpu_eval.h",
                                "interpreter/native/dequantize.h",
                                "interpreter/native/half_matvec.h",
                                "interpreter/native/half_widen.h",
                                "interpreter/native/int8_kernel.h",
                                "interpreter/native/int8_ops.h",
                                "interpreter/native/int8_prepare.h",
                                "interpreter/native/matvec_common.h",
                                "interpreter/native/pool.c",
                                "interpreter/native/pool.h",
                                "interpreter/native/quantized_kernel.h",
                                "interpreter/native/quantized_tile.h",
                                "interpreter/native/tile_kernel.h"],
           "activations": ["interpreter/native/vec_exp.h", "interpreter/native/cpu_eval.h",
                           "interpreter/native/attention_softmax.h",
                           "interpreter/native/norm_rope.h",
                           "interpreter/native/norm_rope_rows.h",
                           "interpreter/native/vec_block.h"]}
# Further sources of a native module (the attention softmax shares activations' vector exp;
# RMSNorm and RoPE share its module and switch).
SOURCES = {"activations": ["interpreter/native/attention_softmax.cpp",
                           "interpreter/native/norm_rope.cpp"]}


def mlx_primitives() -> list:
    """The MLX-primitive extensions (quantized matvec, activations), or none when their
    build requirements are missing."""
    try:
        import mlx
        import nanobind
    except ImportError:
        return []
    nb = Path(nanobind.__file__).parent
    mlx_include = Path(mlx.__path__[0]) / "include"
    if not mlx_include.is_dir():
        return []
    return [Extension(
        f"mlxgraph.interpreter.native._{name}",
        sources=[f"interpreter/native/{name}.cpp", *SOURCES.get(name, []),
                 str(nb / "src" / "nb_combined.cpp")],
        depends=["interpreter/native/simd_name.h", *HEADERS.get(name, [])],
        include_dirs=[str(mlx_include), str(nb / "include"),
                      str(nb / "ext" / "robin_map" / "include")],
        # MLX's Python module binds its arrays in the nanobind domain "mlx": the kernel's
        # module must join it to take and return mx.array.
        define_macros=[("NB_DOMAIN", "mlx"), ("NDEBUG", "1")],
        extra_compile_args=["-O2", "-std=c++20", "-fvisibility=hidden", "-Wno-psabi"],
        language="c++",
        optional=True,
    ) for name in ("quantized_matvec", "activations")]


LINUX = sys.platform.startswith("linux")
NATIVE = LINUX and platform.machine() in ("x86_64", "aarch64")
setup(ext_modules=([ROUTER] if LINUX else []) + (mlx_primitives() if NATIVE else []))
