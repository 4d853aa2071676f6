"""benchmarks/gpu_bench.py runs on a CPU-only machine too: the tiny size, end to end (a
seeded folder, its export, mlxgraph and transformers in their own processes, step_batch),
and its figures hold together: the same greedy tokens, a positive bound, every B reported."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_bench_tiny_on_the_cpu(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--size", "tiny",
           "--dtype", "float32", "--prompt", "12", "--new-tokens", "6", "--runs", "1",
           "--batches", "1,2", "--engines", "mlxgraph,transformers", "--workdir",
           str(tmp_path), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["device"]["gpu"] is False and doc["torch_device"] == "cpu"
    assert doc["device"]["bandwidth"] > 0 and doc["decode_bound_tps"] > 0
    ours, peer = doc["engines"]["mlxgraph"], doc["engines"]["transformers"]
    assert len(ours["tokens"]) == 6 and ours["tokens"] == peer["tokens"]  # float32: exact
    assert doc["ratios"]["transformers"]["greedy_tokens"] == "identical"
    assert [r["batch"] for r in doc["batches"]] == [1, 2]
    assert all(r["tok_s"] > 0 for r in doc["batches"])
