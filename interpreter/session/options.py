"""A session's options, checked: counts (capacity, max_step), windows, preallocation.

Each function takes ``fail(reason) -> SessionError`` (the session's, naming the file).
"""

from numbers import Integral

from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.memory import allocatable_bytes

# MLX array dimensions are 32-bit: a cache longer than this cannot be allocated.
MAX_CAPACITY = 2**31 - 1


def count_option(name: str, value, fail) -> int:
    """An option that must be an int in [1, MAX_CAPACITY] (0 is not "the default").

    Raises:
        SessionError: anything else (bools included).
    """
    if (isinstance(value, bool) or not isinstance(value, Integral)
            or not 1 <= value <= MAX_CAPACITY):
        raise fail(f"{name} must be an int in [1, {MAX_CAPACITY}], got {value!r}")
    return int(value)


def window_per_layer(layers: dict, windows, fail) -> dict:
    """{layer_id: window} from the graph's layers and a ``windows`` override.

    Args:
        layers: {layer_id: LayerCacheInfo} of the program.
        windows: None (the graph's own), an int for every layer, or {layer_id: window}.
    Raises:
        SessionError: not an int or dict, unknown layers, or a window outside
            [0, MAX_CAPACITY].
    """
    if windows is None:
        return {lid: lc.sliding_window for lid, lc in layers.items()}
    if isinstance(windows, Integral) and not isinstance(windows, bool):
        windows = dict.fromkeys(layers, int(windows))
    if not isinstance(windows, dict):
        raise fail(f"windows must be an int or a {{layer_id: window}} dict, got {windows!r}")
    unknown = set(windows) - set(layers)
    if unknown:
        raise fail(f"windows names layers {sorted(unknown, key=str)}, "
                   f"the graph has {sorted(layers)}")
    for lid, w in windows.items():
        if isinstance(w, bool) or not isinstance(w, Integral) or not 0 <= w <= MAX_CAPACITY:
            raise fail(f"window of layer {lid} must be an int in [0, {MAX_CAPACITY}], got {w!r}")
    return {lid: int(windows.get(lid, lc.sliding_window)) for lid, lc in layers.items()}


def check_preallocation(stores: dict, kv_dtype, capacity: int, path) -> None:
    """Refuse a static cache the process cannot allocate (MLX would crash at evaluation).

    Raises:
        CacheError: the stores' preallocation needs more than the process can allocate.
    """
    itemsize = kv_dtype.size if kv_dtype is not None else 4  # compute dtype <= float32
    need = sum(s.preallocation_elements() for s in stores.values()) * itemsize
    room = allocatable_bytes()
    if room is not None and need > room:
        raise CacheError(f"{path or '<bytes>'}: preallocate=True needs {need / 2**30:.2f} GiB "
                         f"for capacity {capacity}, more than the {room / 2**30:.2f} GiB this "
                         "process can allocate; use a smaller capacity or a growing cache")
