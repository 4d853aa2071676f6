"""The options of Program.load that choose how a graph runs: its compute dtype and its
device plan."""

import mlx.core as mx

from mlxgraph.interpreter.kernels import DEVICE_PLANS

COMPUTE_DTYPES = ("float32",)


def check_compute_dtype(compute_dtype) -> bool:
    """True to widen half precision to float32; False for None (run as stored).

    Raises:
        ValueError: anything else.
    """
    if compute_dtype is None:
        return False
    if compute_dtype in COMPUTE_DTYPES or compute_dtype == mx.float32:
        return True
    raise ValueError(f"compute_dtype {compute_dtype!r}: supported are None (the graph's own "
                     "dtypes) and 'float32' (widen float16/bfloat16 at load)")


def check_device_plan(device_plan) -> str:
    """"cpu" or "gpu": the one asked for, else MLX's default device's kind.

    Raises:
        ValueError: anything else.
    """
    if device_plan is None:
        return "gpu" if mx.default_device() == mx.gpu else "cpu"
    if device_plan not in DEVICE_PLANS:
        raise ValueError(f"device_plan {device_plan!r}: one of {', '.join(DEVICE_PLANS)}")
    return device_plan
