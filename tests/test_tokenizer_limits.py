"""Hostile tokenizer.json files: each is refused with one TokenizerError line, or works
within bounds, and none crashes the process (they run in a subprocess under a memory
limit); encode and decode refuse inputs whose worst case passes the limits before the
library runs; a real SentencePiece charsmap passes and normalizes as the library does."""

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_tokenizers import CASES, CHARSMAP, base, document
from tool_helpers import generate_cli, synthetic_graph

from mlxgraph.interpreter.text.charsmap_check import CharsmapError, charsmap_growth
from mlxgraph.interpreter.text.hf_tokenizer import MAX_DECODE_CHARS, MAX_ENCODE_TOKENS, HFTokenizer
from mlxgraph.interpreter.text.tokenizer import TokenizerError

RUNNER = Path(__file__).with_name("hostile_tokenizers.py")
WORKS = {"padding Fixed 10**9", "truncation to 1", "charsmap valid"}  # the rest: refused


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_hostile_tokenizers_are_refused_in_one_line_without_a_crash(tmp_path):
    progress = tmp_path / "progress"
    proc = subprocess.run([sys.executable, str(RUNNER), str(progress)], capture_output=True,
                          text=True, timeout=120, preexec_fn=_limit_memory)
    assert proc.returncode == 0, (progress.read_text() if progress.exists() else "?",
                                  proc.stderr[-2000:])
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == set(CASES)
    for name, outcome in results.items():
        expected = "ok" if name in WORKS else "TokenizerError: "
        assert outcome.startswith(expected) and "\n" not in outcome, (name, outcome)
    print(f"{len(results)} hostile tokenizer files: "
          f"{sum(not v.startswith('ok') for v in results.values())} refused")


def test_padding_and_truncation_in_a_file_are_dropped():
    tok = HFTokenizer({"tokenizer.json": document("truncation to 1")}, "t")
    plain = HFTokenizer({"tokenizer.json": json.dumps(base())}, "t")
    assert tok.encode("hello hello") == plain.encode("hello hello") != plain.encode("hello")
    padded = HFTokenizer({"tokenizer.json": document("padding Fixed 10**9")}, "t")
    assert padded.encode("hello") == plain.encode("hello")


def test_encode_and_decode_refuse_past_their_worst_case_before_the_library_runs():
    tok = HFTokenizer({"tokenizer.json": json.dumps(base())}, "the test")
    growth = tok.bounds.growth
    assert growth == 8  # Prepend (2) x byte fallback (4)
    with pytest.raises(TokenizerError, match="more than the the test tokenizer may encode"):
        tok.encode("a" * (MAX_ENCODE_TOKENS // growth + 1))
    count = MAX_DECODE_CHARS // (tok.bounds.longest_token + 2) + 1
    with pytest.raises(TokenizerError, match="may decode at once"):
        tok.decode([3] * count)
    assert tok.decode(tok.encode("hello")) == "hello"


def test_a_real_charsmap_passes_and_mutations_that_reach_out_of_bounds_do_not():
    from tokenizers import normalizers

    assert charsmap_growth(CHARSMAP) == 2  # its rules: A -> a, LL -> ll, ① -> 1
    lib = normalizers.Precompiled(__import__("base64").b64decode(CHARSMAP))
    assert lib.normalize_str("ALL ①") == "aLL 1"  # one character at a time
    for bad in ("", "AAAA", CHARSMAP[:40]):
        with pytest.raises(CharsmapError):
            charsmap_growth(bad)


@pytest.mark.parametrize("name", ["chained Replace", "charsmap unit out", "regex backtracking"])
def test_generate_with_a_hostile_embedded_tokenizer_exits_2_in_one_line(tmp_path, name):
    files = {"tokenizer.json": document(name)}
    graph = synthetic_graph(tmp_path / "t.mlxg", tokenizer="embedded", vocab=300, files=files)
    proc = generate_cli(graph, "--prompt", "a" * 40 + "b", "--max-tokens", 2)
    ours = [line for line in proc.stderr.splitlines() if line.startswith("mlxgraph:")]
    assert proc.returncode == 2 and len(ours) == 1 and "tokenizer" in ours[0], proc.stderr


def test_generate_ends_a_slow_tokenizer_at_its_deadline(tmp_path):
    # (a+)+$ runs 0.2 s per run of 22 'a' without reaching Oniguruma's backtracking limit.
    import time

    files = {"tokenizer.json": document("regex slow")}
    graph = synthetic_graph(tmp_path / "t.mlxg", tokenizer="embedded", vocab=300, files=files)
    start = time.monotonic()
    proc = generate_cli(graph, "--prompt", ("a" * 22 + "!") * 300, "--max-tokens", 2,
                        env={"MLXGRAPH_TOKENIZER_DEADLINE": "1"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "took more than 1 s" in lines[0], \
        proc.stderr
    assert time.monotonic() - start < 25
