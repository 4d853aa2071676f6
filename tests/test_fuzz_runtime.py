"""Fuzz past the verifier: mutated files that pass ``verify`` are loaded and stepped, and
mutated embedded tokenizers and chat templates are loaded, encoded, decoded and rendered.

Each chunk of cases runs in its own process (tests/fuzz_runtime_worker.py,
tests/fuzz_text_worker.py; the text one under a 6 GiB address-space limit), so a crash
(a signal) or a hang (the timeout) is caught and located by the last case started. Pass:
no crash, no hang, and no exception type other than the documented ones.

MLXGRAPH_RUNTIME_FUZZ_CASES sets the count of the slow variant (default 100,000), spread
over chunks of 2,000 cases in MLXGRAPH_FUZZ_WORKERS parallel processes (default 2);
MLXGRAPH_TEXT_FUZZ_CASES the text fuzz's (default 10,000).
"""

import json
import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fuzz_runtime_worker.py")
TEXT_WORKER = Path(__file__).with_name("fuzz_text_worker.py")
CHUNK_TIMEOUT = 1800  # seconds for one chunk; a hang shows as a timeout


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _chunk(seed: int, first: int, count: int, folder: Path, worker=WORKER) -> dict:
    progress = folder / f"progress-{first}.txt"
    try:
        res = subprocess.run(
            [sys.executable, str(worker), str(seed), str(first), str(count), str(progress)],
            capture_output=True,
            text=True,
            timeout=CHUNK_TIMEOUT,
            preexec_fn=_limit_memory if worker == TEXT_WORKER else None,
        )
    except subprocess.TimeoutExpired:
        return {
            "first": first,
            "failure": f"hang: case {progress.read_text().strip()} still running after "
            f"{CHUNK_TIMEOUT} s",
        }
    if res.returncode != 0:
        last = progress.read_text().strip() if progress.exists() else "?"
        return {
            "first": first,
            "failure": f"exit {res.returncode} at case {last}: {res.stderr[-1500:]}",
        }
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_fuzz(tmp_path, cases: int, seed: int, chunk: int = 2000, workers: int = 1,
             worker=WORKER) -> dict:
    """Run ``cases`` cases in chunks; returns the summed tallies and any failures."""
    starts = range(0, cases, chunk)
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(
            lambda s: _chunk(seed, s, min(chunk, cases - s), tmp_path, worker), starts))
    total = {"cases": cases, "tally": {}, "undocumented": {}, "failures": []}
    for r in results:
        if "failure" in r:
            total["failures"].append(r["failure"])
            continue
        for k, v in r["tally"].items():
            total["tally"][k] = total["tally"].get(k, 0) + v
        for k, v in r["undocumented"].items():
            total["undocumented"].setdefault(k, v)
    return total


def _check(total) -> None:
    print(json.dumps(total, indent=1))
    assert not total["failures"], total["failures"]
    assert not total["undocumented"], total["undocumented"]


def test_runtime_fuzz_small(tmp_path):
    total = run_fuzz(tmp_path, 400, seed=11, chunk=400)
    _check(total)
    assert total["tally"].get("ran", 0) > 20  # many mutants really ran a step


@pytest.mark.slow
def test_runtime_fuzz_large(tmp_path):
    cases = int(os.environ.get("MLXGRAPH_RUNTIME_FUZZ_CASES", "100000"))
    total = run_fuzz(
        tmp_path, cases, seed=2026, workers=int(os.environ.get("MLXGRAPH_FUZZ_WORKERS", "2"))
    )
    _check(total)


def test_text_fuzz_small(tmp_path):
    total = run_fuzz(tmp_path, 120, seed=5, chunk=120, worker=TEXT_WORKER)
    _check(total)
    assert total["tally"].get("ran", 0) > 5  # some mutants really rendered and encoded


@pytest.mark.slow
def test_text_fuzz_large(tmp_path):
    cases = int(os.environ.get("MLXGRAPH_TEXT_FUZZ_CASES", "10000"))
    total = run_fuzz(tmp_path, cases, seed=2027, chunk=1000, worker=TEXT_WORKER,
                     workers=int(os.environ.get("MLXGRAPH_FUZZ_WORKERS", "2")))
    _check(total)
