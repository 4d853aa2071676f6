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
import os

import numpy as np

from mlxgraph.interpreter.cache.header import (
    PARTS,
    STATE_KINDS,
    HeaderError,
    check_tensors,
    parse_session,
)
from mlxgraph.interpreter.cache.kv_cache import CacheError
from mlxgraph.interpreter.cache.kv_codec import unpack
from mlxgraph.interpreter.cache.safetensors_io import SafetensorsError, SafetensorsFile, write
from mlxgraph.interpreter.errors import CacheFileError
from mlxgraph.interpreter.memory import allocatable_bytes

FORMAT, VERSION, SEAL = "mlxgraph-kv-cache", "1", "mlxgraph.sha256"


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
        if info["kind"] in STATE_KINDS:  # a recurrent state: one float tensor
            tensors[f"layer.{lid}.state"] = arrays["state"]
            if info["dtype"] == "bfloat16":
                st_dtypes[f"layer.{lid}.state"] = "BF16"
            continue
        bits, group = store.policy.kv_bits, store.policy.kv_group_size
        dims = (store.geometry.head_dim, store.geometry.v_head_dim)
        for which, (name, arr) in enumerate(arrays.items()):
            key = f"layer.{lid}.{name}"
            if bits:
                for part, piece in zip(PARTS, unpack(arr, dims[which], bits, group)):
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
    return os.stat(path).st_size


class CacheFile:
    """A read, checked cache file (container, seal and header; not yet matched to a graph).

    Only the header is kept: tensors are read when asked for (``arrays``), after callers
    checked their sizes (the header's shapes, already checked to tile the file exactly).

    Attributes: path, graph (fingerprint), length, policy (dict), tokens (list or None),
    layers ({layer_id: snapshot info}), approximations ({layer_id: window} of full-attention
    layers the session windowed), nbytes (the file's size).
    """

    def __init__(self, path, check_seal=True):
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
        self.graph = meta.get("mlxgraph.graph")
        try:
            doc = parse_session(meta.get("mlxgraph.session", "null"))
            self.length, self.policy, self.tokens = doc["length"], doc["policy"], doc["tokens"]
            self.layers, self.approximations = doc["layers"], doc["approximations"]
            bits, group = self.policy["kv_bits"], self.policy["kv_group_size"]
            names = check_tensors(self.layers, bits, group, self._st.entries)
        except HeaderError as e:
            raise self._error(f"malformed session header: {e}") from None
        if self.graph is None:
            raise self._error("no mlxgraph.graph fingerprint")
        extra = set(self._st.entries) - names
        if extra:
            raise self._error(f"holds tensors no store reads: {sorted(extra)[:4]}")
        self.nbytes = self._st.size
        room = allocatable_bytes()
        if room is not None and self._st.data_bytes > room:
            raise self._error(f"holds {self._st.data_bytes} bytes of tensors, more than this "
                              f"process can allocate ({room}); no session could use it")
        self._sealed = False
        if check_seal:
            self.check_seal()

    def check_seal(self) -> None:
        """Refuse the file unless its SHA-256 seal matches (reads it once, 16 MiB at a time).
        ``CacheFile(path, check_seal=False)`` defers this, so a restore can first check the
        header's sizes against the graph (a huge file for another graph is never read).

        Raises:
            CacheFileError: the seal does not match, or the file cannot be read.
        """
        if self._sealed:
            return
        try:
            matches = self._st.seal_matches(SEAL)
        except OSError as e:
            raise self._error(f"cannot read ({e.strerror or e})") from None
        except SafetensorsError as e:
            raise self._error(f"not a readable cache file: {e}") from None
        if not matches:
            raise self._error("the contents do not match their SHA-256 seal "
                              "(the file was changed or damaged)")
        self._sealed = True

    def _error(self, what: str) -> CacheFileError:
        return CacheFileError(f"{self.path}: {what}")

    def shape(self, lid: int, name: str) -> tuple:
        """The ``[B, H, slots, width]`` of layer ``lid``'s ``keys``/``values`` as a store
        holds them (quantized parts packed into one row); () when it holds no slots."""
        key = f"layer.{lid}.{name}"
        if not self.policy["kv_bits"] or self.layers[lid]["kind"] in STATE_KINDS:
            return self._st.entries[key][1] if key in self._st.entries else ()
        if f"{key}.codes" not in self._st.entries:
            return ()
        shapes = [self._st.entries[f"{key}.{p}"][1] for p in PARTS]
        return (*shapes[0][:3], sum(s[3] for s in shapes))

    def layer_bytes(self, lid: int) -> int:
        """The bytes layer ``lid``'s tensors take in the file."""
        prefix = f"layer.{lid}."
        return sum(self._st.nbytes(n) for n in self._st.entries if n.startswith(prefix))

    def arrays(self, lid: int, bits: int) -> dict:
        """{'keys', 'values'} of layer ``lid`` as numpy arrays (quantized parts re-packed),
        or {'state'} of a recurrent state's layer, read from the file now: callers check
        ``shape`` first.

        Raises:
            CacheFileError: the file cannot be read, changed, or does not fit in memory.
        """
        out = {}
        state = self.layers[lid]["kind"] in STATE_KINDS
        try:
            names = ("keys",) if "value_width" in self.layers[lid] else ("keys", "values")
            for name in ("state",) if state else names:
                key = f"layer.{lid}.{name}"
                if not bits or state:
                    out[name] = self._st.array(key)
                    continue
                codes, scales, biases = (self._st.array(f"{key}.{p}") for p in PARTS)
                out[name] = np.concatenate(
                    [codes, scales.view("<u4"), biases.view("<u4")], axis=-1)
        except KeyError as e:
            raise self._error(f"tensor {e} is missing") from None
        except (SafetensorsError, MemoryError) as e:
            raise self._error(f"cannot read layer {lid}: {e or 'out of memory'}") from None
        except OSError as e:
            raise self._error(f"cannot read ({e.strerror or e})") from None
        return out


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
    for lid, store in session.stores.items():  # sizes from the header, before any read
        info = cache.layers[lid]
        try:
            names = getattr(store, "snapshot_names", ("keys", "values"))
            store.check_snapshot_shapes(info, {n: cache.shape(lid, n) for n in names})
        except CacheError as e:
            raise cache._error(str(e)) from None
    need = 2 * sum(cache.layer_bytes(lid) for lid in session.stores)  # numpy, then MLX
    room = allocatable_bytes()
    if room is not None and need > room:
        raise cache._error(f"its tensors need {need} bytes, the process can allocate {room}")
    cache.check_seal()
    states = {}
    for lid, store in session.stores.items():
        info = cache.layers[lid]
        held = info["kind"] in STATE_KINDS or info["slots"]
        arrays = cache.arrays(lid, session.policy["kv_bits"]) if held else {}
        try:
            states[lid] = store.checked_snapshot(info, arrays)
        except CacheError as e:
            raise cache._error(str(e)) from None
    session.adopt({lid: states[lid] for lid in session.stores}, cache.length)


def restore(program, path):
    """A new session of ``program`` with the cache saved in ``path`` (and its policy).

    Raises:
        CacheFileError: the file is unreadable, damaged, or for another graph.
    """
    from mlxgraph.interpreter.errors import SessionError

    cache = path if isinstance(path, CacheFile) else CacheFile(path, check_seal=False)
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
