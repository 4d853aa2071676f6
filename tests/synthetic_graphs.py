"""Test support: Llama-shaped graph files built directly with GraphWriter, for the tools'
tests and benchmark (benchmarks/tools_bench.py). Not part of the mlxgraph package.

:class:`GraphSpec` describes a graph by handles instead of slot numbers, so the same graph
can be written with its slots numbered in any order (``write(path, order_seed=...)``):
the files differ in every slot number and describe the same computation. :func:`llama`
builds a decoder with seeded random weights and the ops the exporter emits (RmsNorm or
its decomposition, rotate-half RoPE, UpdateAndAttend, SwiGLU MLP).
"""

import random
from dataclasses import dataclass

import numpy as np

from mlxgraph.schema.records import LayerCacheInfo, ModelInfo, Operand, Provenance
from mlxgraph.schema.spec import FieldKind, op_spec
from mlxgraph.schema.writer import GraphWriter


@dataclass(frozen=True)
class T:
    """A tensor handle."""

    i: int


@dataclass(frozen=True)
class V:
    """A value-slot handle."""

    i: int


class GraphSpec:
    """A graph described by handles; written with any slot numbering."""

    def __init__(self):
        self.symbols = []      # (name, min, max)
        self.tensors = []      # ('tensor', name, dtype, shape) or ('const', name, array, dtype)
        self.nodes = []        # (op, Provenance, fields with handles)
        self.inputs, self.outputs = [], []
        self.metadata = ModelInfo()

    def symbol(self, name, lo, hi) -> V:
        """A symbolic dim; returns its value handle."""
        self.symbols.append((name, lo, hi))
        return V(len(self.symbols) - 1)

    def tensor(self, name, dtype, shape) -> T:
        """A tensor slot; shape entries int or a symbol's name."""
        self.tensors.append(("tensor", name, dtype, tuple(shape)))
        return T(len(self.tensors) - 1)

    def const(self, name, array, dtype=None) -> T:
        """A constant tensor."""
        self.tensors.append(("const", name, array, dtype))
        return T(len(self.tensors) - 1)

    def node(self, op, prov=None, **fields):
        """Append a node; tensor/value fields hold T/V handles, Operands a handle or a number."""
        self.nodes.append((op, prov or Provenance(), fields))

    def write(self, path, order_seed=None, rewrite=None) -> dict:
        """Write with GraphWriter; ``order_seed`` shuffles the order slots are added in;
        ``rewrite(writer)`` runs on the filled writer first (e.g. quantization)."""
        w = GraphWriter(producer="mlxgraph-synthetic")
        w.metadata = self.metadata
        vmap = {i: w.add_symbol(n, lo, hi) for i, (n, lo, hi) in enumerate(self.symbols)}
        order = list(range(len(self.tensors)))
        if order_seed is not None:
            random.Random(order_seed).shuffle(order)
        tmap = {}
        for i in order:
            kind, name, a, b = self.tensors[i]
            tmap[i] = w.add_constant(name, a, b) if kind == "const" else w.add_tensor(name, a, b)
        for name, h in self.inputs:
            w.add_input(name, tmap[h.i])
        for name, h in self.outputs:
            w.add_output(name, tmap[h.i])
        for op, prov, fields in self.nodes:
            w.add_node(op, prov, **_resolve(op, fields, tmap, vmap))
        if rewrite is not None:
            rewrite(w)
        return w.write(path)


def _resolve(op, fields, tmap, vmap) -> dict:
    spec = op_spec(op)
    out = {}
    for f in spec.table.fields:
        if f.name not in fields:
            continue

        def one(x, f=f):
            if f.kind in (FieldKind.OPERAND, FieldKind.OPERAND_LIST):
                if isinstance(x, T):
                    return Operand.tensor(tmap[x.i])
                if isinstance(x, V):
                    return Operand.value(vmap[x.i])
                return Operand.literal(x)
            if isinstance(x, T):
                return tmap[x.i]
            if isinstance(x, V):
                return vmap[x.i]
            return x

        v = fields[f.name]
        out[f.name] = [one(x) for x in v] if isinstance(v, (list, tuple)) else one(v)
    return out


def llama(layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64, vocab=64, dtype="float32",
          seed=0, max_context=256, decomposed=False, tied=True, insert_extra=False) -> GraphSpec:
    """A Llama decoder graph with seeded random weights.

    Args:
        decomposed: RmsNorm and RoPE as elementary ops (more nodes, as an unfused export).
        insert_extra: insert one Mul-by-1.0 node after layer 0's attention projection.
    Returns:
        the GraphSpec (inputs tokens [1, T] int32 and positions [T] int32; output logits).
    """
    rng = np.random.default_rng(seed)
    g = GraphSpec()
    d = hidden // heads
    Tv = g.symbol("T", 1, max_context)

    def P(module, source, target=""):
        return Provenance(source, module, target)

    def w(name, *shape, scale=None):
        a = rng.standard_normal(shape, dtype=np.float32) * (scale or shape[-1] ** -0.5)
        return g.const(name, a.astype(dtype))

    def act(name, *shape, dt=dtype):
        return g.tensor(name, dt, shape)

    tokens, positions = act("tokens", 1, "T", dt="int32"), act("positions", "T", dt="int32")
    g.inputs = [("tokens", tokens), ("positions", positions)]
    g.node("SymSize", P("", "sym_size"), x=tokens, axis=1, out=Tv)
    h = act("embed", 1, "T", hidden)
    emb_w = w("model.embed_tokens.weight", vocab, hidden, scale=1.0)
    g.node("Embedding", P("model.embed_tokens", "embedding", "aten.embedding.default"),
           weight=emb_w, indices=tokens, out=h)
    # rotary tables, shared by every layer
    inv = g.const(
        "rotary.inv_freq", (1e4 ** (-np.arange(0, d, 2, dtype=np.float32) / d)).astype(np.float32)
    )
    pf, pf1, fr, fr2 = (
        act("pos_f", "T", dt="float32"),
        act("pos_f1", "T", 1, dt="float32"),
        act("freqs", "T", d // 2, dt="float32"),
        act("emb", "T", d, dt="float32"),
    )
    rp = P("model.rotary_emb", "rope")
    g.node("Cast", rp, x=positions, out=pf, dtype=0)
    g.node("Unsqueeze", rp, x=pf, axis=1, out=pf1)
    g.node("Mul", rp, a=pf1, b=inv, out=fr)
    g.node("Concat", rp, inputs=[fr, fr], axis=-1, out=fr2)
    tabs = []
    for fn in ("Cos", "Sin"):
        c32, c, c4 = (
            act(f"{fn.lower()}32", "T", d, dt="float32"),
            act(fn.lower(), "T", d),
            act(f"{fn.lower()}4", 1, 1, "T", d),
        )
        g.node(fn, rp, x=fr2, out=c32)
        g.node("Cast", rp, x=c32, out=c, dtype=0 if dtype == "float32" else 1)
        g.node("Reshape", rp, x=c, out=c4, shape=[1, 1, Tv, d])
        tabs.append(c4)
    pos2 = act("position", "T", 1, dt="int32")
    g.node("Unsqueeze", P("model", "position"), x=positions, axis=1, out=pos2)

    def norm(x, name, module):
        wt = g.const(
            f"{module}.weight",
            np.ones(hidden, dtype=dtype) + rng.standard_normal(hidden).astype(dtype) * 0.1,
        )
        if not decomposed:
            y = act(name, 1, "T", hidden)
            g.node(
                "RmsNorm", P(module, name, "aten.rms_norm.default"), x=x, weight=wt, out=y, eps=1e-5
            )
            return y
        pr = P(module, name)
        x32, sq, ms, eps, r, n32, n, y = (
            act(
                f"{name}_{k}",
                1,
                "T",
                hidden if k not in ("ms", "eps", "r") else 1,
                dt="float32" if k in ("x32", "sq", "ms", "eps", "r", "n32") else dtype,
            )
            for k in ("x32", "sq", "ms", "eps", "r", "n32", "n", "y")
        )
        g.node("Cast", pr, x=x, out=x32, dtype=0)
        g.node("Pow", pr, a=x32, b=2.0, out=sq)
        g.node("Mean", pr, x=sq, out=ms, axes=[-1], keepdims=True)
        g.node("Add", pr, a=ms, b=1e-5, out=eps)
        g.node("Rsqrt", pr, x=eps, out=r)
        g.node("Mul", pr, a=x32, b=r, out=n32)
        g.node("Cast", pr, x=n32, out=n, dtype=0 if dtype == "float32" else 1)
        g.node("Mul", pr, a=wt, b=n, out=y)
        return y

    def rope(x, name, module, nh):
        shp = (1, nh, "T", d)
        if not decomposed:
            y = act(name, *shp)
            g.node("Rope", P(module, name), x=x, cos=tabs[0], sin=tabs[1], out=y)
            return y
        pr = P(module, name)
        x1, x2, nx2, rot, a, b, y = (
            act(f"{name}_{k}", *(shp[:-1] + ((d // 2) if k in ("x1", "x2", "nx2") else d,)))
            for k in ("x1", "x2", "nx2", "rot", "a", "b", "y")
        )
        g.node("Slice", pr, x=x, out=x1, axis=-1, start=0, end=d // 2)
        g.node("Slice", pr, x=x, out=x2, axis=-1, start=d // 2, end=d)
        g.node("Neg", pr, x=x2, out=nx2)
        g.node("Concat", pr, inputs=[nx2, x1], axis=-1, out=rot)
        g.node("Mul", pr, a=x, b=tabs[0], out=a)
        g.node("Mul", pr, a=rot, b=tabs[1], out=b)
        g.node("Add", pr, a=a, b=b, out=y)
        return y

    def linear(x, module, n_in, n_out, name):
        y = act(name, 1, "T", n_out)
        g.node("Linear", P(module, name, "aten.linear.default"), x=x,
               weight=w(f"{module}.weight", n_out, n_in), out=y)
        return y

    for i in range(layers):
        m = f"model.layers.{i}"
        a = f"{m}.self_attn"
        n = norm(h, f"l{i}_in_norm", f"{m}.input_layernorm")
        heads_out = []
        for proj, nh in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            y = linear(n, f"{a}.{proj}_proj", hidden, nh * d, f"l{i}_{proj}")
            if insert_extra and i == 0 and proj == "q":
                y2 = act(f"l{i}_q_scaled", 1, "T", nh * d)
                g.node("Mul", P(f"{a}.q_proj", "extra_mul"), a=y, b=1.0, out=y2)
                y = y2
            r, t = act(f"l{i}_{proj}_r", 1, "T", nh, d), act(f"l{i}_{proj}_t", 1, nh, "T", d)
            g.node("Reshape", P(a, f"l{i}_{proj}_view"), x=y, out=r, shape=[1, Tv, nh, d])
            g.node("Permute", P(a, f"l{i}_{proj}_transpose"), x=r, out=t, perm=[0, 2, 1, 3])
            heads_out.append(rope(t, f"l{i}_{proj}_rope", a, nh) if proj != "v" else t)
        o, ot, o2 = (
            act(f"l{i}_attn", 1, heads, "T", d),
            act(f"l{i}_attn_t", 1, "T", heads, d),
            act(f"l{i}_attn_r", 1, "T", hidden),
        )
        q, k, v = heads_out
        g.node("UpdateAndAttend", P(a, f"l{i}_attend", "mlxgraph.update_and_attend.default"),
               q=q, k=k, v=v, position=pos2, out=o, layer_id=i, scale=d**-0.5)
        g.node("Permute", P(a, f"l{i}_attn_transpose"), x=o, out=ot, perm=[0, 2, 1, 3])
        g.node("Reshape", P(a, f"l{i}_attn_view"), x=ot, out=o2, shape=[1, Tv, hidden])
        ao = linear(o2, f"{a}.o_proj", hidden, hidden, f"l{i}_o")
        h2 = act(f"l{i}_res1", 1, "T", hidden)
        g.node("Add", P(m, f"l{i}_add1", "aten.add.Tensor"), a=h, b=ao, out=h2)
        n2 = norm(h2, f"l{i}_post_norm", f"{m}.post_attention_layernorm")
        mp = f"{m}.mlp"
        gt = linear(n2, f"{mp}.gate_proj", hidden, intermediate, f"l{i}_gate")
        up = linear(n2, f"{mp}.up_proj", hidden, intermediate, f"l{i}_up")
        sg, pr = act(f"l{i}_silu", 1, "T", intermediate), act(f"l{i}_glu", 1, "T", intermediate)
        g.node("Silu", P(mp, f"l{i}_silu", "aten.silu.default"), x=gt, out=sg)
        g.node("Mul", P(mp, f"l{i}_glu", "aten.mul.Tensor"), a=sg, b=up, out=pr)
        dn = linear(pr, f"{mp}.down_proj", intermediate, hidden, f"l{i}_down")
        h = act(f"l{i}_res2", 1, "T", hidden)
        g.node("Add", P(m, f"l{i}_add2", "aten.add.Tensor"), a=h2, b=dn, out=h)
    hn = norm(h, "final_norm", "model.norm")
    logits = act("logits", 1, "T", vocab)
    head = emb_w if tied else w("lm_head.weight", vocab, hidden)
    g.node("Linear", P("lm_head", "lm_head", "aten.linear.default"), x=hn, weight=head, out=logits)
    g.outputs = [("logits", logits)]
    g.metadata = ModelInfo(
        architecture="llama",
        num_layers=layers,
        vocab_size=vocab,
        hidden_size=hidden,
        max_context=max_context,
        eos_token_ids=(vocab - 1,),
        bos_token_id=0,
        tokenizer="byte",
        layers=tuple(LayerCacheInfo(i, kv_heads, d, d, 0) for i in range(layers)),
    )
    return g
