"""Parity: exported graphs run by the interpreter match Hugging Face's own eager forward.

For each architecture (Llama, Qwen2, Mistral with a sliding window smaller than the
context, Gemma-3 text with sliding and full layers mixed, Phi-3, Falcon-7B's multi-query
parallel layout): a tiny model folder with random weights is exported, loaded with the
interpreter, and run as a 17-token prefill, a chunked prefill (chunks of 5) and 40
single-token decode steps. The oracle is the HF model with its own DynamicCache and default
attention; logits must agree within 1e-4 of the logits' scale, and greedy decoding must pick
the same 40 tokens (float32 RMSNorm and RoPE on the native kernels where they are built).
"""

import numpy as np
import pytest
import torch
from conftest import TINY_ARCHS, tiny_hf_model
from parity_helpers import batched_parity_error, hf_greedy_reference, ids, rel_err

import mlxgraph
from mlxgraph.exporter import export
from mlxgraph.interpreter.errors import SessionError
from mlxgraph.interpreter.native import activations as native_activations
from mlxgraph.schema.reader import open_graph

PROMPT, DECODE, CHUNK, MAX_T = 17, 40, 5, 64
TOL = 1e-4


@pytest.fixture(scope="module", params=list(TINY_ARCHS))
def case(request, tiny_hf_folder, tmp_path_factory):
    """(arch, graph path, HF model, prompt, HF reference) for one architecture."""
    arch = request.param
    folder = tiny_hf_folder(arch)
    path = tmp_path_factory.mktemp(f"graph-{arch}") / f"{arch}.mlxg"
    stats = export(str(folder), path, max_seq_len=MAX_T)
    model = tiny_hf_model(arch)
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(4, 256, (1, PROMPT), generator=gen)
    return {"arch": arch, "path": path, "stats": stats, "model": model, "prompt": prompt,
            "ref": hf_greedy_reference(model, prompt, DECODE - 1)}


def _count_native_norm_rope(monkeypatch) -> list:
    """Names of the native RMSNorm/RoPE calls from now on (none without the build)."""
    calls, native = [], native_activations.native_module()
    for name in ("rms_norm", "rope") if native is not None else ():
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    return calls


def test_prefill_then_greedy_decode_matches_hf(case, monkeypatch):
    native_calls = _count_native_norm_rope(monkeypatch)
    prefill, decode, tokens = case["ref"]
    session = mlxgraph.load(case["path"]).session(capacity=128)
    logits = np.array(session.step(ids(case["prompt"].numpy()), range(PROMPT)))[0]
    assert rel_err(logits, prefill) < TOL
    ours = [int(logits[-1].argmax())]
    for i in range(DECODE - 1):
        # Feed our own greedy choice: identical tokens is part of the claim.
        step = np.array(session.step(ids([ours[-1]]), [PROMPT + i]))[0, -1]
        assert rel_err(step, decode[i]) < TOL, f"decode step {i}"
        ours.append(int(step.argmax()))
    assert ours == tokens
    assert session.length == PROMPT + DECODE - 1
    if native_activations.native_module() is not None:  # float32: on the native kernels
        ops = {n.op for n in open_graph(case["path"]).nodes}
        want = {"rope"} | ({"rms_norm"} if "RmsNormNode" in ops else set())  # Falcon: LayerNorm
        assert want <= set(native_calls)


def test_batched_rows_match_hf(case):
    """The prompt stepped in batches beside other sessions: prefill, then greedy decode."""
    program = mlxgraph.load(case["path"])
    assert program.batching.problem is None
    error, tokens = batched_parity_error(program, case["prompt"].numpy(), case["ref"])
    assert error < TOL
    assert tokens == case["ref"][2]


def test_chunked_prefill_matches_hf(case):
    prefill, _, _ = case["ref"]
    session = mlxgraph.load(case["path"]).session(capacity=128)
    prompt = case["prompt"].numpy()
    for start in range(0, PROMPT, CHUNK):
        end = min(start + CHUNK, PROMPT)
        logits = np.array(session.step(ids(prompt[:, start:end]), range(start, end)))[0]
        assert rel_err(logits, prefill[start:end]) < TOL, f"chunk {start}:{end}"


def test_one_update_and_attend_per_layer_and_metadata(case):
    graph = open_graph(case["path"])
    config = case["model"].config
    attn = [n for n in graph.nodes if n.op == "UpdateAndAttendNode"]
    assert sorted(n.fields["layer_id"] for n in attn) == list(range(config.num_hidden_layers))
    meta = graph.metadata
    assert meta.num_layers == config.num_hidden_layers and meta.vocab_size == config.vocab_size
    assert meta.max_context == MAX_T and meta.eos_token_ids == (3,) and meta.bos_token_id == 2
    windows = [lc.sliding_window for lc in meta.layers]
    if case["arch"] == "mistral":
        assert windows == [8, 8]
    elif case["arch"] == "gemma3":
        assert windows == [8, 0, 8]
    else:
        assert set(windows) == {0}
    assert all(n.provenance.source and n.provenance.target for n in graph.nodes)


def test_any_step_length_up_to_max_without_reexport(case):
    model, path = case["model"], case["path"]
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(4, 256, (1, MAX_T), generator=gen)
    with torch.no_grad():
        want = model(tokens, use_cache=False).logits[0].numpy()
    program = mlxgraph.load(path)
    for t in (1, 2, 31, MAX_T):
        got = np.array(program.session(capacity=128).step(ids(tokens[:, :t].numpy()), range(t)))[0]
        assert rel_err(got, want[:t]) < TOL, f"T={t}"
    with pytest.raises(SessionError, match=r"T=65 outside the graph's bounds \[1, 64\]"):
        program.session(capacity=256).step(ids(np.zeros(MAX_T + 1)), range(MAX_T + 1))
