"""Generation throughput: mlxgraph against mlx-lm and transformers, on the same weights.

    python benchmarks/generate_bench.py [--sizes tiny,small] [--contexts 1024,4096] [--json]

For each size: a local Hugging Face Llama folder with seeded random weights (float32) is
built once (benchmarks/engines/make_hf_folder.py); mlxgraph exports it to a graph file;
then each engine generates greedily from the same 128-token prompt, 128 new tokens, EOS
ignored, each in its own process (benchmarks/engines/*_engine.py). Engines:
  mlxgraph            the Python API path (mlxgraph.load() preloads the BLAS itself)
  mlxgraph-cli        `mlxgraph generate --json`, one process per run
  mlxgraph-no-router  MLXGRAPH_BLAS_ROUTER=0: every product through sgemm
  mlxgraph-no-tile    MLXGRAPH_BLAS_TILE=0: many-row products through the BLAS's sgemm, not
                      the router's blocked kernel (native/tile_gemm.c)
  mlxgraph-1-thread   MLXGRAPH_BLAS_THREADS=1 (the default, auto, gives products of
                      >= 1M multiply-adds every CPU, smaller ones 1 thread)
  mlxgraph-2-threads  MLXGRAPH_BLAS_THREADS=2: every product on 2 threads
  mlxgraph-mlx-silu   MLXGRAPH_NATIVE_ACTIVATIONS=0: MLX's own (one element at a time) SiLU
  mlxgraph-debian     Debian's OpenBLAS 0.3.21 instead of scipy-openblas32 (when installed)
  mlx-lm              as its users run it: imported as installed, MLX's own BLAS
  mlx-lm+openblas     labelled extra row: mlxgraph's OpenBLAS preloaded under it, no router
  transformers        torch eager, torch's defaults (its own BLAS and threads)
Then, for the last size, decode after a long prompt (--contexts, default 1k and 4k tokens,
32 new tokens), where attention's share of each token grows.
Printed: prefill and decode tok/s and GB/s per engine, ratios mlxgraph/peer, whether the
greedy tokens are identical, decode as a fraction of the bound (every core's read bandwidth,
measured in the same run / bytes per decoded token: every weight but the embedding table,
plus the K/V at the average context), the CPU and the load at start and end (machine.py).
Each finished part is saved to WORKDIR/generate_bench.json as it completes (a run cut short
keeps what it measured). This process imports neither torch nor mlx; it only orchestrates.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from generate_figures import COMMON, SIZES, merge, report
from generate_report import print_report
from machine import load_average, machine_facts, measure_bandwidth

from mlxgraph.schema.format import format_version
from mlxgraph.tools.output import json_header_for

ROOT = Path(__file__).resolve().parent.parent
ENGINE_DIR = Path(__file__).resolve().parent / "engines"
MAX_SEQ_LEN = 4608  # the graph's context: the longest --contexts prompt plus its new tokens
# name -> (script, model kind, environment overrides). The first is "mlxgraph" itself.
ENGINES = {
    "mlxgraph": ("mlxgraph_engine.py", "graph", {}),
    "mlxgraph-cli": ("mlxgraph_cli_engine.py", "graph", {}),
    "mlxgraph-no-router": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS_ROUTER": "0"}),
    "mlxgraph-no-tile": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS_TILE": "0"}),
    "mlxgraph-1-thread": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS_THREADS": "1"}),
    "mlxgraph-2-threads": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS_THREADS": "2"}),
    "mlxgraph-mlx-silu": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_NATIVE_ACTIVATIONS": "0"}),
    "mlxgraph-debian": ("mlxgraph_engine.py", "graph", {"MLXGRAPH_BLAS": "libopenblas.so.0"}),
    "mlx-lm": ("mlx_lm_engine.py", "folder", {}),
    "mlx-lm+openblas": ("mlx_lm_engine.py", "folder", {"BENCH_PRELOAD_BLAS": "1",
                                                       "MLXGRAPH_BLAS_ROUTER": "0"}),
    "transformers": ("transformers_engine.py", "folder", {}),
}
LONG_CONTEXT_ENGINES = ("mlxgraph", "mlxgraph-no-router", "mlx-lm", "transformers")


def _run(cmd, env=None, what="") -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"generate_bench: {what} failed (exit {proc.returncode})")
    return proc.stdout


def prepare(size: str, workdir: Path, log, extend=None) -> tuple[Path, Path, dict, float]:
    """(HF folder, graph file, config, export seconds) for one size; ``extend(folder)`` adds
    files to the folder before the export (serve_bench adds a tokenizer)."""
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
    if extend is not None:
        extend(folder)
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
            results[engine] = merge(results.get(engine), r)
    figures = report(cfg, results, prompt_len + new_tokens / 2, bandwidth)
    return {
        "size": size,
        "config": cfg,
        "export_seconds": export_s,
        **figures,
        "folder": str(folder),
        "graph": str(graph),
    }


def bench_contexts(size_report, contexts, new_tokens, bandwidth, log, on_result=None) -> list:
    """Decode after long prompts (one run each, engines taking turns once); ``on_result``
    is called with each context's report as it finishes."""
    cfg, out = size_report["config"], []
    for ctx in contexts:
        prompt = _prompt(ctx, cfg["vocab_size"], seed=ctx)
        results = {
            e: merge(
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
                **report(cfg, results, ctx + new_tokens / 2, bandwidth),
            }
        )
        if on_result is not None:
            on_result(out[-1])
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
    ap.add_argument("--json", action="store_true", help="one JSON document, not the table")
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

    facts = machine_facts()
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
    doc = {
        **json_header_for(format_version()),
        "benchmark": "generate",
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "runs": args.runs,
        "rounds": args.rounds,
        "bandwidth": bandwidth,
        "machine": facts,
        "sizes": [],
        "long_context": {"size": sizes[-1] if sizes else None, "runs": []},
    }
    # Each finished part is saved at once: a run cut short (a long one, on a busy machine)
    # still leaves its figures.
    partial = workdir / "generate_bench.json"

    def save():
        facts["load_end"] = load_average()
        partial.write_text(json.dumps(doc, indent=1))

    for s in sizes:
        doc["sizes"].append(bench_size(s, workdir, args.prompt_tokens, args.new_tokens,
                                       args.runs, args.rounds, bandwidth, engines, log))
        save()
        log(f"  (results so far in {partial})")
    if doc["sizes"]:
        runs = doc["long_context"]["runs"]
        bench_contexts(doc["sizes"][-1], contexts, args.context_new_tokens, bandwidth, log,
                       on_result=lambda r: (runs.append(r), save()))
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
