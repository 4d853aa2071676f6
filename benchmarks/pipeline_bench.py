"""Pipeline-parallel generation on this machine: 1, 2 and 3 local ranks against one process.

    python benchmarks/pipeline_bench.py [--size small] [--ranks 1,2,3] [--json]

The generate benchmark's model of that size (a Hugging Face Llama folder with seeded random
weights, exported to float32) generates greedily from a 128-token prompt, 64 new tokens,
EOS ignored: once as one ordinary process (`mlxgraph generate`, the peer), then with
`--pipeline` on N ranks started by `mlx.launch` over the loopback ring (1 rank: the pipeline
code path without a launcher). Runs take turns, round after round; each configuration's
best run counts. Printed per configuration: the weight bytes and peak MLX memory of every
rank, prefill and decode tok/s, decode as a ratio of the one-process run, and whether the
greedy tokens are the one-process run's.

All ranks share this machine's cores, and a single sequence keeps only one stage busy at a
time: on one machine the figures show the pipeline's overhead (a transfer and an agreement
per step), not a speed-up. A pipeline is for a model that does not fit one machine.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from generate_bench import _prompt, prepare
from generate_figures import SIZES

from mlxgraph.tools.local_ranks import run_local_ranks
from mlxgraph.tools.output import human_bytes

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 900  # seconds one configuration's launch may take


def _generate_cmd(graph, prompt, new_tokens) -> list:
    return [sys.executable, "-m", "mlxgraph.tools", "generate", str(graph), "--prompt-ids",
            ",".join(map(str, prompt)), "--max-tokens", str(new_tokens), "--ignore-eos",
            "--json"]


def run_config(ranks, graph, prompt, new_tokens) -> dict:
    """One run: ranks 0 = the ordinary one-process command; else --pipeline on that many."""
    cmd = _generate_cmd(graph, prompt, new_tokens)
    if ranks == 0:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE)
        text, err = out.stdout, out.stderr
    elif ranks == 1:
        out = subprocess.run([*cmd, "--pipeline"], capture_output=True, text=True,
                             timeout=DEADLINE)
        text, err = out.stdout, out.stderr
    else:
        run = run_local_ranks(ranks, [*cmd, "--pipeline"], DEADLINE)
        text, err = run.stdout, run.stderr
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        raise SystemExit(f"pipeline_bench: {ranks} rank(s) failed:\n{err[-3000:]}") from None
    s = doc["stats"]
    pipe = doc.get("pipeline") or {"weight_bytes": [], "peak_memory_bytes": []}
    return {"prefill_tps": s["prefill_tokens_per_second"],
            "decode_tps": s["decode_tokens_per_second"], "tokens": doc["token_ids"],
            "weight_bytes": pipe["weight_bytes"] or [None],
            "peak_memory_bytes": pipe["peak_memory_bytes"] or [s["peak_memory_bytes"]]}


def _best(a, b) -> dict:
    if a is None:
        return b
    return {**a, "prefill_tps": max(a["prefill_tps"], b["prefill_tps"]),
            "decode_tps": max(a["decode_tps"], b["decode_tps"])}


def print_report(doc) -> None:
    """The table (from the --json document)."""
    cfg = doc["config"]
    print(f"pipeline_bench: {doc['size']} model ({cfg['num_hidden_layers']} layers, hidden "
          f"{cfg['hidden_size']}), {doc['prompt_tokens']}-token prompt, {doc['new_tokens']} "
          f"new tokens, {doc['cores']} cores, load {doc['load_average']:.1f}")
    print(f"{'ranks':<10} {'weights per rank':<34} {'peak MLX per rank':<34} "
          f"{'prefill':>9} {'decode':>9} {'vs 1':>6} same")
    for r in doc["rows"]:
        w = ", ".join(human_bytes(b) if b else "all" for b in r["weight_bytes"])
        m = ", ".join(human_bytes(b) for b in r["peak_memory_bytes"])
        print(f"{r['ranks']!s:<10} {w:<34} {m:<34} {r['prefill_tps']:9.1f} "
              f"{r['decode_tps']:9.1f} {r['decode_ratio']:6.2f} {r['same_tokens']}")
    print(f"All ranks share this machine's {doc['cores']} cores and one sequence keeps one "
          "stage busy at a time: these figures show the pipeline's overhead, not a speed-up.")


def main(argv=None) -> int:
    """Run the benchmark; prints the table (or --json)."""
    ap = argparse.ArgumentParser(description="pipeline-parallel generate on local ranks")
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--ranks", default="1,2,3", help="comma-separated rank counts")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default=str(ROOT / "out" / "bench"))
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    _, graph, cfg, _ = prepare(args.size, workdir, log)
    prompt = _prompt(args.prompt_tokens, cfg["vocab_size"])
    configs = [0, *[int(r) for r in args.ranks.split(",") if r]]
    results = {}
    for _ in range(args.rounds):
        for ranks in configs:
            log(f"  {ranks or 'one process'} rank(s) ...")
            results[ranks] = _best(results.get(ranks),
                                   run_config(ranks, graph, prompt, args.new_tokens))
    base = results[0]
    rows = [{"ranks": r or "1 (plain)", **{k: v for k, v in res.items() if k != "tokens"},
             "decode_ratio": res["decode_tps"] / base["decode_tps"],
             "same_tokens": res["tokens"] == base["tokens"]} for r, res in results.items()]
    doc = {"size": args.size, "config": cfg, "cores": os.cpu_count(),
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
           "load_average": os.getloadavg()[0], "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
