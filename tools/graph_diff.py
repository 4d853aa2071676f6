"""The difference of two graph files as a JSON-ready dict (rendered by tools/diff_cmd.py).

Nodes are paired by tools/align.py. A paired node is *changed* when an attribute, a
literal, an output's dtype or shape, or the wiring of an input differs. A node entry is
*dtype_only* when it is an inserted or deleted Cast, or a change of dtypes alone (output
dtypes, DType attributes): the whole difference of two precisions of one export. Wiring is
compared through the pairing: an input read from paired producers is the same; one read
from an inserted or deleted node is already explained by that insertion or deletion and
is not reported again. Constants are paired by name, then through the nodes that read
them, then by content hash. Slot numbers, slot names and provenance never count as
differences (provenance is shown for context); neither do the producer string and the
format version, which the report shows in its header.
"""

import hashlib

from mlxgraph.schema.op_catalogue import Trait, entry
from mlxgraph.schema.spec import op_spec
from mlxgraph.tools.align import Flow, align
from mlxgraph.tools.node_text import SlotNames, format_node, short_name
from mlxgraph.tools.numeric import constant_errors
from mlxgraph.tools.quantized_view import dequantized_errors, packed_weights

_META_FIELDS = (
    "architecture",
    "num_layers",
    "vocab_size",
    "hidden_size",
    "max_context",
    "eos_token_ids",
    "bos_token_id",
    "tokenizer",
)


def _text_size(text):
    raw = None if text is None else text.encode("utf-8")
    return raw and f"{len(raw)} bytes, blake2b {hashlib.blake2b(raw, digest_size=8).hexdigest()}"


def _entry(field, a, b) -> dict:
    return {"field": field, "a": a, "b": b}


def diff_metadata(ga, gb) -> list:
    """Differences of model metadata and symbols: [{'field', 'a', 'b'}]."""
    ma, mb = ga.metadata, gb.metadata
    out = [
        _entry(f, _plain(getattr(ma, f)), _plain(getattr(mb, f)))
        for f in _META_FIELDS
        if getattr(ma, f) != getattr(mb, f)
    ]
    la, lb = ({lc.layer_id: lc for lc in m.layers} for m in (ma, mb))
    for lid in sorted(set(la) | set(lb)):
        if la.get(lid) != lb.get(lid):
            out.append(_entry(f"layers[{lid}]", _layer(la.get(lid)), _layer(lb.get(lid))))
    for k in sorted(set(ma.extra) | set(mb.extra)):
        if ma.extra.get(k) != mb.extra.get(k):
            out.append(_entry(f"extra[{k}]", ma.extra.get(k), mb.extra.get(k)))
    fa, fb = ma.tokenizer_files, mb.tokenizer_files
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):  # sizes, not the texts (a tokenizer.json is megabytes)
            a, b = _text_size(fa.get(k)), _text_size(fb.get(k))
            out.append(_entry(f"tokenizer_files[{k}]", a, b))
    sa, sb = ({s.name: (s.min, s.max) for s in g.symbols} for g in (ga, gb))
    for name in sorted(set(sa) | set(sb)):
        if sa.get(name) != sb.get(name):
            out.append(_entry(f"symbol[{name}]", _bounds(sa.get(name)), _bounds(sb.get(name))))
    return out


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def _layer(lc):
    if lc is None:
        return None
    return {
        "kv_heads": lc.kv_heads,
        "head_dim": lc.head_dim,
        "v_head_dim": lc.v_head_dim,
        "sliding_window": lc.sliding_window,
        "attention_chunk": lc.attention_chunk,
    }


def _bounds(b):
    return None if b is None else {"min": b[0], "max": b[1]}


def _slot(g, slot) -> dict:
    t = g.tensors[slot]
    return {"dtype": t.dtype, "shape": list(t.shape)}


class _Differ:
    def __init__(self, ga, gb):
        self.ga, self.gb = ga, gb
        self.fa, self.fb = Flow(ga), Flow(gb)
        self.pairs = align(self.fa, self.fb)
        self.a2b = {a: b for a, b in self.pairs if a is not None and b is not None}
        self.packed_a, self.packed_b = packed_weights(ga), packed_weights(gb)
        self.b2a = {b: a for a, b in self.a2b.items()}
        # Constants pair by name first (the parameter path is the most stable identity),
        # then through the nodes that read them (source_diff), then by content hash.
        by_name = {gb.tensors[c.tensor].name: k for k, c in enumerate(gb.constants)}
        self.ca2b, self.cb2a = {}, {}
        for k, c in enumerate(ga.constants):
            m = by_name.get(ga.tensors[c.tensor].name)
            if m is not None and m not in self.cb2a:
                self.ca2b[k], self.cb2a[m] = m, k

    def source_diff(self, sa, sb) -> bool:
        """True when two sources differ in a way no insertion or deletion explains."""
        if (sa.kind == "node" and sa.ref[0] not in self.a2b) or (
            sb.kind == "node" and sb.ref[0] not in self.b2a
        ):
            return False
        if sa.kind != sb.kind:
            return True
        if sa.kind == "node":
            return self.a2b[sa.ref[0]] != sb.ref[0] or sa.ref[1:] != sb.ref[1:]
        if sa.kind == "const":
            if sa.ref not in self.ca2b and sb.ref not in self.cb2a:
                self.ca2b[sa.ref], self.cb2a[sb.ref] = sb.ref, sa.ref
            return self.ca2b.get(sa.ref) != sb.ref
        return sa.ref != sb.ref

    def node_changes(self, i, j) -> list:
        fa, fb = self.fa, self.fb
        op_a, op_b = self.ga.nodes[i].op, self.gb.nodes[j].op  # Linear vs QuantizedLinear
        out = [] if op_a == op_b else [_entry("op", short_name(op_a), short_name(op_b))]
        attrs_a, attrs_b = dict(fa.attrs[i]), dict(fb.attrs[j])
        for name in list(attrs_a) + [n for n in attrs_b if n not in attrs_a]:
            if attrs_a.get(name) != attrs_b.get(name):
                out.append(_entry(name, _plain(attrs_a.get(name)), _plain(attrs_b.get(name))))
        ins_a = {(n, p): s for n, p, s in fa.inputs[i]}
        ins_b = {(n, p): s for n, p, s in fb.inputs[j]}
        for key in list(ins_a) + [k for k in ins_b if k not in ins_a]:
            sa, sb = ins_a.get(key), ins_b.get(key)
            if sa is None or sb is None or self.source_diff(sa, sb):
                out.append(_entry(_fname(key), sa and fa.describe(sa), sb and fb.describe(sb)))
        outs_a = {(n, p): s for n, p, s, v in fa.outputs[i] if not v}
        outs_b = {(n, p): s for n, p, s, v in fb.outputs[j] if not v}
        for key in list(outs_a) + [k for k in outs_b if k not in outs_a]:
            ta = self.ga.tensors[outs_a[key]] if key in outs_a else None
            tb = self.gb.tensors[outs_b[key]] if key in outs_b else None
            if ta is None or tb is None:
                out.append(_entry(_fname(key), ta and ta.name, tb and tb.name))
                continue
            if ta.dtype != tb.dtype:
                out.append(_entry(f"{_fname(key)}.dtype", ta.dtype, tb.dtype))
            if ta.shape != tb.shape:
                out.append(_entry(f"{_fname(key)}.shape", list(ta.shape), list(tb.shape)))
        return out

    def nodes(self) -> list:
        na, nb = SlotNames(self.ga), SlotNames(self.gb)
        out = []
        for i, j in self.pairs:
            if i is None or j is None:
                side, k, g, names = ("b", j, self.gb, nb) if i is None else ("a", i, self.ga, na)
                rec = g.nodes[k]
                out.append({"change": "inserted" if i is None else "deleted", side: k,
                            "op": short_name(rec.op),
                            "dtype_only": entry(rec.op).has(Trait.DTYPE_ONLY),
                            "text": format_node(k, rec, names)})
                continue
            fields = self.node_changes(i, j)
            if fields:
                rec = self.ga.nodes[i]
                dtype_attrs = {f.name for f in op_spec(rec.op).table.fields if f.type == "DType"}
                dtype_only = all(
                    f["field"].endswith(".dtype") or f["field"] in dtype_attrs for f in fields
                )
                out.append({"change": "changed", "a": i, "b": j, "op": short_name(rec.op),
                            "dtype_only": dtype_only, "fields": fields,
                            "module_path": rec.provenance.module_path})
        return out

    def io(self, which) -> list:
        da, db = getattr(self.ga, which), getattr(self.gb, which)
        out = []
        for name in list(da) + [n for n in db if n not in da]:
            a = _slot(self.ga, da[name]) if name in da else None
            b = _slot(self.gb, db[name]) if name in db else None
            fields = []
            if a is not None and b is not None:
                fields = [_entry(k, a[k], b[k]) for k in ("dtype", "shape") if a[k] != b[k]]
                if which == "outputs":
                    sa, sb = self.fa.final[da[name]], self.fb.final[db[name]]
                    if self.source_diff(sa, sb):
                        fields.append(_entry("source", self.fa.describe(sa), self.fb.describe(sb)))
            if a is None or b is None or fields:
                change = "added" if a is None else "removed" if b is None else "changed"
                out.append({"name": name, "change": change, "a": a, "b": b, "fields": fields})
        return out

    def constant_errors(self, k, m):
        """(max_abs, max_rel) of a changed constant pair; a packed (quantized) weight on
        either side is compared in dequantized space; None when nothing is comparable."""
        if k in self.packed_a or m in self.packed_b:
            return dequantized_errors(self.ga, k, self.gb, m)
        same = self.ga.tensors[self.ga.constants[k].tensor].shape == self.gb.tensors[
            self.gb.constants[m].tensor].shape
        return constant_errors(self.ga, k, self.gb, m) if same else None

    def constants(self, stats: bool) -> list:
        ga, gb = self.ga, self.gb
        hash_b = {}
        for k, c in enumerate(gb.constants):
            hash_b.setdefault(c.hash, []).append(k)
        for k, c in enumerate(ga.constants):
            cand = (
                [m for m in hash_b.get(c.hash, []) if m not in self.cb2a]
                if k not in self.ca2b
                else []
            )
            if cand:
                self.ca2b[k], self.cb2a[cand[0]] = cand[0], k
        out = []
        for k in range(len(ga.constants)):
            m = self.ca2b.get(k)
            a = _const(ga, k)
            if m is None:
                out.append({"change": "removed", "a": a, "b": None})
                continue
            b = _const(gb, m)
            if (a["hash"], a["dtype"], a["shape"]) == (b["hash"], b["dtype"], b["shape"]):
                continue
            entry = {"change": "changed", "a": a, "b": b}
            errors = self.constant_errors(k, m) if stats else None
            if errors is not None:
                entry["max_abs_diff"], entry["max_rel_diff"] = errors
            out.append(entry)
        out.extend(
            {"change": "added", "a": None, "b": _const(gb, m)}
            for m in range(len(gb.constants))
            if m not in self.cb2a
        )
        return out


def _fname(key) -> str:
    name, pos = key
    return name if pos is None else f"{name}[{pos}]"


def _const(g, k) -> dict:
    c = g.constants[k]
    t = g.tensors[c.tensor]
    return {
        "index": k,
        "name": t.name,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "bytes": c.length,
        "hash": c.hash,
    }


def diff_graphs(ga, gb, stats: bool = True) -> dict:
    """The differences of graph ``gb`` against ``ga``.

    Args:
        ga, gb: GraphFiles (fully decodable).
        stats: compute max abs / rel differences of changed same-shaped constants.
    Returns:
        {'same', 'summary', 'metadata', 'inputs', 'outputs', 'nodes', 'constants'}
        (the keys docs/json-output.md documents).
    """
    d = _Differ(ga, gb)
    nodes = d.nodes()  # pairs constants through their readers first
    doc = {
        "metadata": diff_metadata(ga, gb),
        "inputs": d.io("inputs"),
        "outputs": d.io("outputs"),
        "nodes": nodes,
        "constants": d.constants(stats),
    }
    summary = {
        k: sum(1 for n in nodes if n["change"] == k) for k in ("inserted", "deleted", "changed")
    }
    summary.update({k: len(doc[k]) for k in ("metadata", "inputs", "outputs", "constants")})
    summary["aligned"] = len(d.a2b)
    same = not any(v for k, v in summary.items() if k != "aligned")
    summary["dtype_only"] = sum(1 for n in nodes if n["dtype_only"])
    return {"same": same, "summary": summary, **doc}
