"""Test support: small hand-built graphs around one "middle" part, for the token-row
analysis of batched steps (interpreter/batching/token_rows.py). Not part of the mlxgraph package."""

import numpy as np
from synthetic_graphs import GraphSpec

import mlxgraph
from mlxgraph.schema.records import ModelInfo


def mix_graph(tmp_path, middle):
    """tokens -> Embedding [1, T, 8] -> middle(g, x, T) -> Linear -> logits [1, T, 16];
    ``middle`` returns its [1, T, 8] result. Returns the loaded Program."""
    g = GraphSpec()
    t_val = g.symbol("T", 1, 32)
    tok, pos = g.tensor("tokens", "int32", (1, "T")), g.tensor("positions", "int32", ("T",))
    g.inputs += [("tokens", tok), ("positions", pos)]
    rng = np.random.default_rng(0)
    emb = g.const("embed", rng.standard_normal((16, 8)).astype(np.float32))
    head = g.const("head", rng.standard_normal((16, 8)).astype(np.float32))
    x = g.tensor("x", "float32", (1, "T", 8))
    g.node("Embedding", weight=emb, indices=tok, out=x)
    y = middle(g, x, t_val)
    logits = g.tensor("logits", "float32", (1, "T", 16))
    g.node("Linear", x=y, weight=head, out=logits)
    g.outputs.append(("logits", logits))
    g.metadata = ModelInfo(architecture="Mix", vocab_size=16, max_context=32)
    path = tmp_path / "mix.mlxg"
    g.write(path)
    return mlxgraph.load(path)
