"""What lowerings and the lowering pass share: the error, the tensor slot, torch dtypes.

A module of its own so the lowerings (loaded by the registry the pass consults) need not
import the pass.
"""

from dataclasses import dataclass

import torch

from mlxgraph.schema.dtypes import dtype_info
from mlxgraph.schema.errors import Error

TORCH_DTYPES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float64: "float64", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
    torch.int64: "int64", torch.uint8: "uint8", torch.uint32: "uint32", torch.bool: "bool",
}


class LoweringError(Error):
    """This node's arguments cannot be expressed in the graph format."""


@dataclass(frozen=True)
class Slot:
    """A tensor slot of the graph being written."""

    index: int


class _Poison:
    """What a node becomes when it (or an input) could not be lowered."""


POISON = _Poison()


def torch_dtype_name(dtype) -> str:
    """The graph format's name of a torch dtype.

    Raises:
        LoweringError: a dtype the format has no code for.
    """
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise LoweringError(f"dtype {dtype} has no graph dtype") from None


def torch_dtype_code(dtype) -> int:
    """The graph format's DType code of a torch dtype (for the ``dtype`` fields of nodes).

    Raises:
        LoweringError: a dtype the format has no code for.
    """
    return dtype_info(torch_dtype_name(dtype)).code
