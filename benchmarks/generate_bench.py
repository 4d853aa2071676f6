"""Generation throughput: mlxgraph against mlx-lm and transformers, on the same weights.

    python benchmarks/generate_bench.py [--sizes tiny,small] [--contexts 1024,4096] [--json]

For each size: a local Hugging Face Llama folder with seeded random weights (float32) is
built once (benchmarks/engines/make_hf_folder.py); mlxgraph exports it to a graph file;
then each engine generates greedily from the same 128-token prompt, 128 new tokens, EOS
ignored, each in its own process (benchmarks/engines/*_engine.py). Engines:
  mlxgraph            the Python API path (mlxgraph.load() preloads the BLAS itself)
  mlxgraph-cli        `mlxgraph generate --json`, one process per run
  mlxgraph-no-router  MLXGRAPH_BLAS_ROUTER=0: every product through sgemm
  mlxgraph-2-threads  MLXGRAPH_BLAS_THREADS=2 (the default is 1)
  mlxgraph-debian     Debian's OpenBLAS 0.3.21 instead of scipy-openblas32 (when installed)
  mlx-lm              as its users run it: the same OpenBLAS preloaded, no router
  transformers        torch eager, torch's own BLAS and threads
Then, for the last size, decode after a long prompt (--contexts, default 1k and 4k tokens,
32 new tokens), where attention's share of each token grows.
Printed: prefill and decode tok/s per engine, ratios mlxgraph/peer, whether the greedy
tokens are identical, and decode as a fraction of this machine's memory-bandwidth bound
(bandwidth measured in the same run with numpy; bound = bandwidth / bytes read per decoded
token: every weight except the embedding table, plus the KV cache at the average context).

This process imports neither torch nor mlx; it only orchestrates.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from generate_report import print_report

from mlxgraph.schema.format import format_version
from mlxgraph.tools.output import json_header_for

ROOT = Path(__file__).resolve().parent.parent
ENGINE_DIR = Path(__file__).resolve().parent / "engines"
SIZES = {
    "tiny": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=688,
        vocab_size=32000,
    ),
    "small": dict(
        hidden_size=1024,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=2816,
        vocab_size=32000,
    ),
}
COMMON = dict(
    max_position_embeddings=8192,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
MAX_SEQ_LEN = 4608  # the graph's context: the longest --contexts prompt plus its new tokens
# name -> (script, model kind, environment overrides). The first is "mlxgraph" itself.
ENGINES = {
    "mlxgraph": ("mlxgraph_engine.py", "graph", {}),
    "mlxgraph-cli": ("mlxgraph_cli_engine.py", "graph", {}),
    "mlxgraph-no-router": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS_ROUTER": "0"}),
    "mlxgraph-2-threads": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS_THREADS": "2"}),
    "mlxgraph-debian": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS": "libopenblas.so.0"}),
    "mlx-lm": ("mlx_lm_engine.py", "folder", {"MLXGRAPH_BLAS_ROUTER": "0"}),
    "transformers": ("transformers_engine.py", "folder", {}),
}
LONG_CONTEXT_ENGINES = ("mlxgraph", "mlxgraph-no-router", "mlx-lm", "transformers")


def measure_bandwidth(mib: int = 256, repeats: int = 5) -> dict:
    """Best-of-``repeats`` memory bandwidth in bytes/s: a copy (read + write bytes) and a
    read-only pass (a dot product of the two halves). ``bound`` is the larger."""
    a = np.ones(mib * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    half = a.size // 2

    def best(fn):
        t = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - t0)
        return t

    copy = 2 * a.nbytes / best(lambda: np.copyto(b, a))
    read = a.nbytes / best(lambda: np.dot(a[:half], a[half:]))
    return {"copy": copy, "read": read, "bound": max(copy, read)}


def bytes_per_token(cfg: dict, context: float, dtype_bytes: int = 4) -> float:
    """Bytes read to decode one token: all weights but the embedding table (one row), the
    LM head, and the K/V of ``context`` positions."""
    h, n, ffn, vocab = (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    )
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * ffn + 2 * h
    weights = n * per_layer + h + vocab * h + h  # layers, final norm, LM head, one embedding row
    cache = n * 2 * kv * context
    return (weights + cache) * dtype_bytes


def _run(cmd, env=None, what="") -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"generate_bench: {what} failed (exit {proc.returncode})")
    return proc.stdout


def prepare(size: str, workdir: Path, log) -> tuple[Path, Path, dict, float]:
    """(HF folder, graph file, config, export seconds) for one size."""
    cfg = {**SIZES[size], **COMMON}
    folder = workdir / f"hf-{size}"
    _run(
        [
            sys.executable,
            str(ENGINE_DIR / "make_hf_folder.py"),
            str(folder),
            "--config",
            json.dumps(cfg),
        ],
        what=f"building the {size} folder",
    )
    graph = workdir / f"{size}.mlxg"
    log(f"[{size}] exporting {folder} -> {graph}")
    t0 = time.perf_counter()
    _run(
        [
            sys.executable,
            "-c",
            "import sys; from mlxgraph.exporter import export; "
            f"export(sys.argv[1], sys.argv[2], dtype='float32', max_seq_len={MAX_SEQ_LEN})",
            str(folder),
            str(graph),
        ],
        what=f"exporting {size}",
    )
    return folder, graph, cfg, time.perf_counter() - t0


def available_engines() -> list:
    """The engine names to run here (mlxgraph-debian only where Debian's OpenBLAS is installed)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import ctypes; ctypes.CDLL('libopenblas.so.0')"],
        capture_output=True,
    )
    return [e for e in ENGINES if e != "mlxgraph-debian" or probe.returncode == 0]


def run_engine(
    engine: str, folder: Path, graph: Path, prompt: list, new_tokens: int, runs: int, log
) -> dict:
    """One engine in its own process; returns its result document."""
    script, kind, overrides = ENGINES[engine]
    model = graph if kind == "graph" else folder
    log(f"  [{model.name}] {engine} ...")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **overrides)
    out = _run(
        [
            sys.executable,
            str(ENGINE_DIR / script),
            "--model",
            str(model),
            "--prompt-ids",
            ",".join(map(str, prompt)),
            "--new-tokens",
            str(new_tokens),
            "--runs",
            str(runs),
        ],
        env=env,
        what=f"engine {engine}",
    )
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def agreement(a: list, b: list) -> str:
    """'identical' or where two token lists first differ."""
    if a == b:
        return "identical"
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"differ from token {i}"


def _merge(old, new) -> dict:
    """Combine two result documents of one engine: best figures, all medians, token agreement."""
    if old is None:
        new["decode_tps_medians"] = [new["decode_tps_median"]]
        return new
    out = dict(old)
    for key in ("prefill_tps", "decode_tps"):
        out[key] = max(old[key], new[key])
    out["decode_tps_medians"] = old["decode_tps_medians"] + [new["decode_tps_median"]]
    out["decode_tps_median"] = sorted(out["decode_tps_medians"])[
        len(out["decode_tps_medians"]) // 2
    ]
    out["runs_agree"] = old["runs_agree"] and new["runs_agree"] and old["tokens"] == new["tokens"]
    out["peak_rss_bytes"] = max(old["peak_rss_bytes"], new["peak_rss_bytes"])
    return out


def _report(cfg, engines: dict, context: float, bandwidth: dict) -> dict:
    """Fractions of the bound, ratios of mlxgraph to every other engine, token agreement."""
    per_token = bytes_per_token(cfg, context)
    bound = bandwidth["bound"] / per_token
    for r in engines.values():
        r["decode_fraction_of_bound"] = r["decode_tps"] / bound
    ours = engines["mlxgraph"]
    peers = [e for e in engines if e != "mlxgraph"]
    return {
        "bytes_per_token": per_token,
        "decode_bound_tps": bound,
        "engines": engines,
        "ratios": {
            peer: {
                "prefill": ours["prefill_tps"] / engines[peer]["prefill_tps"],
                "decode": ours["decode_tps"] / engines[peer]["decode_tps"],
            }
            for peer in peers
        },
        "greedy_tokens": {
            peer: agreement(ours["tokens"], engines[peer]["tokens"]) for peer in peers
        },
        "runs_agree": all(r["runs_agree"] for r in engines.values()),
    }


def _prompt(n: int, vocab: int, seed: int = 1234) -> list:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def bench_size(
    size, workdir, prompt_len, new_tokens, runs, rounds, bandwidth, engines, log
) -> dict:
    """Build, export and run every engine for one size; returns its report."""
    folder, graph, cfg, export_s = prepare(size, workdir, log)
    prompt = _prompt(prompt_len, cfg["vocab_size"])
    results = {}
    # Engines take turns, round after round, so that a busy spell on the shared machine does
    # not fall on one engine only; each engine's best run over all rounds counts.
    for _ in range(rounds):
        for engine in engines:
            r = run_engine(engine, folder, graph, prompt, new_tokens, runs, log)
            results[engine] = _merge(results.get(engine), r)
    report = _report(cfg, results, prompt_len + new_tokens / 2, bandwidth)
    return {
        "size": size,
        "config": cfg,
        "export_seconds": export_s,
        **report,
        "folder": str(folder),
        "graph": str(graph),
    }


def bench_contexts(size_report, contexts, new_tokens, bandwidth, log) -> list:
    """Decode after long prompts (one run each, engines taking turns once)."""
    cfg, out = size_report["config"], []
    for ctx in contexts:
        prompt = _prompt(ctx, cfg["vocab_size"], seed=ctx)
        results = {
            e: _merge(
                None,
                run_engine(
                    e,
                    Path(size_report["folder"]),
                    Path(size_report["graph"]),
                    prompt,
                    new_tokens,
                    1,
                    log,
                ),
            )
            for e in LONG_CONTEXT_ENGINES
        }
        out.append(
            {
                "context": ctx,
                "new_tokens": new_tokens,
                **_report(cfg, results, ctx + new_tokens / 2, bandwidth),
            }
        )
    return out


def main(argv=None) -> int:
    """Run the benchmark; prints the table (or --json)."""
    ap = argparse.ArgumentParser(description="mlxgraph generate vs mlx-lm vs transformers")
    ap.add_argument("--sizes", default="tiny,small", help="comma-separated: " + ",".join(SIZES))
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2, help="measured runs per engine process")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="engine processes per engine, taking turns (the best run of all is reported)",
    )
    ap.add_argument(
        "--contexts",
        default="1024,4096",
        help="prompt lengths for the long-context decode runs, on the last size ('' = none)",
    )
    ap.add_argument("--context-new-tokens", type=int, default=32)
    ap.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated: " + ",".join(ENGINES)
    )
    ap.add_argument("--workdir", default=str(ROOT / "out" / "bench"))
    ap.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the table"
    )
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        print(
            f"generate_bench: unknown size {unknown[0]!r}; choose from {', '.join(SIZES)}",
            file=sys.stderr,
        )
        return 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    log("measuring memory bandwidth ...")
    bandwidth = measure_bandwidth()
    contexts = [int(c) for c in args.contexts.split(",") if c]
    if max(contexts, default=0) + args.context_new_tokens > MAX_SEQ_LEN:
        print(
            f"generate_bench: contexts must leave room for the new tokens within {MAX_SEQ_LEN}",
            file=sys.stderr,
        )
        return 2
    wanted = [e for e in args.engines.split(",") if e]
    engines = ["mlxgraph"] + [e for e in available_engines() if e in wanted and e != "mlxgraph"]
    reports = [
        bench_size(
            s,
            workdir,
            args.prompt_tokens,
            args.new_tokens,
            args.runs,
            args.rounds,
            bandwidth,
            engines,
            log,
        )
        for s in sizes
    ]
    long_context = (
        bench_contexts(reports[-1], contexts, args.context_new_tokens, bandwidth, log)
        if reports
        else []
    )
    doc = {
        **json_header_for(format_version()),
        "benchmark": "generate",
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "runs": args.runs,
        "rounds": args.rounds,
        "bandwidth": bandwidth,
        "cpus": os.cpu_count(),
        "load_average": [load_before, os.getloadavg()[0]],
        "sizes": reports,
        "long_context": {"size": sizes[-1] if sizes else None, "runs": long_context},
    }
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
