"""Write the golden graph file of the current format, and the sample graph tests verify.

    .venv/bin/python tests/make_golden.py            # writes tests/golden/format-<X.Y>.mlxg + .json

Run it once per released format version and commit both files; it refuses to overwrite
an existing golden (a released file must never change). The .json holds what was handed
to the writer (not what the reader reads back), so tests/test_schema_evolution.py checks
the reader against an independent record.
"""

import json
import sys
from pathlib import Path

import numpy as np
from golden_branches import format_1_3_branch
from tiny_graph import split_heads

from mlxgraph.schema.format import format_version
from mlxgraph.schema.records import LayerCacheInfo, Operand, Provenance
from mlxgraph.schema.writer import GraphWriter

GOLDEN = Path(__file__).with_name("golden")
VOCAB, HIDDEN, HEADS, KV_HEADS, D = 16, 8, 2, 1, 4


def build_sample(seed: int = 0, vocab: int = VOCAB) -> GraphWriter:
    """A small decoder-like graph (a few KB) exercising every kind of field.

    Tensor and value slots, Operands of each kind, vector fields, enums, a tied constant,
    UpdateAndAttendNode with and without out_dtype, metadata with a layer cache; from
    format 1.1 on, attention sinks, logit softcapping and a chunked-attention layer; from
    1.2 on, quantized weights (an 8-bit embedding feeding a 4-bit linear with a bias); from
    1.3 on, recurrent state, latent attention, ALiBi and three elementwise ops
    (tests/golden_branches.py).
    """
    rng = np.random.default_rng(seed)
    w = GraphWriter(producer="mlxgraph-golden")
    t_val = w.add_symbol("T", 1, 64)
    tok = w.add_tensor("tokens", "int32", (1, "T"))
    positions = w.add_tensor("positions", "int32", ("T",))
    w.add_input("tokens", tok)
    w.add_input("positions", positions)
    embed = w.add_constant(
        "model.embed.weight", rng.standard_normal((vocab, HIDDEN)).astype(np.float32)
    )
    norm = w.add_constant("model.norm.weight", np.ones(HIDDEN, np.float16))
    wq = w.add_constant("q.weight", rng.standard_normal((HEADS * D, HIDDEN)).astype(np.float32))
    wk = w.add_constant("k.weight", rng.standard_normal((KV_HEADS * D, HIDDEN)).astype(np.float32))
    wv = w.add_constant("v.weight", rng.standard_normal((KV_HEADS * D, HIDDEN)).astype(np.float32))
    lm_head = w.add_constant("lm_head.weight", w.constants[0][1].copy())  # tied: stored once
    sinks = w.add_constant("attn2.sinks", rng.standard_normal(HEADS).astype(np.float32))

    def t(name, shape, dtype="float32"):
        return w.add_tensor(name, dtype, shape)

    def p(source, module, target=""):
        return Provenance(source, module, target)

    pos = t("position", ("T", 1), "int32")
    w.add_node("Unsqueeze", x=positions, out=pos, axis=1)
    x = t("x", (1, "T", HIDDEN))
    w.add_node(
        "Embedding",
        p("embedding", "model.embed", "aten.embedding.default"),
        weight=embed,
        indices=tok,
        out=x,
    )
    h = t("h", (1, "T", HIDDEN))
    w.add_node("RmsNorm", p("rms_norm", "model.norm"), x=x, weight=norm, out=h, eps=1e-6)
    heads = {}
    for name, wt, n in (("q", wq, HEADS), ("k", wk, KV_HEADS), ("v", wv, KV_HEADS)):
        lin = t(f"{name}_lin", (1, "T", n * D))
        w.add_node(
            "Linear",
            p(f"{name}_proj", f"model.attn.{name}_proj", "aten.linear.default"),
            x=h,
            weight=wt,
            out=lin,
        )
        heads[name] = split_heads(w, lin, name, n, D, t_val)
    att = t("attn", (1, HEADS, "T", D))
    w.add_node(
        "UpdateAndAttend",
        p("attn", "model.attn", "mlxgraph.update_and_attend.default"),
        q=heads["q"],
        k=heads["k"],
        v=heads["v"],
        position=pos,
        out=att,
        layer_id=0,
        scale=D**-0.5,
    )
    att2 = t("attn2", (1, HEADS, "T", D), "float16")
    w.add_node("UpdateAndAttend", q=heads["q"], k=heads["k"], v=heads["v"], position=pos, out=att2,
               layer_id=1, scale=0.5, out_dtype=1, sinks=sinks, softcap=30.0)
    back = t("attn_t", (1, "T", HEADS, D))
    w.add_node("Permute", x=att, out=back, perm=[0, 2, 1, 3])
    flat = t("attn_flat", (1, "T", HEADS * D))
    w.add_node(
        "Reshape",
        x=back,
        out=flat,
        shape=[Operand.literal(1), Operand.value(t_val), Operand.literal(HEADS * D)],
    )
    scaled = t("scaled", (1, "T", HIDDEN))
    w.add_node("Mul", a=Operand.tensor(flat), b=Operand.literal(0.5), out=scaled)
    n_val = w.add_value("n")
    w.add_node("SymSize", x=tok, axis=1, out=n_val)
    m_val = w.add_value("m")
    w.add_node("SymArith", op=2, a=Operand.value(n_val), b=Operand.literal(2), out=m_val)  # 2 = mul
    first = t("first", (1, None, HIDDEN))
    w.add_node(
        "Slice",
        x=scaled,
        out=first,
        axis=1,
        start=Operand.literal(0),
        end=Operand.value(m_val),
        step=1,
    )
    mask = t("mask", (1, "T", HIDDEN), "bool")
    w.add_node("Greater", a=Operand.tensor(scaled), b=Operand.literal(0.0), out=mask)
    gated = t("gated", (1, "T", HIDDEN))
    w.add_node("Where", cond=mask, a=Operand.tensor(scaled), b=Operand.literal(False), out=gated)
    total = t("total", (1, "T"))
    w.add_node("Sum", x=gated, out=total, axes=[-1], keepdims=False)
    logits = t("logits", (1, "T", vocab))
    w.add_node("Linear", p("lm_head", "lm_head"), x=gated, weight=lm_head, out=logits)
    w.add_output("logits", logits)
    w.add_output("total", total)
    w.add_output("attn2", att2)   # 1.1: sinks and softcapping reach an output
    w.add_output("quantized", _quantized_branch(w, rng, tok, vocab, bias=w.add_constant(
        "qlin.bias", rng.standard_normal(HIDDEN).astype(np.float32))))  # 1.2
    layers, states = format_1_3_branch(w, rng, tok, pos, t_val, vocab)  # 1.3
    w.metadata.architecture = "GoldenSample"
    w.metadata.num_layers = 2 + len(layers) + len(states)
    w.metadata.vocab_size = vocab
    w.metadata.hidden_size = HIDDEN
    w.metadata.max_context = 64
    w.metadata.eos_token_ids = (2, 3)
    w.metadata.bos_token_id = 1
    w.metadata.layers = (LayerCacheInfo(0, KV_HEADS, D, D, 0, attention_chunk=4),
                         LayerCacheInfo(1, KV_HEADS, D, D, 8), *layers)
    w.metadata.states = states
    w.metadata.tokenizer = "byte"
    w.metadata.extra = {"license": "test", "seed": str(seed)}
    return w


def _quantized_branch(w, rng, tok, vocab, bias) -> int:
    """tokens -> QuantizedEmbedding (8 bits) -> QuantizedLinear (4 bits, bias); its out slot.
    Any uint32 words are a valid packing, so the codes are random words."""
    cols, group = 32, 32

    def triple(name, rows, bits):
        words = rng.integers(0, 2**32, (rows, cols * bits // 32), dtype=np.uint64)
        scales = (rng.random((rows, cols // group)) * 0.1).astype(np.float32)
        biases = (rng.standard_normal((rows, cols // group)) * 0.1).astype(np.float32)
        return (w.add_constant(f"{name}.q", words.astype(np.uint32)),
                w.add_constant(f"{name}.scales", scales), w.add_constant(f"{name}.biases", biases))

    emb = triple("qembed", vocab, 8)
    rows = w.add_tensor("qrows", "float32", (1, "T", cols))
    w.add_node("QuantizedEmbedding", Provenance("qembed", "model.qembed"), weight=emb[0],
               scales=emb[1], biases=emb[2], indices=tok, out=rows, group_size=group, bits=8)
    lin = triple("qlin", HIDDEN, 4)
    out = w.add_tensor("qout", "float32", (1, "T", HIDDEN))
    w.add_node("QuantizedLinear", Provenance("qlin", "model.qlin"), x=rows, weight=lin[0],
               scales=lin[1], biases=lin[2], bias=bias, out=out, group_size=group, bits=4)
    return out


def _jsonable(v):
    if isinstance(v, Operand):
        return {"kind": v.kind, "index": v.index, "number": v.number}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def expected_records(w: GraphWriter) -> dict:
    """What the writer was handed, as JSON-ready data (the golden's independent record)."""
    from mlxgraph.schema.dtypes import dtype_info

    return {
        "format_version": format_version(),
        "producer": w.producer,
        "symbols": [[n, lo, hi, slot] for n, lo, hi, slot in w.symbols],
        "values": list(w.values),
        "tensors": [
            [n, None if c is None else dtype_info(c).name, list(s)] for n, c, s in w.tensors
        ],
        "inputs": dict(w.inputs),
        "outputs": dict(w.outputs),
        "constants": [
            {"tensor": slot, "hash": digest, "values": np.asarray(d, np.float64).ravel().tolist()}
            for slot, d, digest in w.constants
        ],
        "nodes": [
            {
                "op": n.op,
                "fields": {k: _jsonable(v) for k, v in n.fields.items()},
                "provenance": [n.provenance.source, n.provenance.module_path, n.provenance.target],
            }
            for n in w.nodes
        ],
        "metadata": {
            "architecture": w.metadata.architecture,
            "num_layers": w.metadata.num_layers,
            "vocab_size": w.metadata.vocab_size,
            "hidden_size": w.metadata.hidden_size,
            "max_context": w.metadata.max_context,
            "eos_token_ids": list(w.metadata.eos_token_ids),
            "bos_token_id": w.metadata.bos_token_id,
            "tokenizer": w.metadata.tokenizer,
            "layers": [list(lc.__dict__.values()) for lc in w.metadata.layers],
            "states": [[s.layer_id, list(s.shape), s.dtype] for s in w.metadata.states],
            "extra": dict(w.metadata.extra),
        },
    }


def _json_lines(doc: dict) -> str:
    """JSON with one line per top-level key or list entry (reviewable, diffable)."""
    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v:
            body = "[\n" + ",\n".join("  " + json.dumps(x) for x in v) + "\n ]"
        else:
            body = json.dumps(v)
        lines.append(f" {json.dumps(k)}: {body}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


# The step every golden file is run on (6 tokens: layer 0's chunk of 4 is crossed), and from
# format 1.3 on a second step on the same session (what the caches and recurrent states
# carried from the first must give).
GOLDEN_TOKENS = [1, 2, 3, 4, 5, 6]
GOLDEN_NEXT_TOKENS = [7, 8, 9]


def golden_steps(session, doc: dict) -> list:
    """[(tokens, outputs as numpy arrays)] of the steps ``doc`` (an outputs.json) records,
    run in order on ``session``: the first, then "next" where the golden has it."""
    steps, start = [], 0
    for tokens in [doc["tokens"]] + ([doc["next"]["tokens"]] if "next" in doc else []):
        out = session.step(np.array([tokens]), range(start, start + len(tokens)))
        outs = out if isinstance(out, dict) else {"logits": out}
        steps.append((tokens, {k: np.array(v) for k, v in outs.items()}))
        start += len(tokens)
    return steps


def _as_lists(outs: dict) -> dict:
    """Outputs as JSON-ready float64 lists."""
    return {k: v.astype(np.float64).tolist() for k, v in outs.items()}


def record_outputs(mlxg: Path) -> Path:
    """Run ``mlxg`` on GOLDEN_TOKENS, then GOLDEN_NEXT_TOKENS, and write the outputs next to
    it (format-X.Y.outputs.json): what every later mlxgraph must compute from that file."""
    import mlxgraph

    session = mlxgraph.load(mlxg).session(capacity=16)
    plan = {"tokens": GOLDEN_TOKENS, "next": {"tokens": GOLDEN_NEXT_TOKENS}}
    (_, first), (_, second) = golden_steps(session, plan)
    doc = {"tokens": GOLDEN_TOKENS, "outputs": _as_lists(first),
           "next": {"tokens": GOLDEN_NEXT_TOKENS, "outputs": _as_lists(second)}}
    path = mlxg.with_name(mlxg.name[:-len(".mlxg")] + ".outputs.json")
    path.write_text(json.dumps(doc) + "\n")
    return path


def main(argv) -> int:
    """Write tests/golden/format-<version>.{mlxg,json}; refuses to overwrite without --force."""
    mlxg = GOLDEN / f"format-{format_version()}.mlxg"
    record = GOLDEN / f"format-{format_version()}.json"
    if mlxg.exists() and "--force" not in argv:
        print(
            f"{mlxg} exists: a released golden file must not change (--force to overwrite)",
            file=sys.stderr,
        )
        return 1
    GOLDEN.mkdir(exist_ok=True)
    w = build_sample()
    info = w.write(mlxg)
    record.write_text(_json_lines(expected_records(w)))
    outputs = record_outputs(mlxg)
    print(f"wrote {mlxg} ({info['bytes']} bytes), {record} and {outputs}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
