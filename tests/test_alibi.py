"""ALiBi attention (issue 31): BLOOM and MPT export with one slope per query head in their
attention node (format 1.3, ``UpdateAndAttendNode.alibi_slopes``) and match transformers
eager over a prefill, 40 greedy decode steps, a chunked prefill and batched steps; BLOOM's
sessions fork, save and restore bitwise and keep 8-bit KV caches. The kernel's bias is
checked against BLOOM's own form (slope * key position) over a flat cache and a sliding
window's ring; the verifier holds the slopes to the query heads, a reader of format 1.2
refuses the field by name, and Falcon's bfloat16-rounded ALiBi stays refused in one line.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from parity_helpers import hf_greedy_reference, ids, mlxgraph_parity_errors, rel_err
from run_cache import build_once
from tool_helpers import run_cli

import mlxgraph
from mlxgraph.exporter import AdapterError, export
from mlxgraph.exporter.builtins import build_model, make_config
from mlxgraph.schema.errors import GraphFormatError
from mlxgraph.schema.verifier import verify_buffer

TOL = 1e-4
PROMPT, DECODE = 12, 40
# 6 heads: the slope formulas' branch for a head count that is not a power of two (BLOOM's
# extra slopes, MPT's interleaved ones); head_dim 32, so 8-bit KV rows quantize.
_SMALL = dict(num_hidden_layers=2, hidden_size=192, num_attention_heads=6, vocab_size=256)
FAMILIES = {
    "bloom": _SMALL,
    # clip_qkv: MPT's clamp of the fused projection stays in the routed forward
    "mpt": dict(_SMALL, max_seq_len=128, expansion_ratio=2, attn_config={"clip_qkv": 0.5}),
}

# Both files' slopes for 6 heads, by hand: the 4 of the power of two below (2^-2k), then
# BLOOM's extra odd powers of 2^-1 / MPT's odd entries of the 8-head list: the same numbers.
SLOPES_6 = (2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3)


def _model(arch):
    return build_model(make_config(arch, **FAMILIES[arch]), seed=0)


@pytest.fixture(scope="module")
def bloom(tmp_path_factory):
    path = build_once(tmp_path_factory, "bloom_alibi.mlxg",
                      lambda p: export(_model("bloom"), p, max_seq_len=64))
    return path


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_alibi_families_match_transformers(arch, bloom, tmp_path):
    model = _model(arch)
    path = bloom if arch == "bloom" else tmp_path / "m.mlxg"
    if arch != "bloom":
        export(model, path, max_seq_len=64)
    program = mlxgraph.load(path)
    nodes = [n for n in program.graph.nodes if n.op == "UpdateAndAttendNode"]
    assert [tuple(n.fields["alibi_slopes"]) for n in nodes] == [SLOPES_6] * 2
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(5))
    reference = hf_greedy_reference(_model(arch), prompt, DECODE)
    errors = mlxgraph_parity_errors(path, prompt.numpy(), reference, chunk=5)
    print(arch, {k: v for k, v in errors.items() if k != "tokens"})
    assert max(errors[k] for k in ("prefill", "decode", "chunked", "batched")) < TOL, errors
    assert errors["tokens"] == reference[2]


def _steps(session, tokens, start):
    return [np.array(session.step(ids([t]), [start + i]))[0, -1] for i, t in enumerate(tokens)]


def test_fork_restore_and_8_bit_caches(bloom, tmp_path):
    program = mlxgraph.load(bloom)
    session = program.session(capacity=64)
    session.step(ids([[5, 9, 17, 3, 200, 41]]), range(6))
    twin = session.fork()
    path = tmp_path / "c.safetensors"
    session.save(path)
    restored = program.restore(path)
    want = _steps(session, [7, 8, 9], 6)
    assert all(np.array_equal(a, b) for a, b in zip(_steps(twin, [7, 8, 9], 6), want))
    assert all(np.array_equal(a, b) for a, b in zip(_steps(restored, [7, 8, 9], 6), want))
    quantized = program.session(capacity=64, kv_bits=8, kv_group_size=32)
    quantized.step(ids([[5, 9, 17, 3, 200, 41]]), range(6))
    got = _steps(quantized, [7, 8, 9], 6)
    # The bias is added to the scores whatever the rows are stored as; what differs is the
    # 8-bit rounding of keys and values (3.8e-2 measured at these large random weights).
    assert max(rel_err(a, b) for a, b in zip(got, want)) < 6e-2


def test_inspect_shows_the_alibi_layers(bloom, capsys):
    code, out, _ = run_cli(capsys, "inspect", "--json", bloom)
    assert code == 0
    assert [g["alibi"] for g in json.loads(out)["metadata"]["cache"]] == [True]
    code, out, _ = run_cli(capsys, "inspect", "--nodes", bloom)
    assert code == 0 and "alibi" in out and out.count("alibi_slopes=") == 2


# -- the kernel against BLOOM's form, on a graph of its own ------------------------------

SLOPES = (0.5, 0.125)
SCALE = 0.05


def _alibi_graph(slopes=SLOPES, heads=2) -> bytes:
    """tokens -> rows of a table x [1, T, 2]; q = [x, -x] (2 query heads), k = v = x (one
    kv head); attention with ALiBi; out [1, 2, T, 2]."""
    from hostile_graphs import _finish, _start

    from mlxgraph.schema.records import LayerCacheInfo

    w, _, tok, table = _start(vocab=8, rows=8, max_t=16)
    pos = w.add_tensor("positions", "int32", ("T",))
    w.add_input("positions", pos)
    x = w.add_tensor("x", "float32", (1, "T", 2))
    w.add_node("Embedding", weight=table, indices=tok, out=x)
    k = w.add_tensor("k", "float32", (1, 1, "T", 2))
    w.add_node("Unsqueeze", x=x, out=k, axis=1)
    neg = w.add_tensor("neg", "float32", (1, 1, "T", 2))
    w.add_node("Neg", x=k, out=neg)
    q = w.add_tensor("q", "float32", (1, heads, "T", 2))
    w.add_node("Concat", inputs=[k, neg][:heads], out=q, axis=1)
    out = w.add_tensor("att", "float32", (1, heads, "T", 2))
    w.add_node("UpdateAndAttend", q=q, k=k, v=k, position=pos, out=out, layer_id=0,
               scale=SCALE, alibi_slopes=list(slopes))
    w.metadata.layers = (LayerCacheInfo(0, 1, 2, 2, 0),)
    return _finish(w, out)


def _bloom_form(tokens, window=0, slopes=SLOPES):
    """[2, T, 2]: each query against the keys it sees, scored scale * q.k + slope * j (BLOOM's
    absolute key position j), in float64."""
    x = np.arange(16, dtype=np.float64).reshape(8, 2)[tokens]
    out = np.zeros((2, len(tokens), 2))
    for h, (sign, slope) in enumerate(zip((1, -1), slopes)):
        for i in range(len(tokens)):
            j = np.arange(max(0, i - window + 1) if window else 0, i + 1)
            scores = SCALE * (sign * x[i]) @ x[j].T + slope * j
            p = np.exp(scores - scores.max())
            out[h, i] = (p / p.sum()) @ x[j]
    return out


@pytest.mark.parametrize("native", [True, False], ids=["native-softmax", "mlx-softmax"])
@pytest.mark.parametrize("window", [0, 3])
def test_the_bias_is_blooms_over_a_flat_cache_and_a_ring(tmp_path, monkeypatch, window, native):
    """A prefill, a chunk, then one-token steps; with a window of 3 the ring wraps (its
    slots out of position order), so the distances come from where each slot's key sits.
    Both softmaxes of the explicit path: the native one (float32 on the CPU) and MLX's."""
    if not native:
        monkeypatch.setattr("mlxgraph.interpreter.attention.native_for", lambda *a: None)
    (tmp_path / "g.mlxg").write_bytes(_alibi_graph())
    program = mlxgraph.load(tmp_path / "g.mlxg")
    session = program.session(capacity=16, windows=window or None, max_step=4)
    tokens = [1, 3, 2, 7, 5, 6, 0, 4, 2, 1, 3, 7]
    want = _bloom_form(tokens, window)
    start = 0
    for n in (4, 3, 1, 1, 1, 1, 1):
        got = np.array(session.step(ids(tokens[start:start + n]), range(start, start + n)))
        np.testing.assert_allclose(got[0], want[:, start:start + n], rtol=1e-5, atol=1e-5)
        start += n
    # Without the bias the same steps are far off: the check above can fail.
    assert np.abs(want - _bloom_form(tokens, window, slopes=(0.0, 0.0))).max() > 0.5


@pytest.mark.parametrize("slopes,reason", [
    ((0.5,), "1 ALiBi slopes for q's query heads (2): one per head"),
    ((0.5, float("nan")), "an ALiBi slope is not finite"),
    ((0.5, float("inf")), "an ALiBi slope is not finite"),
])
def test_the_verifier_holds_slopes_to_the_query_heads(slopes, reason):
    with pytest.raises(GraphFormatError) as e:
        verify_buffer(_alibi_graph(slopes))
    assert reason in str(e.value) and "\n" not in str(e.value)
    assert "alibi_slopes" in str(e.value)


def test_a_reader_of_format_1_2_refuses_alibi_by_name(tmp_path):
    from test_schema_evolution import _OLD_READER, HISTORY

    previous = next(p for p in HISTORY if p.stem == "1.2")
    (tmp_path / "g.mlxg").write_bytes(_alibi_graph())
    r = subprocess.run([sys.executable, "-c", _OLD_READER, str(previous),
                        str(tmp_path / "g.mlxg")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "UpdateAndAttendNode" in r.stdout and "written by a newer mlxgraph" in r.stdout, r.stdout
    assert r.stdout.count("\n") == 1


def test_falcon_alibi_stays_refused_in_one_line(tmp_path):
    """transformers rounds Falcon's bias (slope * position) to bfloat16: not linear in the
    position, so not the op's bias; refused before tracing."""
    model = build_model(make_config("falcon", num_hidden_layers=2, hidden_size=64,
                                    num_attention_heads=4, vocab_size=256, alibi=True))
    with pytest.raises(AdapterError, match=r"^falcon: config\.alibi: ALiBi position biases "
                                           r"rounded to bfloat16 \(Falcon's\) are not supported$"):
        export(model, tmp_path / "f.mlxg", max_seq_len=16)


def test_another_class_of_alibi_attention_is_refused(tmp_path):
    """Only the listed classes are routed: a subclass of BLOOM's attention is other code."""
    model = build_model(make_config("bloom", num_hidden_layers=1, hidden_size=64,
                                    num_attention_heads=4, vocab_size=256))
    attn = model.transformer.h[0].self_attention
    attn.__class__ = type("OtherBloomAttention", (type(attn),), {})
    with pytest.raises(AdapterError, match=r"transformer\.h\.0\.self_attention "
                                           r"\(OtherBloomAttention\): an attention implementation"):
        export(model, tmp_path / "b.mlxg", max_seq_len=16)
