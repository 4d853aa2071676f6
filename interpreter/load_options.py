"""The options of Program.load that choose how a graph runs: its compute dtype, its
device plan and int8 activations."""

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


def check_int8_activations(int8_activations, plan: str) -> str | None:
    """The kernel variant ``int8_activations`` asks for ("int8"), or None when False.

    Raises:
        ValueError: not a bool, asked for on the GPU plan, or the native int8 kernel is not
            built (each in one line: the option would otherwise be ignored).
    """
    if not isinstance(int8_activations, bool):
        raise ValueError(f"int8_activations {int8_activations!r}: True or False")
    if not int8_activations:
        return None
    if plan != "cpu":
        raise ValueError("int8_activations: the int8 kernel runs on the CPU only (this "
                         f"program's plan is {plan!r})")
    from mlxgraph.interpreter.native.quantized import native_kernel

    kernel = native_kernel()
    if kernel.int8_fn is None:
        raise ValueError("int8_activations: the native quantized kernel is not in use "
                         f"({kernel.reason})")
    return "int8"
