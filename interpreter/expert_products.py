"""Expert products: each token's expert weights multiplied in place, never copied out.

A mixture-of-experts layer exported through transformers' ``batched_mm`` experts is, per
projection, an Embedding of a constant ``[E, N, K]`` table (every expert's weight) at the
routed expert ids, then a Matmul of those rows with the tokens' activations. Run as
written, the Embedding copies ``T * k`` whole expert matrices per step (gigabytes in a
prefill) for a product that reads each of them once. At load, every such pair is marked:
the Embedding returns :class:`GatheredRows` (the table and the ids, nothing copied) and the
Matmul computes ``table[ids] @ b`` as one ``mx.gather_mm``, which reads the experts where
they lie. Each output element is the same dot product over the same operands, so the
result is the unfused pair's bit for bit (tests/test_exporter_moe.py checks it).

A pair is marked only when nothing else can see the gathered rows: the Embedding's output
is read by that Matmul alone, once, and is no graph output; a pipeline stage is left as it
is (its slots may travel to another rank). An observer (verify, compare) still sees the
rows themselves: :func:`materialized`.
"""

from dataclasses import replace

import mlx.core as mx

from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import FieldKind


class GatheredRows:
    """``table[indices]`` (rows along axis 0), not computed: what a marked Embedding returns."""

    __slots__ = ("table", "indices")

    def __init__(self, table: mx.array, indices: mx.array):
        self.table, self.indices = table, indices

    @property
    def shape(self) -> tuple:
        return tuple(self.indices.shape) + tuple(self.table.shape[1:])

    @property
    def ndim(self) -> int:
        return self.indices.ndim + self.table.ndim - 1

    @property
    def size(self) -> int:
        return self.indices.size * (self.table.size // max(self.table.shape[0], 1))

    @property
    def dtype(self):
        return self.table.dtype

    def rows(self) -> mx.array:
        """The gathered rows as an array (what the unmarked Embedding computes)."""
        return mx.take(self.table, self.indices, axis=0)


def materialized(x):
    """``x``, with gathered rows computed (for observers, which expect arrays)."""
    return x.rows() if isinstance(x, GatheredRows) else x


def gathered_embedding(weight: mx.array, indices: mx.array) -> GatheredRows:
    """The marked Embedding's kernel: the rows it would gather, described."""
    return GatheredRows(weight, indices)


def gathered_matmul(a, b) -> mx.array:
    """The marked Matmul's kernel: ``a @ b`` where ``a`` or ``b`` may be gathered rows of
    an ``[E, N, K]`` table, computed by ``mx.gather_mm`` when the other operand's batch
    axes are the ids' axes (each token's own activations), else as the plain product."""
    if isinstance(a, GatheredRows) and _one_matrix_per_id(a, b):
        # b^T @ table[ids]^T, transposed back: mx.gather_mm's fast form on every device
        # (the activations as the left rows, the experts' transposed views on the right).
        ids = a.indices
        own = mx.arange(ids.size, dtype=mx.uint32).reshape(ids.shape)
        out = mx.gather_mm(b.swapaxes(-1, -2), a.table.swapaxes(-1, -2),
                           lhs_indices=own, rhs_indices=ids)
        return out.swapaxes(-1, -2)
    if isinstance(b, GatheredRows) and _one_matrix_per_id(b, a):
        ids = b.indices
        own = mx.arange(ids.size, dtype=mx.uint32).reshape(ids.shape)
        return mx.gather_mm(a, b.table, lhs_indices=own, rhs_indices=ids)
    return mx.matmul(materialized(a), materialized(b))


def _one_matrix_per_id(rows: GatheredRows, other) -> bool:
    """Whether ``rows`` are whole matrices (a 3-D table) and ``other`` holds one matrix
    per id, batch axes equal to the ids' (no broadcasting to work out)."""
    return (rows.table.ndim == 3 and isinstance(other, mx.array)
            and other.ndim == rows.indices.ndim + 2
            and tuple(other.shape[:-2]) == tuple(rows.indices.shape))


def mark_expert_products(nodes: list, constants: dict, graph_outputs) -> list:
    """``nodes`` with every Embedding-of-an-expert-table -> Matmul pair given the kernels
    above (the other nodes as they are)."""
    readers: dict = {}
    for pos, node in enumerate(nodes):
        for slot in _slots_read(node):
            readers.setdefault(slot, []).append(pos)
    outputs = set(graph_outputs.values())
    marked = list(nodes)
    for pos, node in enumerate(nodes):
        op = entry(node.record.op)
        if not op.has(Trait.EMBEDDING) or op.has(Trait.QUANTIZED):  # a float table's rows
            continue
        reads = dict(node.tensor_reads)
        table = constants.get(reads.get("weight"))
        out = node.out_slots[0]
        if table is None or table.ndim != 3 or out in outputs:
            continue
        declared = node.out_dtypes[0]
        if declared is not None and declared != table.dtype:
            continue  # the declared dtype would cast the rows: leave the pair as written
        users = readers.get(out, [])
        if len(users) != 1:
            continue
        user = nodes[users[0]]
        operands = [name for name, slot in user.tensor_reads if slot == out]
        if not entry(user.record.op).has(Trait.MATMUL) or len(operands) != 1 or user.reads:
            continue
        marked[pos] = replace(node, fn=gathered_embedding)
        marked[users[0]] = replace(user, fn=gathered_matmul)
    return marked


def _slots_read(node) -> list:
    """Every tensor slot ``node`` reads, with repeats (a slot read twice counts twice)."""
    slots = [slot for _, slot in node.tensor_reads]
    for _, how, where in node.reads:
        if how is FieldKind.TENSOR_LIST:
            slots += list(where)
        elif how is FieldKind.OPERAND_LIST:
            slots += [w for h, w in where if h is FieldKind.TENSOR]
    return slots
