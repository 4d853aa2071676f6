"""Generation throughput: mlxgraph against mlx-lm and transformers, on the same weights.

    python benchmarks/generate_bench.py [--sizes tiny,small] [--runs 3] [--json]

For each size: a local Hugging Face Llama folder with seeded random weights (float32) is
built once (benchmarks/engines/make_hf_folder.py); mlxgraph exports it to a graph file;
then each engine generates greedily from the same 128-token prompt, 128 new tokens, EOS
ignored, each in its own process (benchmarks/engines/*_engine.py): mlxgraph and mlx-lm
with the same BLAS preload (interpreter/blas.py; MLXGRAPH_BLAS is passed through),
transformers with torch's own. Printed: prefill and decode tok/s per engine, the ratios
mlxgraph/peer, whether the greedy tokens are identical, and decode as a fraction of
this machine's memory-bandwidth bound (bandwidth measured in the same run with numpy;
bound = bandwidth / bytes read per decoded token: every weight except the embedding
table, plus the KV cache at the average context).

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

from mlxgraph.schema.format import format_version
from mlxgraph.tools.output import json_header_for

ROOT = Path(__file__).resolve().parent.parent
ENGINES = Path(__file__).resolve().parent / "engines"
SIZES = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=688, vocab_size=32000),
    "small": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, intermediate_size=2816, vocab_size=32000),
}
COMMON = dict(max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
ENGINE_ORDER = ("mlxgraph", "mlx-lm", "transformers")
ENGINE_SCRIPTS = {"mlxgraph": "mlxgraph_engine.py", "mlx-lm": "mlx_lm_engine.py",
                  "transformers": "transformers_engine.py"}


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
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    ffn, vocab = cfg["intermediate_size"], cfg["vocab_size"]
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
    _run([sys.executable, str(ENGINES / "make_hf_folder.py"), str(folder),
          "--config", json.dumps(cfg)], what=f"building the {size} folder")
    graph = workdir / f"{size}.mlxg"
    log(f"[{size}] exporting {folder} -> {graph}")
    t0 = time.perf_counter()
    _run([sys.executable, "-c",
          "import sys; from mlxgraph.exporter import export; "
          "export(sys.argv[1], sys.argv[2], dtype='float32', max_seq_len=1024)",
          str(folder), str(graph)],
         what=f"exporting {size}")
    return folder, graph, cfg, time.perf_counter() - t0


def run_engine(engine: str, model: Path, prompt: list, new_tokens: int, runs: int, log) -> dict:
    """One engine in its own process; returns its result document."""
    log(f"  [{model.name}] {engine} ...")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = _run([sys.executable, str(ENGINES / ENGINE_SCRIPTS[engine]), "--model", str(model),
                "--prompt-ids", ",".join(map(str, prompt)), "--new-tokens", str(new_tokens),
                "--runs", str(runs)], env=env, what=f"engine {engine}")
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


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
    medians = sorted(out["decode_tps_medians"])
    out["decode_tps_median"] = medians[len(medians) // 2]
    out["runs_agree"] = old["runs_agree"] and new["runs_agree"] and old["tokens"] == new["tokens"]
    out["peak_rss_bytes"] = max(old["peak_rss_bytes"], new["peak_rss_bytes"])
    return out


def bench_size(size, workdir, prompt_len, new_tokens, runs, rounds, bandwidth, log) -> dict:
    """Build, export and run the three engines for one size; returns its report."""
    folder, graph, cfg, export_s = prepare(size, workdir, log)
    prompt = [random.Random(1234).randrange(3, cfg["vocab_size"]) for _ in range(prompt_len)]
    results = {}
    # Engines take turns, round after round, so that a busy spell on the shared machine
    # does not fall on one engine only; each engine's best run over all rounds counts.
    for _ in range(rounds):
        for engine in ENGINE_ORDER:
            source = graph if engine == "mlxgraph" else folder
            r = run_engine(engine, source, prompt, new_tokens, runs, log)
            results[engine] = _merge(results.get(engine), r)
    per_token = bytes_per_token(cfg, prompt_len + new_tokens / 2)
    bound = bandwidth["bound"] / per_token
    for r in results.values():
        r["decode_fraction_of_bound"] = r["decode_tps"] / bound
    ours = results["mlxgraph"]
    return {
        "size": size, "config": cfg, "export_seconds": export_s,
        "bytes_per_token": per_token, "decode_bound_tps": bound,
        "engines": results,
        "ratios": {peer: {"prefill": ours["prefill_tps"] / results[peer]["prefill_tps"],
                          "decode": ours["decode_tps"] / results[peer]["decode_tps"]}
                   for peer in ENGINE_ORDER[1:]},
        "greedy_tokens": {peer: agreement(ours["tokens"], results[peer]["tokens"])
                          for peer in ENGINE_ORDER[1:]},
        "runs_agree": all(r["runs_agree"] for r in results.values()),
    }


def print_report(doc: dict) -> None:
    """The human-readable table."""
    bw = doc["bandwidth"]
    print(f"\ngenerate bench: float32, prompt {doc['prompt_tokens']}, "
          f"{doc['new_tokens']} new tokens, greedy, "
          f"EOS ignored; each engine in its own process, {doc['rounds']} rounds taking turns x "
          f"{doc['runs']} runs "
          f"after a warm-up: best run (median in brackets)")
    print(f"memory bandwidth: copy {bw['copy'] / 1e9:.1f} GB/s, read {bw['read'] / 1e9:.1f} GB/s "
          f"(bound uses {bw['bound'] / 1e9:.1f} GB/s); {doc['cpus']} CPUs, load average "
          f"{doc['load_average'][0]:.1f} at the start, {doc['load_average'][1]:.1f} at the end")
    for rep in doc["sizes"]:
        c = rep["config"]
        print(f"\n{rep['size']}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, heads "
              f"{c['num_attention_heads']}/{c['num_key_value_heads']}, vocab {c['vocab_size']}; "
              f"{rep['bytes_per_token'] / 2**20:.1f} MiB read per token -> bound "
              f"{rep['decode_bound_tps']:.0f} tok/s; "
              f"export {rep['export_seconds']:.1f} s")
        print(f"  {'engine':<13}{'prefill tok/s':>14}{'decode tok/s':>14}"
              f"{'(median)':>10}{'of bound':>10}"
              f"{'peak RSS':>10}  BLAS")
        for name, r in rep["engines"].items():
            print(f"  {name:<13}{r['prefill_tps']:>14.1f}{r['decode_tps']:>14.1f}"
                  f"{r['decode_tps_median']:>10.1f}"
                  f"{r['decode_fraction_of_bound']:>10.0%}{r['peak_rss_bytes'] / 2**20:>8.0f}Mi  "
                  f"{r['blas']}")
        for peer, q in rep["ratios"].items():
            print(f"  mlxgraph/{peer:<13} prefill {q['prefill']:.2f}x  decode {q['decode']:.2f}x  "
                  f"greedy tokens {rep['greedy_tokens'][peer]}")


def main(argv=None) -> int:
    """Run the benchmark; prints the table (or --json)."""
    ap = argparse.ArgumentParser(description="mlxgraph generate vs mlx-lm vs transformers")
    ap.add_argument("--sizes", default="tiny,small", help="comma-separated: " + ",".join(SIZES))
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2, help="measured runs per engine process")
    ap.add_argument("--rounds", type=int, default=2,
                    help="engine processes per engine, taking turns "
                         "(the best run of all is reported)")
    ap.add_argument("--workdir", default=str(ROOT / "out" / "bench"))
    ap.add_argument("--json", action="store_true",
                    help="print one JSON document instead of the table")
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        print(f"generate_bench: unknown size {unknown[0]!r}; choose from {', '.join(SIZES)}",
              file=sys.stderr)
        return 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    load_before = os.getloadavg()[0]
    log("measuring memory bandwidth ...")
    bandwidth = measure_bandwidth()
    reports = [bench_size(s, workdir, args.prompt_tokens, args.new_tokens, args.runs, args.rounds,
                          bandwidth, log) for s in sizes]
    doc = {**json_header_for(format_version()), "benchmark": "generate",
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
           "runs": args.runs, "rounds": args.rounds, "bandwidth": bandwidth, "cpus": os.cpu_count(),
           "load_average": [load_before, os.getloadavg()[0]], "sizes": reports}
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
