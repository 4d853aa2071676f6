"""Program: a loaded graph file, verified once, weights mapped once, nodes resolved once.

Every node is resolved at load to a :class:`ResolvedNode` (node_plan.py), so a step does
no FlatBuffer parsing. A Program is immutable; any number of sessions share it.
"""

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cached_property
from os import PathLike
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxgraph.interpreter.errors import GraphRuntimeError
from mlxgraph.interpreter.expert_products import mark_expert_products
from mlxgraph.interpreter.kernels import variant_ops
from mlxgraph.interpreter.load_options import (
    COMPUTE_DTYPES,
    check_compute_dtype,
    check_device_plan,
    check_int8_activations,
)
from mlxgraph.interpreter.mlx_dtypes import HALF_DTYPES, dtype_name, to_mx_dtype, widened
from mlxgraph.interpreter.node_plan import ResolvedNode, resolve_node
from mlxgraph.interpreter.node_runner import compile_program_nodes, last_row_head
from mlxgraph.interpreter.session.session import Session
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.reader import open_graph
from mlxgraph.schema.spec import FieldKind, op_spec


class Program:
    """An immutable loaded graph: slots, constants (as MLX arrays), resolved nodes, metadata."""

    def __init__(self, graph: Any, constants: dict, nodes: list, layers: dict,
                 tensor_dtypes: list, widened_from: tuple = (), stage: Any = None,
                 link: Any = None, device_plan: str = "cpu", variant: str | None = None):
        # Symbol values whose step already had every output checked against the verifier's
        # bounds (shapes follow from them): shared by the sessions, only ever grows.
        self.checked_shapes = set()
        self.graph = graph                  # the GraphFile (records, metadata)
        self.tensor_dtypes = tensor_dtypes  # [mx dtype or None] per tensor slot, as computed
        self.widened_from = widened_from    # half dtypes widened to float32 at load (names)
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
        # {layer_id: the kind of state its node keeps} (op_catalogue's ``state`` fact).
        self.state_kinds = {n.fixed["layer_id"]: entry(n.record.op).state for n in nodes
                            if entry(n.record.op).has(Trait.STATE)}
        # {layer_id: StateLayerInfo}: recurrent states (format 1.3), checked by the verifier,
        # of this program's nodes: a pipeline stage keeps its own layers' states only.
        self.states = {s.layer_id: s for s in graph.metadata.states
                       if s.layer_id in self.state_kinds}
        self.inputs = graph.inputs
        self.outputs = graph.outputs
        self.device_plan = device_plan      # "cpu" or "gpu": the kernels' variants chosen
        self.int8_activations = variant == "int8"   # quantized products round x to int8
        self.stage = stage                  # this rank's StagePlan in a pipeline, else None
        self.link = link                    # its PipelineLink (interpreter/pipeline/link.py)
        # The node computing the output row by row (the LM head), or None (node_runner.py).
        self.last_row_head = last_row_head(nodes, graph.outputs)
        # The common step's code: every node written out once (straight_line.py).
        self.straight_line = compile_program_nodes(self)

    @classmethod
    def load(cls, path, element_limit=None, compute_dtype=None, pipeline=None,
             pipeline_timeout=None, device_plan=None, int8_activations=False) -> "Program":
        """Verify and load a graph file.

        Args:
            path: the .mlxg file (or its bytes).
            element_limit: the most elements one tensor of a step may have (None: the
                file's default, a few times its constants plus its KV cache at max context;
                see schema/verify_bounds.py). Raise it for a file that needs more.
            compute_dtype: None runs the graph in its own dtypes; "float32" widens every
                float16/bfloat16 tensor, weight and dtype attribute to float32 (the
                weights keep their stored values exactly; the arithmetic is float32).
            pipeline: True (the ranks ``mlx.launch`` started) or an ``mx.distributed.Group``:
                load only this rank's stage of a pipeline by layer ranges, its nodes and
                weights (docs/pipeline.md); sessions are then PipelineSessions.
            pipeline_timeout: seconds a rank waits for another before it ends the run
                (default 300).
            device_plan: "cpu" or "gpu": which kernel variants the nodes take
                (kernels/__init__.py); None chooses by MLX's default device. Forcing "gpu"
                on a CPU runs the GPU plan there (the tests check it against the CPU's).
            int8_activations: True rounds x to int8 per 32 values in every float32 product
                with a q8/q4 weight the int8 kernel takes (as llama.cpp's q8_0 activations:
                faster on CPUs with VNNI; docs/precision.md measures its loss); False
                (default) computes them exactly.
        Raises:
            GraphFormatError: invalid file, a step that could cost more than the limit, an
                op this version cannot run, or a graph that cannot be cut into that many
                stages.
            PipelineError: the pipeline's ranks cannot connect.
            ValueError: an unsupported compute_dtype, pipeline or pipeline_timeout, or
                int8_activations where the int8 kernel cannot run.
        """
        widen = check_compute_dtype(compute_dtype)
        plan = check_device_plan(device_plan)
        variant = check_int8_activations(int8_activations, plan)
        graph = open_graph(path, element_limit=element_limit)
        stored = [to_mx_dtype(t.dtype) if t.dtype else None for t in graph.tensors]
        tensor_dtypes = [widened(d, widen) for d in stored]
        constants, stage, link = {}, None, None
        try:
            nodes = [resolve_node(i, r, tensor_dtypes, graph.path, widen, plan, variant)
                     for i, r in enumerate(graph.nodes)]
            if variant and not any(op_spec(r.op).name in variant_ops(variant)
                                   for r in graph.nodes):
                raise ValueError(f"int8_activations: {graph.path} has no product with a q8 or "
                                 "q4 weight (export --quantize q8|q4)")
            if pipeline is not None:
                from mlxgraph.interpreter.pipeline.link import connect
                from mlxgraph.interpreter.pipeline.plan import plan_stages

                link = connect(pipeline, pipeline_timeout)
                stage = plan_stages(graph, nodes, link.size)[link.rank]
                nodes = [nodes[i] for i in stage.nodes]
            for i, c in enumerate(graph.constants):
                if stage is not None and c.tensor not in stage.constants:
                    continue  # another stage's weight: never read on this rank
                # Read into a buffer of our own, copied by MLX, then dropped: the file is
                # never mapped, so changing it later cannot touch a loaded program.
                a = mx.array(graph.constant_array(i))
                want = stored[c.tensor]
                if a.dtype != want:
                    a = a.view(want)  # bfloat16 is stored as its uint16 bit pattern
                if tensor_dtypes[c.tensor] != want:
                    a = a.astype(tensor_dtypes[c.tensor])
                # Computed now (a view or cast is lazy; one at a time, so the source goes at
                # once): every session and thread reads the constants, and an array first
                # queued by one thread's mx.async_eval carries an event that concurrent
                # waits race on (session/lock.py).
                mx.eval(a)
                constants[c.tensor] = a
        finally:
            graph.close()
        nodes = [_checked(n, graph) for n in nodes]
        if stage is None:  # a stage's slots may travel to another rank: left as written
            nodes = mark_expert_products(nodes, constants, graph.outputs)
        layers = _layer_geometry(graph, nodes)
        widened_from = tuple(sorted({dtype_name(d) for d in stored if widen and d in HALF_DTYPES}))
        return cls(graph, constants, nodes, layers, tensor_dtypes, widened_from, stage, link,
                   plan, variant)

    @property
    def float_dtypes(self) -> tuple:
        """Names of the floating dtypes this program computes in (after any widening)."""
        return tuple(sorted({dtype_name(d) for d in self.tensor_dtypes
                             if d is not None and mx.issubdtype(d, mx.floating)}))

    def compute_info(self) -> dict:
        """{"dtypes": floating dtypes computed in, "widened_from": half dtypes widened at load}."""
        return {"dtypes": list(self.float_dtypes), "widened_from": list(self.widened_from)}

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the graph's FlatBuffer part: its structure, attributes, metadata and
        every constant's content hash (not the constants' bytes, not the path), and whether
        it was widened at load (compute_dtype) or takes int8 activations."""
        data = self.graph.data
        end = min((c.offset for c in self.graph.constants), default=len(data))
        digest = hashlib.sha256(memoryview(data)[:end])
        if self.widened_from:
            # Widened at load, the same file computes other K/V: its caches are not interchangeable.
            digest.update(b"\0compute_dtype=float32")
        if self.int8_activations:  # other products, other K/V
            digest.update(b"\0int8_activations")
        return digest.hexdigest()

    def restore(self, path: str | PathLike) -> Session:
        """A new Session holding the KV cache saved in ``path`` (with the policy it was saved with).

        Raises:
            CacheFileError: the file is unreadable, truncated, changed, or for another graph.
        """
        from mlxgraph.interpreter.cache.file import restore

        return restore(self, path)

    @cached_property
    def batching(self):
        """Whether sessions of this program may be stepped together (``step_batch``): a
        ``Batching`` whose ``problem`` is None, or one line naming the node that would let
        one row see another (interpreter/batching/token_rows.py). Worked out once, on first use."""
        from mlxgraph.interpreter.batching.token_rows import analyse

        return analyse(self)

    def step_batch(self, rows: Sequence[tuple], observer: Callable | None = None) -> list:
        """Step several sessions of this program in one evaluation.

        The rows' tokens are packed one after another into one step, so the weights are
        read once for all of them; each row attends over its own session's history only.
        Afterwards every session is as if it had been stepped alone (its length, its
        cache; logits equal within float rounding of the batched matrix products).

        Args:
            rows: ``[(session, tokens, positions), ...]``: distinct sessions of this
                program, each with a step's tokens ``[1, T_i]`` (decode rows and prefill
                chunks may mix) and positions ``length .. length + T_i - 1``.
            observer: as for ``Session.step`` (it sees the packed step).
        Returns:
            Each row's output (``logits`` [1, T_i, vocab], or a dict), in row order, already
            queued (``mx.async_eval``): each row is an array of its own, so rows may be
            evaluated on different threads.
        Raises:
            SessionError: a bad row, a session in use, a row rejected (as ``step`` would
                reject it), or a graph that cannot batch (``batching.problem``).
            CacheError / GraphRuntimeError: as ``step``. On any error no session changed.
        """
        from mlxgraph.interpreter.batching.batch_step import step_batch

        return step_batch(self, rows, observer)

    def session(self, capacity: int | None = None, kv_dtype: str | None = None,
                windows: dict | None = None, preallocate: bool = False,
                max_step: int | None = None, kv_bits: int = 0, kv_group_size: int = 64,
                state_snapshots: int = 8) -> Session:
        """Start a session: its own KV stores and value slots over this program's weights.

        Args: as :class:`~mlxgraph.interpreter.session.session.Session` takes them.
        Raises:
            SessionError: a bad override. CacheError: a cache policy a store cannot honour.
        """
        # One set of options for both kinds, so a pipeline session never drops one.
        options = dict(capacity=capacity, kv_dtype=kv_dtype, windows=windows,
                       preallocate=preallocate, max_step=max_step, kv_bits=kv_bits,
                       kv_group_size=kv_group_size, state_snapshots=state_snapshots)
        if self.stage is not None:
            from mlxgraph.interpreter.pipeline.session import PipelineSession

            return PipelineSession(self, **options)
        return Session(self, **options)

    @cached_property
    def tokenizer(self):
        """The tokenizer the graph carries (byte-level for the built-ins, else the Hugging
        Face tokenizer embedded at export), loaded on first use.

        Raises:
            TokenizerError: the graph carries none (export a folder with tokenizer.json, or
                load one with ``load_tokenizer(meta, folder=DIR)`` of
                ``mlxgraph.interpreter.text.tokenizer``).
        """
        from mlxgraph.interpreter.text.tokenizer import load_tokenizer

        return load_tokenizer(self.metadata)

    def __repr__(self) -> str:
        name = Path(self.path).name if self.path else "<bytes>"
        stage = "" if self.stage is None else f", stage {self.stage.rank} of {self.stage.size}"
        return (f"Program({name}: {len(self.nodes)} nodes, {len(self.layers)} attention "
                f"layers{stage})")


def _checked(node: ResolvedNode, graph) -> ResolvedNode:
    """The node with its run-time checks: output bounds, and an index guard for a gather
    whose indices are not the host-checked ``tokens`` input."""
    bounds = graph.bounds
    limits = (bounds.value_magnitude if node.out_kind is FieldKind.VALUE_OUT
              else bounds.slot_elements)
    guard = None
    op, fields = entry(node.record.op), node.record.fields
    g = op.guard
    # The verifier made the vocabulary equal to an embedding's rows when tokens feed it.
    trusted = (op.has(Trait.EMBEDDING) and fields["indices"] == graph.inputs.get("tokens")
               and graph.metadata.vocab_size > 0)
    if g is not None and not trusted:
        axis = 0 if g.axis is None else node.fixed[g.axis] or 0
        guard = (g.indices, g.table, axis, g.scalar)
    return replace(node, guard=guard, limits=tuple(limits[s] for s in node.out_slots))


def _layer_geometry(graph, nodes) -> dict:
    """Cache geometry per layer_id, from the metadata.

    A layer with no metadata entry is an error, not a guess: guessing "full attention"
    from the K/V shapes would silently run a sliding-window layer wrongly.
    """
    known = {lc.layer_id: lc for lc in graph.metadata.layers}
    out = {}
    for n in nodes:
        if not entry(n.record.op).has(Trait.ATTENTION):
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


__all__ = ["COMPUTE_DTYPES", "Program", "ResolvedNode", "GraphRuntimeError"]
