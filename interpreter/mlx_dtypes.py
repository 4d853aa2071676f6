"""Schema dtypes <-> MLX dtypes."""

import mlx.core as mx

from mlxgraph.schema.dtypes import dtype_info

_MX = {
    "float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "float64": mx.float64,
    "int8": mx.int8, "int16": mx.int16, "int32": mx.int32, "int64": mx.int64,
    "uint8": mx.uint8, "uint32": mx.uint32, "bool": mx.bool_,
}
_NAMES = {v: k for k, v in _MX.items()}


def to_mx_dtype(code_or_name) -> mx.Dtype:
    """The MLX dtype for a schema dtype code or name (or an mx.Dtype, returned as is).

    Raises:
        KeyError: unknown dtype.
    """
    if isinstance(code_or_name, mx.Dtype):
        return code_or_name
    return _MX[dtype_info(code_or_name).name]


def dtype_name(dtype: mx.Dtype) -> str:
    """The schema name of an MLX dtype ('float32')."""
    return _NAMES[dtype]


# MLX's float16/bfloat16 matmuls on CPU are 20-50x slower than float32 (benchmarks/
# blas_bench.py): Program.load(compute_dtype="float32") widens these at load.
HALF_DTYPES = (mx.float16, mx.bfloat16)


def widened(dtype, widen: bool):
    """float32 for a half-precision dtype when ``widen``; else the dtype as it is."""
    return mx.float32 if widen and dtype in HALF_DTYPES else dtype
