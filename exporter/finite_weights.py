"""Export refuses weights holding NaN or infinity (unless asked): a graph computed from
them runs and is garbage, the worst kind of wrong."""

import numpy as np

from mlxgraph.schema.dtypes import dtype_info


def nonfinite_weights(writer, pages=None) -> str | None:
    """Why the writer's constants cannot be exported as they are: the first holding NaN or
    infinity, and how many such values it has; None when every weight is finite.
    ``pages``: a resident_pages.ResidentPages given back each weight's pages once read."""
    for slot, data, _ in writer.constants:
        name, dtype = writer.tensors[slot][0], writer.tensors[slot][1]
        info = dtype_info(dtype)
        if not info.is_float or data.size == 0:
            continue
        if info.name == "bfloat16":
            bad = int(np.count_nonzero((data & 0x7F80) == 0x7F80))  # all-ones exponent: inf or NaN
        else:
            bad = int(data.size - np.count_nonzero(np.isfinite(data)))
        if pages is not None:
            pages.release(data)
        if bad:
            return (f"weight {name} has {bad} non-finite values (NaN or infinity); refusing to "
                    "export it (--allow-nonfinite exports it anyway)")
    return None
