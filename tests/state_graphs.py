"""A small hand-built graph with recurrent state (format 1.3), and its numpy oracle.

tokens [1, T] -> embedding [1, T, C] -> permute [1, C, T] -> CausalConv (state layer 0)
-> permute -> output linear -> logits [1, T, V]. The oracle keeps every input and runs the
whole convolution over the history in float64 at each step.
"""

import numpy as np

from mlxgraph.schema.records import Provenance, StateLayerInfo
from mlxgraph.schema.writer import GraphWriter

VOCAB, CHANNELS, KERNEL = 32, 8, 4


def build_state_graph(path, seed=0, max_t=64, bias=True, state=None, layer_id=0):
    """Write the graph to ``path``; returns its weights (for the oracle).

    Args:
        state: the metadata's StateLayerInfo (default the right one; another makes a
            graph the verifier refuses); False: no metadata.states at all.
        layer_id: the CausalConv node's layer_id.
    """
    rng = np.random.default_rng(seed)
    wts = {"embed": rng.standard_normal((VOCAB, CHANNELS)).astype(np.float32),
           "conv": rng.standard_normal((CHANNELS, KERNEL)).astype(np.float32),
           "head": (rng.standard_normal((VOCAB, CHANNELS)) / 2).astype(np.float32)}
    if bias:
        wts["bias"] = rng.standard_normal(CHANNELS).astype(np.float32)
    w = GraphWriter(producer="tests")
    w.add_symbol("T", 1, max_t)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    pos = w.add_tensor("positions", "int32", ("T",))
    w.add_input("tokens", tok)
    w.add_input("positions", pos)
    c = {k: w.add_constant(k, v) for k, v in wts.items()}
    x = w.add_tensor("x", "float32", (1, "T", CHANNELS))
    w.add_node("Embedding", weight=c["embed"], indices=tok, out=x)
    xt = w.add_tensor("xt", "float32", (1, CHANNELS, "T"))
    w.add_node("Permute", x=x, out=xt, perm=[0, 2, 1])
    y = w.add_tensor("y", "float32", (1, CHANNELS, "T"))
    w.add_node("CausalConv", Provenance("conv", "model.layers.0.conv"), x=xt,
               weight=c["conv"], bias=c.get("bias"), out=y, layer_id=layer_id)
    yt = w.add_tensor("yt", "float32", (1, "T", CHANNELS))
    w.add_node("Permute", x=y, out=yt, perm=[0, 2, 1])
    logits = w.add_tensor("logits", "float32", (1, "T", VOCAB))
    w.add_node("Linear", x=yt, weight=c["head"], out=logits)
    w.add_output("logits", logits)
    w.metadata.architecture = "TinyConv"
    w.metadata.num_layers = 1
    w.metadata.vocab_size = VOCAB
    w.metadata.max_context = max_t
    if state is not False:
        w.metadata.states = (state or StateLayerInfo(0, (1, CHANNELS, KERNEL - 1), "float32"),)
    w.write(path)
    return wts


class StateOracle:
    """float64 reference: the whole causal convolution over every token seen."""

    def __init__(self, wts):
        self.w = {k: v.astype(np.float64) for k, v in wts.items()}
        self.history = np.zeros((KERNEL - 1, CHANNELS))  # the zero state

    def step(self, tokens):
        """Logits [T, V] of the next tokens."""
        self.history = np.concatenate([self.history, self.w["embed"][np.asarray(tokens)]])
        n, conv = len(tokens), self.w["conv"]
        s = self.history[-(n + KERNEL - 1):]
        y = sum(s[j:j + n] * conv[:, j] for j in range(KERNEL))
        if "bias" in self.w:
            y = y + self.w["bias"]
        return y @ self.w["head"].T
