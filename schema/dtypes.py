"""The dtype table shared by every part: schema code <-> name <-> numpy storage."""

from dataclasses import dataclass

import numpy as np

from mlxgraph.generated.mlxgraph_generated import DType


@dataclass(frozen=True)
class DTypeInfo:
    """One dtype: its schema code, canonical name, byte size and numpy storage dtype.

    bfloat16 has no numpy dtype, so it is stored and viewed as uint16.
    """

    code: int
    name: str
    itemsize: int
    numpy_storage: np.dtype
    is_float: bool


_TABLE = [
    DTypeInfo(DType.float32, "float32", 4, np.dtype("<f4"), True),
    DTypeInfo(DType.float16, "float16", 2, np.dtype("<f2"), True),
    DTypeInfo(DType.bfloat16, "bfloat16", 2, np.dtype("<u2"), True),
    DTypeInfo(DType.int8, "int8", 1, np.dtype("i1"), False),
    DTypeInfo(DType.int16, "int16", 2, np.dtype("<i2"), False),
    DTypeInfo(DType.int32, "int32", 4, np.dtype("<i4"), False),
    DTypeInfo(DType.int64, "int64", 8, np.dtype("<i8"), False),
    DTypeInfo(DType.uint8, "uint8", 1, np.dtype("u1"), False),
    DTypeInfo(DType.uint32, "uint32", 4, np.dtype("<u4"), False),
    DTypeInfo(DType.bool_, "bool", 1, np.dtype("?"), False),
    DTypeInfo(DType.float64, "float64", 8, np.dtype("<f8"), True),
]

BY_CODE = {d.code: d for d in _TABLE}
BY_NAME = {d.name: d for d in _TABLE}


def dtype_info(code_or_name) -> DTypeInfo:
    """Look a dtype up by schema code (int) or name (str).

    Raises:
        KeyError: unknown dtype.
    """
    if isinstance(code_or_name, str):
        return BY_NAME[code_or_name]
    return BY_CODE[int(code_or_name)]


def is_known_code(code) -> bool:
    """True when ``code`` is a dtype code this version knows."""
    return code in BY_CODE
