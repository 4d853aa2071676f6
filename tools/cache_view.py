"""What a saved KV cache file holds, and how two of them differ (for `mlxgraph cache`).

``file_view`` gives the same per-layer view as ``Session.describe()``; ``layer_history``
reads one layer's held positions back in position order (quantized rows dequantized);
``diff_caches`` compares two files per layer and per position range.
"""

from __future__ import annotations

import numpy as np

from mlxgraph.interpreter.cache.header import STATE_KINDS


def file_view(cache) -> dict:
    """The file as Session.describe() shows a live session (JSON-ready)."""
    layers = []
    for lid, info in sorted(cache.layers.items()):
        if info.get("kind") in STATE_KINDS:  # a recurrent state: Session.describe()'s fields
            layers.append({"layer": lid, "kind": info["kind"], "length": info["length"],
                           "shape": info["shape"], "dtype": info["dtype"],
                           "bytes": cache.layer_bytes(lid)})
            continue
        bits = cache.policy.get("kv_bits") or 0
        length, oldest = info.get("length", 0), info.get("oldest", 0)
        slots = info.get("slots") or 0
        layers.append(
            {
                "layer": lid,
                "kind": info.get("kind"),
                "wrapped": oldest > 0,
                "length": length,
                "first_position": oldest,
                "tokens": length - oldest,
                "window": info.get("window"),
                "slots": info.get("modulus"),
                "allocated_slots": info.get("slots"),
                "dtype": None if bits else info.get("dtype"),
                "bits": bits,
                "group_size": cache.policy.get("kv_group_size") if bits else None,
                # Latent attention (format 1.3): keys alone, each value its key's prefix.
                "values_in_keys": "value_width" in info,
                "bytes_per_token": cache.layer_bytes(lid) // slots if slots else None,
                "bytes": cache.layer_bytes(lid),
            }
        )
    return {
        "graph": cache.graph,
        "length": cache.length,
        "policy": cache.policy,
        "approximations": cache.approximations,
        "tokens_recorded": cache.tokens is not None,
        "bytes": sum(la["bytes"] for la in layers),
        "bytes_per_token": _per_token(layers),
        "file_bytes": cache.nbytes,
        "layers": layers,
    }


def _per_token(layers) -> int:
    """What one more position costs over every KV layer (recurrent states cost none)."""
    return sum(la.get("bytes_per_token") or 0 for la in layers)


def layer_history(cache, lid: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(first position, keys, values) of layer ``lid``: ``[B, H, n, D]`` float32 arrays in
    position order."""
    import mlx.core as mx

    from mlxgraph.interpreter.cache.kv_codec import unpack

    info = cache.layers[lid]
    length, oldest, modulus = info["length"], info["oldest"], info["modulus"]
    if not info.get("slots"):
        return oldest, np.zeros((0, 0, 0, 0), np.float32), np.zeros((0, 0, 0, 0), np.float32)
    policy = cache.policy
    bits, group = policy.get("kv_bits") or 0, policy.get("kv_group_size")
    _check_room(cache, lid, length - oldest)
    out = []
    slots = np.arange(oldest, length) % modulus
    for arr in cache.arrays(lid, bits).values():
        rows = arr[:, :, slots, :]
        if bits:
            dim = _quantized_dim(rows.shape[-1], bits, group)
            codes, scales, biases = unpack(rows, dim, bits, group)
            rows = np.array(
                mx.dequantize(
                    mx.array(codes), mx.array(scales), mx.array(biases), group_size=group, bits=bits
                )
            )
        elif info.get("dtype") == "bfloat16":
            rows = np.array(mx.array(rows).view(mx.bfloat16).astype(mx.float32))
        out.append(rows.astype(np.float32))
    if "value_width" in info:  # latent attention: each value is its key's first columns
        out.append(out[0][..., : info["value_width"]])
    return oldest, out[0], out[1]


def _check_room(cache, lid: int, n: int) -> None:
    """Refuse (CacheFileError) a layer whose float32 history would not fit in memory."""
    from mlxgraph.interpreter.memory import allocatable_bytes

    room = allocatable_bytes()
    batch, heads, _, width = cache.shape(lid, "keys")
    v_width = info_width = cache.layers[lid].get("value_width")
    if info_width is None:
        v_width = cache.shape(lid, "values")[3]
    # The file's bytes, the position-ordered rows, and their float32 values (dequantized:
    # up to 8 floats per 32-bit word at 4 bits).
    need = cache.layer_bytes(lid) + batch * heads * n * (width + v_width) * 4 * 9
    if room is not None and need > room:
        raise cache._error(f"layer {lid} needs {need} bytes to compare, the process can "
                           f"allocate {room}")


def _quantized_dim(width: int, bits: int, group: int) -> int:
    """The row length D whose packed width (D*bits/32 + 2*D/group words) is ``width``."""
    # width = D * (bits / 32 + 2 / group)  =>  D = width * 32 * group / (bits * group + 64)
    return width * 32 * group // (bits * group + 64)


def _position_diff(xa: np.ndarray, xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position: max |a - b| and max |a| over batch, heads and dims. NaN in both at
    one place counts as equal, NaN in one only as an infinite difference."""
    nan_a, nan_b = np.isnan(xa), np.isnan(xb)
    d = np.where(nan_a & nan_b, 0.0, np.where(nan_a | nan_b, np.inf, np.abs(xa - xb)))
    scale = np.where(nan_a, 0.0, np.abs(xa)).max(axis=(0, 1, 3))
    return d.max(axis=(0, 1, 3)), np.maximum(scale, 1e-30)


def diff_caches(a, b, tolerance: float, block: int) -> dict:
    """Per layer and per block of positions: max abs / rel difference of keys and values,
    and the first position whose relative difference exceeds ``tolerance``.

    The relative difference of a position is its max |a - b| over heads and dims divided by
    its max |a| (so a quantized row's error reads as a fraction of the row's range).
    """
    layers, first_any = [], None
    for lid in sorted(set(a.layers) | set(b.layers)):
        if lid not in a.layers or lid not in b.layers:
            layers.append({"layer": lid, "missing_in": "a" if lid not in a.layers else "b"})
            continue
        if {a.layers[lid]["kind"], b.layers[lid]["kind"]} & set(STATE_KINDS):
            layers.append(_state_diff(a, b, lid, tolerance))
            continue
        fa, ka, va = layer_history(a, lid)
        fb, kb, vb = layer_history(b, lid)
        lo, hi = max(fa, fb), min(fa + ka.shape[2], fb + kb.shape[2])
        entry = {
            "layer": lid,
            "positions": [lo, hi - 1] if hi > lo else None,
            "ranges": [],
            "first_divergence": None,
        }
        if (
            ka.shape[:2] != kb.shape[:2]
            or ka.shape[3:] != kb.shape[3:]
            or va.shape[3:] != vb.shape[3:]
        ):
            entry["shape_mismatch"] = [list(ka.shape), list(kb.shape)]
            layers.append(entry)
            continue
        per_pos = []
        parts = {}
        for name, xa, xb in (("keys", ka, kb), ("values", va, vb)):
            xa, xb = xa[:, :, lo - fa : hi - fa], xb[:, :, lo - fb : hi - fb]
            absd, scale = _position_diff(xa, xb) if hi > lo else (np.zeros(0), np.ones(0))
            parts[name] = (absd, absd / scale)
            per_pos.append(absd / scale)
        worst = np.maximum(*per_pos) if hi > lo else np.zeros(0)
        for start in range(lo, hi, block):
            sl = slice(start - lo, min(hi, start + block) - lo)
            entry["ranges"].append(
                {
                    "positions": [start, min(hi, start + block) - 1],
                    **{
                        f"{name}_max_{kind}": float(vals[i][sl].max())
                        for name, vals in parts.items()
                        for i, kind in enumerate(("abs", "rel"))
                    },
                }
            )
        over = np.flatnonzero(worst > tolerance)
        if over.size:
            pos = lo + int(over[0])
            entry["first_divergence"] = {"position": pos, "rel": float(worst[over[0]])}
            first_any = pos if first_any is None else min(first_any, pos)
        layers.append(entry)
    same = (
        first_any is None
        and a.length == b.length
        and all("missing_in" not in la and "shape_mismatch" not in la for la in layers)
        and not any(la.get("state_diverges") for la in layers)
    )
    return {
        "same": same,
        "tolerance": tolerance,
        "same_graph": a.graph == b.graph,
        "length": {"a": a.length, "b": b.length},
        "first_divergence": first_any,
        "layers": layers,
    }


def _state_diff(a, b, lid: int, tolerance: float) -> dict:
    """Two files' recurrent state of layer ``lid``: max abs and rel (to max |a|) difference.
    A state sums up the whole history, so it names no position: ``state_diverges`` says
    whether the rel difference exceeds ``tolerance``."""
    kinds = [a.layers[lid]["kind"], b.layers[lid]["kind"]]
    if kinds[0] != kinds[1] or a.layers[lid]["shape"] != b.layers[lid]["shape"]:
        return {"layer": lid, "shape_mismatch": [a.layers[lid].get("shape", kinds[0]),
                                                 b.layers[lid].get("shape", kinds[1])]}
    xa, xb = (_state_float(c, lid) for c in (a, b))
    absd, _ = _position_diff(xa[:, :, None, :].reshape(1, 1, 1, -1),
                             xb[:, :, None, :].reshape(1, 1, 1, -1))
    rel = float(absd[0] / max(float(np.nanmax(np.abs(xa))) if xa.size else 0.0, 1e-30))
    return {"layer": lid, "kind": kinds[0], "state_max_abs": float(absd[0]),
            "state_max_rel": rel, "state_diverges": rel > tolerance, "first_divergence": None}


def _state_float(cache, lid: int) -> np.ndarray:
    arr = cache.arrays(lid, 0)["state"]
    if cache.layers[lid]["dtype"] == "bfloat16":
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)
