"""Partition a graph's node stream into pipeline stages by layer ranges.

Pure graph analysis (no MLX): which nodes each stage runs, which constants it loads, which
layers' KV stores it holds, and which tensor slots cross each cut. docs/architecture.md
(#pipeline-parallel-generation) describes the design; in short:

- A node is *replicable* when it holds no state (it is not an attention or recurrent state
  node) and everything it reads comes from the graph's inputs, its constants or other
  replicable nodes (RoPE tables, position reshapes, runtime ints, the embedding lookup).
  Every stage recomputes the replicable nodes it needs: the inputs reach every rank
  (``step`` is called on every rank), so nothing of theirs is ever sent.
- Every other node is on the *main stream* (the residual stream through the layers). The
  *anchors* are the nodes that keep a layer's session state: attention (a KV store) and
  recurrent state (a conv, scan or delta state) nodes. Between two consecutive anchors, the
  cut goes at the latest point where the fewest main tensors are live (for a transformer:
  the hidden state just before the next layer's norm). Two anchors of one layer (a Mamba
  mixer's conv and scan, Falcon-H1's attention beside its mixer) have no such narrow point
  between them: a cut next to a state anchor that leaves more live than the narrowest cut
  of the graph is dropped, so the layer stays whole on one stage (``_layer_cuts``).
- Each stage keeps the states of its own state nodes only (``StagePlan.states``).
- The layer blocks between cuts are grouped into N contiguous stages so that the largest
  stage's weight bytes are as small as possible (the embedding falls in the first block,
  the final norm and LM head in the last).
"""

from dataclasses import dataclass, replace

from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import FieldKind


@dataclass(frozen=True)
class StagePlan:
    """What one rank of an N-stage pipeline runs.

    ``nodes``: node indices in stream order; ``constants``: tensor slots of the constants it
    loads; ``layers``: the layer_ids whose KV stores it holds; ``receives`` / ``sends``: the
    tensor slots that arrive from the previous stage and leave for the next, in the order
    they travel; ``weight_bytes``: the bytes of its constants; ``stage_weight_bytes``:
    every stage's (rank order); ``states``: the layer_ids of the recurrent states it holds.
    """

    rank: int
    size: int
    nodes: tuple
    constants: frozenset
    layers: tuple
    receives: tuple
    sends: tuple
    weight_bytes: int
    stage_weight_bytes: tuple = ()
    states: tuple = ()

    @property
    def is_last(self) -> bool:
        """True for the stage that computes the graph's outputs."""
        return self.rank == self.size - 1


def node_io(node) -> tuple:
    """``(tensor slots read, value slots read, tensor slots written, value slots written)``
    of a resolved node (interpreter/node_plan.py)."""
    tensors = {slot for _, slot in node.tensor_reads}
    values = set()
    for _, how, where in node.reads:
        if how is FieldKind.VALUE:
            values.add(where)
        elif how is FieldKind.TENSOR_LIST:
            tensors.update(where)
        else:  # OPERAND_LIST
            tensors.update(w for h, w in where if h is FieldKind.TENSOR)
            values.update(w for h, w in where if h is FieldKind.VALUE)
    if node.out_kind is FieldKind.VALUE_OUT:
        return tensors, values, set(), set(node.out_slots)
    return tensors, values, set(node.out_slots), set()


def plan_stages(graph, nodes, size: int) -> tuple:
    """Partition ``nodes`` (every node of ``graph``, resolved) into ``size`` stages.

    Returns:
        A StagePlan per rank.
    Raises:
        GraphFormatError: fewer layers than stages, a runtime int or a tensor of
            unknown shape that would have to cross a cut, or no output on the main stream.
    """
    path = graph.path
    if size < 1:
        raise ValueError(f"a pipeline needs at least one stage, got {size}")
    io = [node_io(n) for n in nodes]
    free_t = set(graph.inputs.values()) | {c.tensor for c in graph.constants}
    free_v = {s.value for s in graph.symbols if s.value is not None}
    replicable = []
    for node, (reads_t, reads_v, out_t, out_v) in zip(nodes, io):
        # A stateful node (it reads or writes a KV store) and all that follows from it are
        # the main stream; the rest depends on the step's inputs and weights only.
        rep = not node.needs_context and reads_t <= free_t and reads_v <= free_v
        replicable.append(rep)
        if rep:
            free_t |= out_t
            free_v |= out_v
    last_read = _last_reads(io, replicable, graph.outputs.values(), len(nodes))
    cuts = [0] + _layer_cuts(graph, nodes, last_read, io, replicable) + [len(nodes)]
    if len(cuts) - 1 < size:
        raise GraphFormatError(f"a pipeline of {size} stages needs at least {size} layers "
                               f"(attention or recurrent state); the graph has "
                               f"{len(cuts) - 1}", path, None, "nodes")
    need = [_stage_needs(io, replicable, range(lo, hi)) for lo, hi in zip(cuts, cuts[1:])]
    sizes = {c.tensor: c.length for c in graph.constants}
    block_consts = [{s for i in block for s in io[i][0] if s in sizes} for block in need]
    groups = _balance(block_consts, sizes, size)
    plans = []
    for rank, (first, end) in enumerate(groups):
        lo, hi = cuts[first], cuts[end]
        run = set().union(*(need[b] for b in range(first, end)))
        if rank == size - 1:
            run |= _producers(io, replicable, set(graph.outputs.values()), (), hi)
        order = tuple(sorted(run))
        consts = frozenset(s for i in order for s in io[i][0] if s in sizes)
        layers, states = (tuple(nodes[i].fixed["layer_id"] for i in order
                                if entry(nodes[i].record.op).has(trait))
                          for trait in (Trait.ATTENTION, Trait.STATE))
        plans.append(StagePlan(rank, size, order, consts, layers,
                               _crossing(graph, last_read, io, replicable, lo) if rank else (),
                               _crossing(graph, last_read, io, replicable, hi)
                               if rank < size - 1 else (),
                               sum(sizes[s] for s in consts), states=states))
    weights = tuple(p.weight_bytes for p in plans)
    return tuple(replace(p, stage_weight_bytes=weights) for p in plans)


def _last_reads(io, replicable, outputs, end) -> dict:
    """Main-stream slot (("t"|"v", slot)) -> the last node index reading it (``end`` for a
    graph output, which the last stage must hold)."""
    last = {}
    for i, (reads_t, reads_v, _, _) in enumerate(io):
        if not replicable[i]:
            for s in reads_t:
                last[("t", s)] = i
            for s in reads_v:
                last[("v", s)] = i
    for s in outputs:
        last[("t", s)] = end
    return last


def _live(c, last_read, io, replicable) -> list:
    """Main-stream slots written before node ``c`` and read at or after it."""
    live = []
    for i in range(c):
        if replicable[i]:
            continue
        _, _, out_t, out_v = io[i]
        live += [("t", s) for s in out_t if last_read.get(("t", s), -1) >= c]
        live += [("v", s) for s in out_v if last_read.get(("v", s), -1) >= c]
    return live


def _layer_cuts(graph, nodes, last_read, io, replicable) -> list:
    """The cuts between consecutive anchors (attention and state nodes), in stream order.

    A cut next to a state anchor is kept only where the layers meet: where it leaves no
    more of the step's token-derived tensors live than the graph's narrowest cut does
    (the residual stream). Two state anchors of one layer (a Mamba mixer's conv and scan,
    a gated-delta layer's conv and delta rule, Falcon-H1's attention beside its mixer)
    have the layer's inner tensors live between them, so the layer stays on one stage:
    cutting there would send them (or, in the first layer, whose inside is replicable,
    recompute its projections on both stages) for nothing. The width counts replicable
    tensors too when they come from the tokens (the embedding, the first layer's
    projections), not those from the positions (RoPE tables live across every layer).
    Cuts between two attention nodes are kept as they always were.
    """
    anchors = [(n.index, entry(n.record.op).has(Trait.STATE)) for n in nodes
               if entry(n.record.op).has(Trait.ATTENTION) or entry(n.record.op).has(Trait.STATE)]
    derived = {graph.inputs.get("tokens")}
    for i, (reads_t, _, out_t, _) in enumerate(io):
        if replicable[i] and reads_t & derived:
            derived |= out_t
    found = []
    for (a, state_a), (b, state_b) in zip(anchors, anchors[1:]):
        c, n = _best_cut(a, b, last_read, io, replicable)
        found.append((c, state_a or state_b, n + sum(
            1 for i in range(c) if replicable[i] for s in io[i][2] & derived
            if last_read.get(("t", s), -1) >= c)))
    narrowest = min((width for _, _, width in found), default=0)
    return [c for c, stateful, width in found if not stateful or width <= narrowest]


def _best_cut(a: int, b: int, last_read, io, replicable) -> tuple:
    """The latest cut in (a, b] with the fewest live main-stream slots, and that count."""
    best, best_n = b, None
    for c in range(b, a, -1):
        n = len(_live(c, last_read, io, replicable))
        if best_n is None or n < best_n:
            best, best_n = c, n
    return best, best_n


def _producers(io, replicable, want_t, want_v, end) -> set:
    """The replicable nodes before ``end`` that the slots ``want_t`` / ``want_v`` need,
    transitively."""
    want_t, want_v, out = set(want_t), set(want_v), set()
    for i in range(end - 1, -1, -1):
        reads_t, reads_v, out_t, out_v = io[i]
        if replicable[i] and (out_t & want_t or out_v & want_v):
            out.add(i)
            want_t |= reads_t
            want_v |= reads_v
    return out


def _stage_needs(io, replicable, block) -> set:
    """The main nodes of ``block`` and every replicable node they need."""
    main = {i for i in block if not replicable[i]}
    reads_t = set().union(*(io[i][0] for i in main))
    reads_v = set().union(*(io[i][1] for i in main))
    return main | _producers(io, replicable, reads_t, reads_v, block.stop)


def _crossing(graph, last_read, io, replicable, cut) -> tuple:
    """The tensor slots live across ``cut``, sorted.

    Raises:
        GraphFormatError: a runtime int, or a tensor without a declared dtype and shape
            (its receiver could not size the message), is live across the cut.
    """
    out = []
    for kind, slot in sorted(_live(cut, last_read, io, replicable)):
        if kind == "v":
            raise GraphFormatError(f"runtime int $v{slot} would cross the pipeline cut before "
                                   f"node {cut}; this graph cannot be pipelined there",
                                   graph.path, cut, "nodes")
        t = graph.tensors[slot]
        if t.dtype is None or any(d is None for d in t.shape):
            raise GraphFormatError(f"tensor %{slot} ({t.name}) crosses the pipeline cut before "
                                   f"node {cut} without a declared dtype and shape",
                                   graph.path, cut, "nodes")
        out.append(slot)
    return tuple(out)


def _balance(block_consts, sizes, size) -> list:
    """Contiguous groups of blocks, ``size`` of them, minimising the largest group's constant
    bytes (a constant two blocks share counts once); [(first block, end block)] per stage."""
    n = len(block_consts)
    memo = {}

    def weight(a, b):
        if (a, b) not in memo:
            memo[(a, b)] = sum(sizes[s] for s in set().union(*block_consts[a:b]))
        return memo[(a, b)]

    # best[k][j]: (largest stage weight, groups) for the first j blocks in k stages
    best = [[(float("inf"), None)] * (n + 1) for _ in range(size + 1)]
    best[0][0] = (0, [])
    for k in range(1, size + 1):
        for j in range(k, n - (size - k) + 1):
            for i in range(k - 1, j):
                prev, groups = best[k - 1][i]
                if groups is not None and max(prev, weight(i, j)) < best[k][j][0]:
                    best[k][j] = (max(prev, weight(i, j)), groups + [(i, j)])
    return best[size][n][1]
