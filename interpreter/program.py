"""Program: a loaded graph file, verified once, weights mapped once, nodes resolved once.

Every node is resolved at load to a :class:`ResolvedNode` (node_plan.py), so a step does
no FlatBuffer parsing. A Program is immutable; any number of sessions share it.
"""

import hashlib
import mmap
from functools import cached_property
from pathlib import Path

import mlx.core as mx

from mlxgraph.interpreter.errors import GraphRuntimeError
from mlxgraph.interpreter.mlx_dtypes import to_mx_dtype
from mlxgraph.interpreter.node_plan import ResolvedNode, resolve_node
from mlxgraph.interpreter.session import Session
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.format import align_up
from mlxgraph.schema.reader import open_graph


class Program:
    """An immutable loaded graph: slots, constants (as MLX arrays), resolved nodes, metadata."""

    def __init__(self, graph, constants, nodes, layers):
        self.graph = graph                  # the GraphFile (records, metadata)
        self.path = graph.path
        self.metadata = graph.metadata
        self.tensor_count = len(graph.tensors)
        self.value_count = len(graph.values)
        self.constants = constants          # {tensor slot: mx.array}
        # Every step starts from this: tensor slots with the constants in place, copied at
        # C speed instead of placing each constant again.
        self.initial_tensors = tuple(constants.get(slot) for slot in range(self.tensor_count))
        self.nodes = nodes                  # [ResolvedNode]
        self.layers = layers                # {layer_id: LayerCacheInfo}
        self.inputs = graph.inputs
        self.outputs = graph.outputs

    @classmethod
    def load(cls, path) -> "Program":
        """Verify and load a graph file.

        Args:
            path: the .mlxg file.
        Raises:
            GraphFormatError: invalid file, or an op this version cannot run.
        """
        graph = open_graph(path)
        tensor_dtypes = [to_mx_dtype(t.dtype) if t.dtype else None for t in graph.tensors]
        constants = {}
        for i, c in enumerate(graph.constants):
            arr = graph.constant_array(i)
            a = mx.array(arr)
            want = tensor_dtypes[c.tensor]
            if a.dtype != want:
                a = a.view(want)  # bfloat16 is stored as its uint16 bit pattern
            constants[c.tensor] = a
            _release_mapped_pages(graph.data, c.offset, c.length)
        nodes = [resolve_node(i, r, tensor_dtypes, graph.path) for i, r in enumerate(graph.nodes)]
        layers = _layer_geometry(graph, nodes)
        return cls(graph, constants, nodes, layers)

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the graph's FlatBuffer part: its structure, attributes, metadata and
        every constant's content hash (not the constants' bytes, not the path)."""
        data = self.graph.data
        end = min((c.offset for c in self.graph.constants), default=len(data))
        return hashlib.sha256(memoryview(data)[:end]).hexdigest()

    def restore(self, path):
        """A new Session holding the KV cache saved in ``path`` (with the policy it was saved with).

        Raises:
            CacheFileError: the file is unreadable, truncated, changed, or for another graph.
        """
        from mlxgraph.interpreter.cache_file import restore

        return restore(self, path)

    def session(self, capacity=None, kv_dtype=None, windows=None, preallocate=False, max_step=None,
                kv_bits=0, kv_group_size=64):
        """Start a session: its own KV stores and value slots over this program's weights.

        Args: as :class:`~mlxgraph.interpreter.session.Session` takes them.
        Raises:
            SessionError: a bad override. CacheError: a cache policy a store cannot honour.
        """
        return Session(
            self,
            capacity=capacity,
            kv_dtype=kv_dtype,
            windows=windows,
            preallocate=preallocate,
            max_step=max_step,
            kv_bits=kv_bits,
            kv_group_size=kv_group_size,
        )

    def __repr__(self) -> str:
        name = Path(self.path).name if self.path else "<bytes>"
        return f"Program({name}: {len(self.nodes)} nodes, {len(self.layers)} attention layers)"


def _release_mapped_pages(data, offset: int, length: int) -> None:
    """Drop a constant's mapped pages once MLX holds its own copy of it.

    mx.array copies from the mapping; without this the weights would be resident twice
    (the file's clean pages plus MLX's buffers), and releasing each constant right after
    its copy keeps the peak near one copy. The mapping stays valid: a later read of the
    constant (tools) faults its pages back in from the file.
    """
    if not isinstance(data, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or length == 0:
        return
    start = offset - offset % mmap.PAGESIZE
    end = min(align_up(offset + length, mmap.PAGESIZE), len(data))
    data.madvise(mmap.MADV_DONTNEED, start, end - start)


def _layer_geometry(graph, nodes) -> dict:
    """Cache geometry per layer_id, from the metadata.

    A layer with no metadata entry is an error, not a guess: guessing "full attention"
    from the K/V shapes would silently run a sliding-window layer wrongly.
    """
    known = {lc.layer_id: lc for lc in graph.metadata.layers}
    out = {}
    for n in nodes:
        if n.record.op != "UpdateAndAttendNode":
            continue
        lid = n.fixed["layer_id"]
        if lid in out:
            raise GraphFormatError(
                f"layer_id {lid} is used by two UpdateAndAttend nodes",
                graph.path,
                n.index,
                "layer_id",
            )
        if lid not in known:
            raise GraphFormatError(
                f"layer_id {lid} has no cache geometry in the metadata (metadata.layers)",
                graph.path,
                n.index,
                "layer_id",
            )
        out[lid] = known[lid]
    return out


__all__ = ["Program", "ResolvedNode", "GraphRuntimeError"]
