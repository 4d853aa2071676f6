"""A session's KV cache as a file: save, read (strictly), restore.

The file is safetensors (safetensors_io.py): one tensor per store buffer, named
``layer.<id>.keys`` / ``layer.<id>.values`` ([B, kv_heads, slots, head_dim], the store's
live slots: a flat store's first ``length``, a ring's whole buffer in slot order). A
quantized store's packed rows are saved as three tensors each, ``.codes`` (uint32),
``.scales`` and ``.biases`` (float32), the layout mx.quantize uses. The metadata holds:

- ``mlxgraph.format`` = ``mlxgraph-kv-cache``, ``mlxgraph.version`` = ``1``;
- ``mlxgraph.graph``: the graph's fingerprint (Program.fingerprint: its structure and
  constant hashes, not its path);
- ``mlxgraph.session``: JSON with the length, the cache policy, the token ids if the
  saver gave them, and per layer the store's kind, length, oldest position, batch, dtype;
- ``mlxgraph.sha256``: a seal over everything else, so a changed byte is refused.

Restoring checks the container, the seal, the graph, the policy and every store's
snapshot before anything changes; then continuing is bitwise identical to never having
stopped, because the stores get back exactly the slots their reads use.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlxgraph.interpreter.errors import CacheFileError
from mlxgraph.interpreter.kv_cache import CacheError
from mlxgraph.interpreter.kv_codec import unpack
from mlxgraph.interpreter.safetensors_io import SafetensorsError, SafetensorsFile, write

FORMAT, VERSION, SEAL = "mlxgraph-kv-cache", "1", "mlxgraph.sha256"
_PARTS = ("codes", "scales", "biases")


def save_session(session, path, tokens=None) -> int:
    """Write ``session``'s cache to ``path`` (atomically); returns the file's size in bytes.

    Args:
        session: the Session (no step open).
        path: the file to write.
        tokens: optional token ids the history was built from (for prompt-cache reuse);
            must number ``session.length``.
    Raises:
        CacheError: a step is open. ValueError: tokens of the wrong count. OSError.
    """
    if tokens is not None:
        tokens = [int(t) for t in tokens]
        if len(tokens) != session.length:
            raise ValueError(f"save: {len(tokens)} tokens given for a history of {session.length}")
    tensors, st_dtypes, layers = {}, {}, {}
    for lid, store in session.stores.items():
        info, arrays = store.snapshot()
        layers[str(lid)] = info
        bits, group = store.policy.kv_bits, store.policy.kv_group_size
        dims = (store.geometry.head_dim, store.geometry.v_head_dim)
        for which, (name, arr) in enumerate(arrays.items()):
            key = f"layer.{lid}.{name}"
            if bits:
                for part, piece in zip(_PARTS, unpack(arr, dims[which], bits, group)):
                    tensors[f"{key}.{part}"] = piece
            else:
                tensors[key] = arr
                if info["dtype"] == "bfloat16":
                    st_dtypes[key] = "BF16"
    doc = {
        "length": session.length,
        "policy": session.policy,
        "tokens": tokens,
        "layers": layers,
        "approximations": {str(k): v for k, v in session.approximations.items()},
    }
    meta = {
        "mlxgraph.format": FORMAT,
        "mlxgraph.version": VERSION,
        "mlxgraph.graph": session.program.fingerprint,
        "mlxgraph.session": json.dumps(doc),
    }
    write(path, tensors, meta, st_dtypes, seal=SEAL)
    return Path(path).stat().st_size


class CacheFile:
    """A read, checked cache file (container, seal and header; not yet matched to a graph).

    Attributes: path, graph (fingerprint), length, policy (dict), tokens (list or None),
    layers ({layer_id: snapshot info}), approximations ({layer_id: window} of full-attention
    layers the session windowed), nbytes (the file's size).
    """

    def __init__(self, path):
        self.path = str(path)
        try:
            self._st = SafetensorsFile(path)
        except OSError as e:
            raise self._error(f"cannot read ({e.strerror or e})") from None
        except SafetensorsError as e:
            raise self._error(f"not a readable cache file: {e}") from None
        meta = self._st.metadata
        if meta.get("mlxgraph.format") != FORMAT:
            raise self._error(
                f"not an mlxgraph cache file (format {meta.get('mlxgraph.format')!r})"
            )
        if meta.get("mlxgraph.version") != VERSION:
            raise self._error(
                f"cache file version {meta.get('mlxgraph.version')!r}; "
                f"this mlxgraph reads {VERSION}"
            )
        if not self._st.seal_matches(SEAL):
            raise self._error(
                "the contents do not match their SHA-256 seal (the file was changed or damaged)"
            )
        self.graph = meta.get("mlxgraph.graph")
        try:
            doc = json.loads(meta["mlxgraph.session"])
            self.length, self.policy, self.tokens = (
                int(doc["length"]),
                dict(doc["policy"]),
                doc["tokens"],
            )
            self.layers = {int(lid): dict(info) for lid, info in doc["layers"].items()}
            self.approximations = dict(doc.get("approximations") or {})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise self._error(f"malformed session header ({type(e).__name__}: {e})") from None
        self.nbytes = Path(path).stat().st_size
        self._check_layers()

    def _check_layers(self) -> None:
        """Every layer's header agrees with its tensors (readers index slots with it)."""
        bits, group = self.policy.get("kv_bits"), self.policy.get("kv_group_size")
        if bits not in (0, 4, 8) or group not in (32, 64, 128):
            raise self._error(
                f"kv_bits {bits!r} / kv_group_size {group!r} are not ones mlxgraph writes"
            )
        for lid, info in self.layers.items():
            fields = [info.get(k) for k in ("length", "oldest", "slots", "modulus", "window")]
            if not all(type(x) is int and x >= 0 for x in fields):
                raise self._error(
                    f"layer {lid}: length, oldest, slots, modulus, window must be ints >= 0"
                )
            length, oldest, slots, modulus, _ = fields
            if (
                oldest > length
                or length - oldest > slots
                or slots > modulus
                or length != self.length
            ):
                raise self._error(
                    f"layer {lid}: positions {oldest}..{length} do not fit "
                    f"{slots} of {modulus} slots"
                )
            if not slots:
                continue
            names = [
                f"layer.{lid}.{n}" + (f".{p}" if bits else "")
                for n in ("keys", "values")
                for p in (_PARTS if bits else ("",))
            ]
            shapes = {self._st.entries[n][1] if n in self._st.entries else None for n in names}
            if (
                None in shapes
                or {(len(s), s[2]) for s in shapes if len(s) > 2} != {(4, slots)}
                or len({s[:3] for s in shapes}) != 1
            ):
                raise self._error(
                    f"layer {lid}: its tensors {sorted(names)} are missing or do not all "
                    f"hold [B, H, {slots}, ...]"
                )

    def _error(self, what: str) -> CacheFileError:
        return CacheFileError(f"{self.path}: {what}")

    def arrays(self, lid: int, bits: int) -> dict:
        """{'keys', 'values'} of layer ``lid`` as numpy arrays (quantized parts re-packed).

        Raises:
            CacheFileError: a tensor is missing or its parts do not fit together.
        """
        out = {}
        for name in ("keys", "values"):
            key = f"layer.{lid}.{name}"
            try:
                if not bits:
                    out[name] = self._st.array(key)
                    continue
                codes, scales, biases = (self._st.array(f"{key}.{p}") for p in _PARTS)
                out[name] = np.concatenate([codes, scales.view("<u4"), biases.view("<u4")], axis=-1)
            except KeyError as e:
                raise self._error(f"tensor {e} is missing") from None
            except ValueError as e:
                raise self._error(f"tensor {key}: parts do not fit together ({e})") from None
        return out

    def unused_tensors(self, expected: set) -> set:
        """Tensor names in the file that no store reads."""
        return set(self._st.entries) - expected


def load_into(session, cache: CacheFile) -> None:
    """Replace ``session``'s cache with the file's; refused (session unchanged) unless the
    file is for this graph and this policy and every store accepts its snapshot.

    Raises:
        CacheFileError: what does not match, naming the file and the layer.
    """
    program = session.program
    if cache.graph != program.fingerprint:
        raise cache._error(
            f"saved from another graph (fingerprint {str(cache.graph)[:16]}), "
            f"not {program.path or '<bytes>'} (fingerprint {program.fingerprint[:16]})"
        )
    if cache.policy != session.policy:
        diff = sorted(
            k
            for k in set(cache.policy) | set(session.policy)
            if cache.policy.get(k) != session.policy.get(k)
        )
        raise cache._error(
            f"saved with another cache policy ({', '.join(diff)}: file "
            f"{[cache.policy.get(k) for k in diff]}, "
            f"session {[session.policy.get(k) for k in diff]})"
        )
    if set(cache.layers) != set(session.stores):
        raise cache._error(
            f"holds layers {sorted(cache.layers)}, the graph has {sorted(session.stores)}"
        )
    states, expected = {}, set()
    for lid, store in session.stores.items():
        info = cache.layers[lid]
        if info.get("length") != cache.length:
            raise cache._error(
                f"layer {lid} holds {info.get('length')} positions, the session {cache.length}"
            )
        bits = store.policy.kv_bits
        arrays = cache.arrays(lid, bits) if info.get("slots") else {}
        names = [f"layer.{lid}.{n}" for n in arrays]
        expected |= {f"{k}.{p}" for k in names for p in _PARTS} if bits else set(names)
        try:
            states[lid] = store.checked_snapshot(info, arrays)
        except CacheError as e:
            raise cache._error(str(e)) from None
    extra = cache.unused_tensors(expected)
    if extra:
        raise cache._error(f"holds tensors no store reads: {sorted(extra)[:4]}")
    session.adopt({lid: states[lid] for lid in session.stores}, cache.length)


def restore(program, path):
    """A new session of ``program`` with the cache saved in ``path`` (and its policy).

    Raises:
        CacheFileError: the file is unreadable, damaged, or for another graph.
    """
    from mlxgraph.interpreter.errors import SessionError

    cache = path if isinstance(path, CacheFile) else CacheFile(path)
    try:
        session = program.session(**policy_arguments(cache.policy))
    except (SessionError, CacheError, TypeError, ValueError) as e:
        raise cache._error(f"its cache policy does not fit this graph: {e}") from None
    load_into(session, cache)
    return session


def policy_arguments(policy: dict) -> dict:
    """Session keyword arguments from a saved policy dict."""
    args = dict(policy)
    windows = args.get("windows")
    if isinstance(windows, dict):
        args["windows"] = {int(k): v for k, v in windows.items()}
    return args
