"""A small hand-built attention graph and its numpy oracle, for interpreter tests.

tokens [1,T] -> embedding -> q/k/v linears -> [1,H,T,D] -> UpdateAndAttend -> reshape
-> output linear -> logits [1,T,V]. The oracle keeps the whole history and runs dense
attention over it in float64, so every step is checked against an independent reference.
"""

import numpy as np

from mlxgraph.schema.records import LayerCacheInfo, Operand, Provenance
from mlxgraph.schema.writer import GraphWriter

VOCAB, HIDDEN, HQ, HKV, D = 32, 16, 4, 2, 8


def split_heads(w, lin, name: str, heads: int, head_dim: int, t_val) -> int:
    """[1, T, heads * head_dim] -> [1, heads, T, head_dim] (Reshape, then Permute), as an
    exported graph splits a projection into heads; returns the new tensor slot."""
    r = w.add_tensor(f"{name}_4d", "float32", (1, "T", heads, head_dim))
    shape = [Operand.literal(1), Operand.value(t_val), Operand.literal(heads),
             Operand.literal(head_dim)]
    w.add_node("Reshape", x=lin, out=r, shape=shape)
    out = w.add_tensor(f"{name}_heads", "float32", (1, heads, "T", head_dim))
    w.add_node("Permute", x=r, out=out, perm=[0, 2, 1, 3])
    return out


def build_tiny_graph(path, seed=0, max_t=64, fail_unless_t=None, windows=(0,), record_layers=True,
                     recorded_kv_heads=HKV, layer_ids=None):
    """Write the tiny graph to ``path``; returns its weights (for the oracle).

    Args:
        fail_unless_t: if set, a reshape AFTER the attention node only works for this T,
            so other step sizes fail mid-step (tests that a failed step changes nothing).
        windows: one attention layer per entry, each with this sliding window in the
            metadata (0 = full attention); the layers share q/k/v and their outputs are summed.
        record_layers: write the layers' cache geometry into the metadata.
        recorded_kv_heads: the kv_heads the metadata records (another value than the graph's
            K/V really have makes a graph whose cache geometry is wrong).
        layer_ids: the attention nodes' layer_ids (default 0, 1, ...; a repeated id makes
            a graph whose layers share one cache, which no reader accepts).
    """
    layer_ids = tuple(range(len(windows))) if layer_ids is None else tuple(layer_ids)
    rng = np.random.default_rng(seed)
    wts = {
        "embed": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
        "wq": (rng.standard_normal((HQ * D, HIDDEN)) / 4).astype(np.float32),
        "wk": (rng.standard_normal((HKV * D, HIDDEN)) / 4).astype(np.float32),
        "wv": (rng.standard_normal((HKV * D, HIDDEN)) / 4).astype(np.float32),
        "wo": (rng.standard_normal((VOCAB, HQ * D)) / 4).astype(np.float32),
    }
    w = GraphWriter(producer="tests")
    t_val = w.add_symbol("T", 1, max_t)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    pos = w.add_tensor("positions", "int32", ("T",))
    w.add_input("tokens", tok)
    w.add_input("positions", pos)
    c = {k: w.add_constant(k, v) for k, v in wts.items()}

    def t(name, shape, dtype="float32"):
        return w.add_tensor(name, dtype, shape)

    p = Provenance
    x = t("x", (1, "T", HIDDEN))
    w.add_node("Embedding", p("embedding", "model.embed"), weight=c["embed"], indices=tok, out=x)
    heads = {}
    for name, h in (("q", HQ), ("k", HKV), ("v", HKV)):
        lin = t(f"{name}_lin", (1, "T", h * D))
        w.add_node(
            "Linear",
            p(f"{name}_proj", f"model.attn.{name}_proj"),
            x=x,
            weight=c[f"w{name}"],
            out=lin,
        )
        heads[name] = split_heads(w, lin, name, h, D, t_val)
    att = None
    for layer in range(len(windows)):
        one = t(f"attn{layer}", (1, HQ, "T", D))
        w.add_node(
            "UpdateAndAttend",
            p("attn", f"model.attn{layer}"),
            q=heads["q"],
            k=heads["k"],
            v=heads["v"],
            position=pos,
            out=one,
            layer_id=layer_ids[layer],
            scale=float(D) ** -0.5,
        )
        if att is not None:
            total = t(f"attn_sum{layer}", (1, HQ, "T", D))
            w.add_node("Add", a=Operand.tensor(att), b=Operand.tensor(one), out=total)
            one = total
        att = one
    back = t("attn_t", (1, "T", HQ, D))
    w.add_node("Permute", x=att, out=back, perm=[0, 2, 1, 3])
    flat = t("attn_flat", (1, "T", HQ * D))
    t_dim = Operand.literal(fail_unless_t) if fail_unless_t else Operand.value(t_val)
    w.add_node(
        "Reshape", x=back, out=flat, shape=[Operand.literal(1), t_dim, Operand.literal(HQ * D)]
    )
    logits = t("logits", (1, "T", VOCAB))
    w.add_node("Linear", p("lm_head", "lm_head"), x=flat, weight=c["wo"], out=logits)
    w.add_output("logits", logits)
    w.metadata.architecture = "TinyAttention"
    w.metadata.num_layers = len(windows)
    w.metadata.vocab_size = VOCAB
    w.metadata.max_context = max_t
    if record_layers:
        w.metadata.layers = tuple(
            LayerCacheInfo(lid, recorded_kv_heads, D, D, win)
            for lid, win in dict(zip(layer_ids, windows)).items()
        )
    w.write(path)
    return wts


class TinyOracle:
    """Dense float64 reference of the tiny graph with the full history kept."""

    def __init__(self, wts, windows=(0,)):
        self.w = {k: v.astype(np.float64) for k, v in wts.items()}
        self.windows = windows
        self.keys = np.zeros((HKV, 0, D))
        self.values = np.zeros((HKV, 0, D))

    def step(self, tokens):
        """Logits [T, V] for the next tokens (appends their K/V to the history)."""
        x = self.w["embed"][np.asarray(tokens)]
        q = (x @ self.w["wq"].T).reshape(-1, HQ, D).transpose(1, 0, 2)
        k = (x @ self.w["wk"].T).reshape(-1, HKV, D).transpose(1, 0, 2)
        v = (x @ self.w["wv"].T).reshape(-1, HKV, D).transpose(1, 0, 2)
        start = self.keys.shape[1]
        self.keys = np.concatenate([self.keys, k], axis=1)
        self.values = np.concatenate([self.values, v], axis=1)
        n, s = len(tokens), self.keys.shape[1]
        qpos = start + np.arange(n)[:, None]
        kpos = np.arange(s)[None, :]
        out = np.zeros((HQ, n, D))
        for window in self.windows:
            allowed = kpos <= qpos
            if window:
                allowed &= kpos > qpos - window
            for h in range(HQ):
                kv = h // (HQ // HKV)
                scores = q[h] @ self.keys[kv].T * D ** -0.5
                scores = np.where(allowed, scores, -np.inf)
                p = np.exp(scores - scores.max(-1, keepdims=True))
                p /= p.sum(-1, keepdims=True)
                out[h] += p @ self.values[kv]
        return out.transpose(1, 0, 2).reshape(n, HQ * D) @ self.w["wo"].T

    def trim(self, n):
        """Forget the last n tokens."""
        self.keys = self.keys[:, : self.keys.shape[1] - n]
        self.values = self.values[:, : self.values.shape[1] - n]
