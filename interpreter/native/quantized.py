"""The native matrix-vector kernels (interpreter/native/: quantized_matvec.cpp for quantized
weights, half_matvec.h for float16/bfloat16 weights) and the quantized prefill product
(quantized_tile.h), if the install built them: loading, the runtime switches, where each
applies, and what the stats say about them.

The kernels are MLX primitives in a nanobind extension of MLX's own nanobind domain, linked
against libmlx at load: libmlx (already loaded by mlx.core, privately) is made global
first. Without a compiler, or with ``MLXGRAPH_QUANTIZED_KERNEL=mlx``, QuantizedLinear runs
on ``mx.quantized_matmul`` and a half-precision Linear on MLX's matmul, and the stats say so.
"""

import os
from dataclasses import dataclass
from functools import cache

import mlx.core as mx

from mlxgraph.interpreter.knobs import QUANTIZED_KERNEL, QUANTIZED_PREFILL, QUANTIZED_THREADS
from mlxgraph.interpreter.native.mlx_extension import import_mlx_extension

# Float32 steps of more rows than this take the tiled product, or dequantize the weight and
# take the BLAS matmul (benchmarks/quantized_bench.py: ~10x MLX's CPU quantized_matmul from
# 8 rows on); the native kernel takes up to its own MAX_ROWS (8) before that.
PREFILL_ROWS = 4
# Scales and biases the native kernel reads (a float32 graph's, float16 by default).
_KERNEL_SCALES = (mx.float32, mx.float16)
# The int8 kernel's blocks of x: 32 values, one int8 scale each, within one group.
INT8_X_BLOCK = 32


@dataclass(frozen=True)
class NativeKernel:
    """The loaded native kernels, or why there are none (``fn`` None): ``fn`` the quantized
    product, ``half_fn`` the float16/bfloat16 one, ``tile_fn`` the quantized prefill product
    (None where ``tile_reason`` says why: no AVX-512F, or ``MLXGRAPH_QUANTIZED_PREFILL``)."""

    fn: object
    simd: str
    threads: int
    max_rows: int
    reason: str = ""
    half_fn: object = None
    dequantize_fn: object = None
    tile_fn: object = None
    tile_reason: str = ""
    int8_fn: object = None      # the product with x rounded to int8 (int8_kernel.h)
    int8_simd: str = ""         # its instruction-set level

    def describe(self) -> str:
        """One line for the stats: which kernel a QuantizedLinear runs on."""
        if self.tile_fn is not None:
            how = "native tiled product"
        elif self.dequantize_fn is not None:
            how = f"native dequantize + BLAS matmul ({self.tile_reason})"
        else:
            how = "dequantize + BLAS matmul"
        longer = (f"float32 steps of > {max(PREFILL_ROWS, self.max_rows)} rows: {how}; "
                  "otherwise mx.quantized_matmul")
        if self.fn is None:
            return f"{longer} ({self.reason})"
        return (f"native matvec ({self.simd}, {self.threads} threads) for float32 steps of "
                f"<= {self.max_rows} rows; {longer}")

    def describe_half(self) -> str:
        """One line for the stats: which kernel a float16/bfloat16 Linear runs on."""
        if self.half_fn is None:
            return f"MLX's matmul ({self.reason})"
        return (f"native half matvec ({self.simd}, {self.threads} threads) for steps of <= "
                f"{self.max_rows} rows; MLX's matmul otherwise")

    def describe_int8(self) -> str:
        """One line for the stats of a program loaded with int8_activations."""
        return (f"int8 activations ({self.int8_simd}, {self.threads} threads) for float32 x "
                f"(per {INT8_X_BLOCK} values), group sizes of multiples of {INT8_X_BLOCK}; the "
                f"others exact: {self.describe()}")

    def as_dict(self, int8: bool = False) -> dict:
        """JSON-ready: native (bool), simd, threads, max_rows, reason, the kernel's line;
        ``int8``: the program takes int8 activations (int8 and its level added)."""
        out = {"native": self.fn is not None, "simd": self.simd, "threads": self.threads,
               "max_rows": self.max_rows, "reason": self.reason, "kernel": self.describe()}
        if int8:
            out.update(int8=self.int8_simd, kernel=self.describe_int8())
        return out


def _absent(reason: str) -> NativeKernel:
    return NativeKernel(None, "", 0, 0, reason)


@cache
def native_kernel() -> NativeKernel:
    """The native kernel (loaded once per process), or why it is not used
    (``MLXGRAPH_QUANTIZED_KERNEL`` off; its threads: ``MLXGRAPH_QUANTIZED_THREADS``; the
    prefill product: ``MLXGRAPH_QUANTIZED_PREFILL``).

    Raises:
        KnobError: a knob holds a value it does not take.
    """
    threads = QUANTIZED_THREADS.read() or min(2, os.cpu_count() or 1)
    if not QUANTIZED_KERNEL.read():
        return _absent(f"{QUANTIZED_KERNEL.name}={QUANTIZED_KERNEL.raw()}")
    module, reason = import_mlx_extension("_quantized_matvec")
    if module is None:
        return _absent(reason)
    module.set_threads(threads)
    tile_fn, tile_reason = module.quantized_tile, ""
    if not QUANTIZED_PREFILL.read():
        tile_fn, tile_reason = None, f"{QUANTIZED_PREFILL.name}={QUANTIZED_PREFILL.raw()}"
    elif not module.tile_available():
        tile_fn, tile_reason = None, "the tiled product needs AVX-512F"
    return NativeKernel(module.quantized_matvec, module.simd(), module.threads(),
                        module.MAX_ROWS, half_fn=module.half_matvec,
                        dequantize_fn=module.dequantize, tile_fn=tile_fn,
                        tile_reason=tile_reason, int8_fn=module.quantized_int8,
                        int8_simd=module.int8_level())


def _packed_eligible(scales, group_size: int, bits: int) -> bool:
    """Float32 or float16 scales, a group of whole 16-byte blocks (every format bits and
    group size): what every native kernel of packed weights reads."""
    return scales.dtype in _KERNEL_SCALES and (group_size * bits // 8) % 16 == 0


def eligible(kernel: NativeKernel, x, scales, group_size: int, bits: int) -> bool:
    """Whether the native kernel computes this product: float32 x, few rows, and the packed
    weights' rule."""
    if kernel.fn is None or not x.dtype == mx.float32:  # (Dtype's == is its cheap test)
        return False
    shape = x.shape  # a new tuple per read: every node of every decode step asks
    return (len(shape) >= 1 and 1 <= x.size // (shape[-1] or 1) <= kernel.max_rows
            and _packed_eligible(scales, group_size, bits))


def dequantize_eligible(kernel: NativeKernel, scales, group_size: int, bits: int) -> bool:
    """Whether the native dequantize takes this weight (the native product's rule)."""
    return kernel.dequantize_fn is not None and _packed_eligible(scales, group_size, bits)


def tile_eligible(kernel: NativeKernel, x, scales, group_size: int, bits: int) -> bool:
    """Whether the tiled prefill product computes x @ W.T: a prefill-sized float32 x with a
    nonempty last axis, and the native product's rule for the weight."""
    return (kernel.tile_fn is not None and prefill_sized(x) and x.shape[-1] > 0
            and _packed_eligible(scales, group_size, bits))


def int8_eligible(kernel: NativeKernel, x, scales, group_size: int, bits: int) -> bool:
    """Whether the int8 kernel computes this product: float32 x of any rows, float32 or
    float16 scales, 4 or 8 bits, groups of whole 32-value x blocks."""
    return (kernel.int8_fn is not None and x.dtype == mx.float32 and x.ndim >= 1
            and x.shape[-1] > 0 and scales.dtype in _KERNEL_SCALES and bits in (4, 8)
            and group_size % INT8_X_BLOCK == 0)


def prefill_sized(x) -> bool:
    """Whether a float32 product has more rows than PREFILL_ROWS (dequantize + matmul)."""
    return (x.dtype == mx.float32 and x.ndim >= 1
            and x.size // max(x.shape[-1], 1) > PREFILL_ROWS)


def half_eligible(kernel: NativeKernel, x, weight) -> bool:
    """Whether the native half kernel computes x @ weight.T: float16 or bfloat16 x and 2-D
    weight of x's dtype, few rows, a row length that is a multiple of 16."""
    return (kernel.half_fn is not None and x.dtype in (mx.float16, mx.bfloat16)
            and weight.dtype == x.dtype and weight.ndim == 2 and x.ndim >= 1
            and x.shape[-1] == weight.shape[1] and x.shape[-1] % 16 == 0
            and 1 <= x.size // max(x.shape[-1], 1) <= kernel.max_rows)
