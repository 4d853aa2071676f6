"""compute_dtype="float32": a bfloat16 graph widened at load computes exactly what the
Hugging Face model computes in float32 with the same (bfloat16-rounded) weights.

The oracle is the HF model with its weights rounded to bfloat16 and kept in float32, run
eagerly with its own cache: widening keeps every stored weight value and only changes
the arithmetic, so logits must agree to float32 accuracy over a prefill and many decode
steps, with the same greedy tokens. The unwidened bfloat16 run must be much further away
(or the test could not tell widening from not widening).
"""

import json

import mlx.core as mx
import pytest
import torch
from conftest import tiny_hf_model
from parity_helpers import hf_greedy_reference, ids, rel_err
from tool_helpers import run_cli

import mlxgraph
from mlxgraph.exporter import export

PROMPT, DECODE, MAX_T = 13, 24, 64


@pytest.fixture(scope="module")
def bf16_case(tiny_hf_folder, tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16") / "llama-bf16.mlxg"
    export(str(tiny_hf_folder("llama")), path, dtype="bfloat16", max_seq_len=MAX_T)
    oracle = tiny_hf_model("llama")
    with torch.no_grad():  # weights rounded to bfloat16; buffers (RoPE frequencies) untouched
        for weight in oracle.parameters():
            weight.copy_(weight.to(torch.bfloat16).to(torch.float32))
    prompt = torch.randint(4, 256, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    return path, prompt, hf_greedy_reference(oracle, prompt, DECODE)


def _run(program, prompt, steps):
    """Prefill logits and each greedy decode step's logits, as float64-able arrays."""
    session = program.session()
    out = session.step(ids(prompt[0].tolist()), range(PROMPT))
    prefill = out[0].astype(mx.float32)
    token, decode, tokens = int(mx.argmax(prefill[-1])), [], []
    tokens.append(token)
    for i in range(steps):
        logits = session.step(ids([token]), range(PROMPT + i, PROMPT + i + 1))[0, -1].astype(
            mx.float32
        )
        decode.append(logits)
        token = int(mx.argmax(logits))
        tokens.append(token)
    return prefill, decode, tokens


def test_widened_bf16_graph_matches_float32_oracle(bf16_case):
    path, prompt, (ref_prefill, ref_decode, ref_tokens) = bf16_case
    program = mlxgraph.load(path, compute_dtype="float32")
    assert program.widened_from == ("bfloat16",)
    assert program.float_dtypes == ("float32",)
    assert all(
        c.dtype == mx.float32
        for c in program.constants.values()
        if mx.issubdtype(c.dtype, mx.floating)
    )
    assert not any(
        v in (mx.float16, mx.bfloat16)
        for n in program.nodes
        for v in n.fixed.values()
        if isinstance(v, mx.Dtype)
    )
    prefill, decode, tokens = _run(program, prompt, DECODE)
    worst = max(
        [rel_err(prefill, ref_prefill)] + [rel_err(d, r) for d, r in zip(decode, ref_decode)]
    )
    assert worst < 1e-4, worst
    assert tokens == ref_tokens

    # The same file run as stored (bfloat16 arithmetic) is measurably further from the oracle.
    stored = mlxgraph.load(path)
    assert stored.widened_from == () and "bfloat16" in stored.float_dtypes
    half_prefill, _, _ = _run(stored, prompt, 0)
    assert rel_err(half_prefill, ref_prefill) > 10 * max(worst, 1e-7)


def test_unsupported_compute_dtype_is_refused(bf16_case):
    with pytest.raises(ValueError, match="compute_dtype 'float16'"):
        mlxgraph.load(bf16_case[0], compute_dtype="float16")


def test_generate_compute_dtype_says_so(bf16_case, capsys):
    path = str(bf16_case[0])
    code, out, _ = run_cli(
        capsys,
        "generate",
        path,
        "--prompt-ids",
        "5,6,7",
        "--max-tokens",
        "3",
        "--compute-dtype",
        "float32",
        "--json",
    )
    assert code == 0
    compute = json.loads(out)["stats"]["compute"]
    assert compute == {"dtypes": ["float32"], "widened_from": ["bfloat16"]}
    code, _, err = run_cli(capsys, "generate", path, "--prompt-ids", "5,6,7", "--max-tokens", "3")
    assert code == 0 and "--compute-dtype float32 widens at load" in err


def test_caches_of_widened_and_stored_runs_do_not_mix(bf16_case, tmp_path):
    # The same file computes other K/V once widened: a saved cache must not cross over.
    from mlxgraph.interpreter.errors import CacheFileError

    path, prompt, _ = bf16_case
    wide, stored = mlxgraph.load(path, compute_dtype="float32"), mlxgraph.load(path)
    assert wide.fingerprint != stored.fingerprint
    session = wide.session()
    session.step(ids(prompt[0].tolist()), range(PROMPT))
    session.save(tmp_path / "wide.cache")
    assert wide.restore(tmp_path / "wide.cache").length == PROMPT
    with pytest.raises(CacheFileError, match="another graph"):
        stored.restore(tmp_path / "wide.cache")
