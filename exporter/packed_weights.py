"""Store a folder's own packed weights (exporter/mlx_folder.py) in a lowered graph.

Each Linear or Embedding node whose constant weight the folder holds packed becomes its
quantized op reading the folder's packed codes, scales and biases as they are (scales
widened exactly when the graph is float32 and they are bfloat16, which the format does
not store beside float32); the dequantized float constants the trace used are dropped.
A node whose weight the folder keeps in float stays a float node. What was done is
recorded in metadata ``extra["quantization"]`` like ``--quantize``'s record.
"""

import json
from collections import Counter

import torch

from mlxgraph.exporter.quantize import as_numpy
from mlxgraph.schema.op_catalogue import quantized_form
from mlxgraph.schema.records import NodeRecord


def _scales(t: torch.Tensor, dtype: str) -> torch.Tensor:
    # The format stores scales in the graph's dtype, or float16 in a float32 graph.
    if dtype == "float32" and t.dtype == torch.bfloat16:
        return t.to(torch.float32)
    return t


def keep_packed(writer, packed: dict, dtype: str) -> dict:
    """Rewrite ``writer``'s nodes whose weight is in ``packed`` ({constant name:
    PackedWeight}) to quantized ops over the packed data; returns the metadata record."""
    constants = {slot for slot, _, _ in writer.constants}
    stored, counts, kept = {}, Counter(), []
    for i, node in enumerate(writer.nodes):
        quantized_op = quantized_form(node.op)
        slot = node.fields.get("weight") if quantized_op is not None else None
        if slot not in constants:
            continue
        name = writer.tensors[slot][0]
        weight = packed.get(name)
        if weight is None:
            counts["float"] += 1
            kept.append(f"{node.provenance.module_path or name} (float in the folder)")
            continue
        if name not in stored:
            scales, biases = _scales(weight.scales, dtype), _scales(weight.biases, dtype)
            stored[name] = (writer.add_constant(f"{name}.q{weight.bits}", weight.packed, "uint32"),
                            writer.add_constant(f"{name}.scales{weight.bits}", *as_numpy(scales)),
                            writer.add_constant(f"{name}.biases{weight.bits}", *as_numpy(biases)))
        counts[f"q{weight.bits}"] += 1
        w, s, b = stored[name]
        fields = dict(node.fields, weight=w, scales=s, biases=b, group_size=weight.group_size,
                      bits=weight.bits)
        writer.nodes[i] = NodeRecord(quantized_op.table, fields, node.provenance)
    writer.drop_unread_constants()
    bits = Counter(w.bits for w in packed.values()).most_common(1)
    groups = Counter(w.group_size for w in packed.values()).most_common(1)
    record = {
        "source": "mlx",  # the folder's own packed weights, stored as they are
        "mode": f"q{bits[0][0]}" if bits else "float",
        "group_size": groups[0][0] if groups else None,
        "nodes": {"q8": counts["q8"], "q4": counts["q4"], "float": counts["float"]},
        "kept_float": kept,
        "scales_dtypes": dict(Counter(str(_scales(w.scales, dtype).dtype).removeprefix("torch.")
                                      for w in packed.values())),
    }
    writer.metadata.extra["quantization"] = json.dumps(record, sort_keys=True)
    return record


__all__ = ["keep_packed"]
