"""The session header of a cache file (``mlxgraph.session``), checked field by field.

A cache file may come from a stranger, and its seal proves nothing (anyone can seal with
mlxgraph's writer), so every field readers use is checked here for its type, range and
relations before anything trusts it: the length and token ids, the policy a restore
adopts, and per layer the store's kind, positions and slots, which must agree with the
tensors the file holds (their dtypes and shapes) so that no reader indexes past them and
no dequantization meets parts that do not fit. Each failure is one line naming the field.
"""

from __future__ import annotations

import json

from mlxgraph.schema.errors import Error

MAX_INT = 2**31 - 1   # positions, capacities, windows, slots: int32 on the graph's side
_POLICY = {"capacity", "kv_dtype", "kv_bits", "kv_group_size", "windows", "preallocate",
           "max_step"}
_DOC = {"length", "policy", "tokens", "layers", "approximations"}
_LAYER = {"kind", "length", "oldest", "batch", "dtype", "slots", "window", "modulus"}
# A latent-attention layer (graph format 1.3) adds value_width: its values are the first
# value_width columns of its keys, and the file holds no values tensor for it.
_LATENT_LAYER = _LAYER | {"value_width"}
# A recurrent state's layer (graph format 1.3; a kind older readers refuse by name).
_STATE_LAYER = {"kind", "length", "shape", "dtype"}
STATE_KINDS = ("conv_state", "ssm_state", "delta_state", "scan_state")
# The safetensors dtype of each storage dtype a store writes.
_STORED = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
PARTS = ("codes", "scales", "biases")


class HeaderError(Error, ValueError):
    """The header is malformed (the message names the field)."""


def _int(value, what: str, low: int = 0, high: int = MAX_INT) -> int:
    if type(value) is not int or not low <= value <= high:
        raise HeaderError(f"{what} must be an int in [{low}, {high}], got {_short(value)}")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _layer_id(key) -> int:
    """A layer id as a canonical decimal string ("0", "12"; not "00", " 1", "1_0")."""
    if not isinstance(key, str) or not key.isascii() or not key.isdigit() or (
            key != "0" and key.startswith("0")) or len(key) > 10:
        raise HeaderError(f"layer id {_short(key)} is not a decimal int")
    return _int(int(key), "a layer id")


def _int_map(value, what: str, low: int = 0) -> dict:
    """{layer id: int} from a JSON object of decimal keys."""
    if not isinstance(value, dict):
        raise HeaderError(f"{what} must be an object, got {_short(value)}")
    return {_layer_id(k): _int(v, f"{what}[{k}]", low) for k, v in value.items()}


def _exact_keys(obj, keys: set, what: str) -> dict:
    if not isinstance(obj, dict):
        raise HeaderError(f"{what} must be an object, got {_short(obj)}")
    if set(obj) != keys:
        missing, extra = sorted(keys - set(obj)), sorted(set(obj) - keys)
        raise HeaderError(f"{what}: missing {missing}, unknown {[_short(k) for k in extra]}")
    return obj


def parse_session(text: str) -> dict:
    """The checked ``mlxgraph.session`` document (layer ids as ints).

    Raises:
        HeaderError: not JSON, or a field of the wrong type, range or relation.
    """
    try:
        doc = json.loads(text)
    except RecursionError:
        raise HeaderError("not JSON (nested too deeply)") from None
    except ValueError as e:
        raise HeaderError(f"not JSON ({e})") from None
    _exact_keys(doc, _DOC, "the session header")
    length = _int(doc["length"], "length")
    policy = _exact_keys(doc["policy"], _POLICY, "policy")
    _int(policy["capacity"], "policy capacity", 1)
    _int(policy["max_step"], "policy max_step", 1)
    if policy["kv_dtype"] not in (None, *_STORED):
        raise HeaderError(f"policy kv_dtype {_short(policy['kv_dtype'])} is not one of "
                          f"{sorted(_STORED)} or null")
    if type(policy["kv_bits"]) is not int or policy["kv_bits"] not in (0, 4, 8) or type(
            policy["kv_group_size"]) is not int or policy["kv_group_size"] not in (32, 64, 128):
        raise HeaderError(f"kv_bits {_short(policy['kv_bits'])} / kv_group_size "
                          f"{_short(policy['kv_group_size'])} are not ones mlxgraph writes")
    if type(policy["preallocate"]) is not bool:
        raise HeaderError("policy preallocate must be true or false")
    _int_map(policy["windows"], "policy windows")
    tokens = doc["tokens"]
    if tokens is not None:
        if not isinstance(tokens, list) or len(tokens) != length:
            raise HeaderError(f"tokens must be null or a list of {length} token ids")
        for t in tokens:
            _int(t, "a token id")
    approximations = _int_map(doc["approximations"], "approximations", 1)
    if not isinstance(doc["layers"], dict):
        raise HeaderError(f"layers must be an object, got {_short(doc['layers'])}")
    layers = {_layer_id(k): _layer(k, v, length) for k, v in doc["layers"].items()}
    return {"length": length, "policy": policy, "tokens": tokens, "layers": layers,
            "approximations": approximations}


def _state_layer(lid, info, length: int) -> dict:
    what = f"layer {lid}"
    _exact_keys(info, _STATE_LAYER, what)
    if _int(info["length"], f"{what} length") != length:
        raise HeaderError(f"{what}: length {info['length']}, the session holds {length}")
    shape = info["shape"]
    if not isinstance(shape, list) or len(shape) not in (3, 4) or shape[0] != 1:
        raise HeaderError(f"{what} shape {_short(shape)} is not [1, ...] of rank 3 or 4")
    for d in shape:
        _int(d, f"{what} shape", 1)
    if info["dtype"] not in _STORED:
        raise HeaderError(f"{what} dtype {_short(info['dtype'])} is not a storage dtype")
    return dict(info)


def _layer(lid, info, length: int) -> dict:
    if isinstance(info, dict) and info.get("kind") in STATE_KINDS:
        return _state_layer(lid, info, length)
    latent = isinstance(info, dict) and "value_width" in info
    _exact_keys(info, _LATENT_LAYER if latent else _LAYER, f"layer {lid}")
    what = f"layer {lid}"
    if latent:
        _int(info["value_width"], f"{what} value_width", 1)
    n, oldest, slots, modulus = (_int(info[k], f"{what} {k}") for k in
                                 ("length", "oldest", "slots", "modulus"))
    _int(info["window"], f"{what} window")
    kind = info["kind"]
    if kind not in ("flat", "ring"):
        raise HeaderError(f"{what} kind {_short(kind)} is not flat, ring or "
                          f"{', '.join(STATE_KINDS)}")
    if n != length or oldest > n or n - oldest > slots or slots > modulus:
        raise HeaderError(f"{what}: positions {oldest}..{n} do not fit {slots} of {modulus} "
                          f"slots (the session holds {length})")
    if kind == "flat" and (oldest or slots != n):
        raise HeaderError(f"{what}: a flat store holds exactly its {n} positions from 0")
    if kind == "ring" and slots < min(modulus, n):
        raise HeaderError(f"{what}: {slots} slots cannot hold positions {oldest}..{n - 1}")
    if slots:
        _int(info["batch"], f"{what} batch", 1)
        if info["dtype"] not in (*_STORED, "uint32"):
            raise HeaderError(f"{what} dtype {_short(info['dtype'])} is not a storage dtype")
    return dict(info)


def check_tensors(layers: dict, bits: int, group: int, entries: dict) -> set:
    """Every layer's tensors exist with the dtype and ``[batch, heads, slots, width]`` its
    header says (quantized parts whose widths fit one row length); returns their names.

    Args:
        layers: {layer id: checked layer info}. entries: {name: (st dtype, shape)}.
    Raises:
        HeaderError: a tensor missing, of another dtype, rank or shape.
    """
    names = set()
    for lid, info in layers.items():
        if info["kind"] in STATE_KINDS:
            names.add(_state_tensor(lid, info, entries))
            continue
        if not info["slots"]:
            continue
        heads = None
        for which in ("keys",) if "value_width" in info else ("keys", "values"):
            base = f"layer.{lid}.{which}"
            parts = [f"{base}.{p}" for p in PARTS] if bits else [base]
            want = ["U32", "F32", "F32"] if bits else [_STORED.get(info["dtype"])]
            if bits and info["dtype"] != "uint32" or not bits and info["dtype"] == "uint32":
                raise HeaderError(f"layer {lid}: dtype {info['dtype']} with kv_bits {bits}")
            widths = []
            for name, dtype in zip(parts, want):
                got = entries.get(name)
                if got is None:
                    raise HeaderError(f"layer {lid}: tensor {name} is missing")
                shape = got[1]
                if got[0] != dtype or len(shape) != 4 or shape[0] != info["batch"] or (
                        shape[2] != info["slots"]) or not shape[1] or not shape[3]:
                    raise HeaderError(
                        f"tensor {name}: {got[0]} {list(shape)}, expected {dtype} "
                        f"[{info['batch']}, heads, {info['slots']}, width]")
                if heads not in (None, shape[1]):
                    raise HeaderError(f"tensor {name}: {shape[1]} heads, keys have {heads}")
                heads = shape[1]
                widths.append(shape[3])
                names.add(name)
            if bits and (widths[1] != widths[2] or widths[0] * 32 != widths[1] * group * bits):
                raise HeaderError(f"layer {lid} {which}: codes of width {widths[0]} and "
                                  f"{widths[1]} groups do not make rows of {bits}-bit groups "
                                  f"of {group}")
    return names


def _state_tensor(lid, info: dict, entries: dict) -> str:
    """The name of a state layer's one tensor, once it has the header's dtype and shape."""
    name = f"layer.{lid}.state"
    got = entries.get(name)
    want = _STORED[info["dtype"]]
    if got is None or got[0] != want or list(got[1]) != info["shape"]:
        raise HeaderError(f"tensor {name}: {None if got is None else [got[0], list(got[1])]}, "
                          f"expected {want} {info['shape']}")
    return name
