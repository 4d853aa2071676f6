"""Batched decode: many sequences per step against one after another, and against mlx-lm.

    python benchmarks/batch_bench.py [--size small] [--batches 1,2,4,8,16,32] [--json]

On the generate benchmark's model (a local Llama folder with seeded random weights, float32,
exported once; both reused from --workdir when present), each engine runs in its own
process (benchmarks/engines/batch_engine.py): B sequences with their own 64-token prompts
are prefilled, then 32 greedy decode steps are timed.
  mlxgraph batched     Program.step_batch over all B rows per step
  mlxgraph sequential  the same B sessions stepped one after another
  mlx-lm               BatchGenerator (completion and prefill batch B), as mlx_lm.server batches
Printed per B: aggregate decode tok/s, per-row latency (ms per step), the ratios batched /
sequential, batched / mlx-lm, and aggregate against single-stream (B = 1), and how many rows'
greedy tokens are identical batched and sequential.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from generate_bench import ENGINE_DIR, ROOT, prepare

from mlxgraph.schema.format import format_version
from mlxgraph.tools.output import json_header_for


def _engine(engine, model, args, log) -> dict:
    log(f"running {engine} ...")
    cmd = [sys.executable, str(ENGINE_DIR / "batch_engine.py"), "--engine", engine, "--model",
           str(model), "--batches", args.batches, "--new-tokens", str(args.new_tokens),
           "--prompt-tokens", str(args.prompt_tokens), "--runs", str(args.runs)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"batch_bench: {engine} failed (exit {proc.returncode})")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def print_report(doc) -> None:
    """The table (from the --json document)."""
    ours = {r["batch"]: r for r in doc["mlxgraph"]["rows"]}
    peer = {r["batch"]: r for r in doc.get("mlx-lm", {}).get("rows", [])}
    single = ours[min(ours)]["batched"]["tok_s"]
    print(f"batched decode, {doc['size']} model, {doc['new_tokens']} steps after "
          f"{doc['prompt_tokens']}-token prompts; load {doc['load_average'][0]:.1f} -> "
          f"{doc['load_average'][1]:.1f}")
    print(f"{'B':>3} {'batched':>9} {'ms/step':>8} {'seq':>8} {'x seq':>6} {'mlx-lm':>8} "
          f"{'x mlx-lm':>8} {'x B=1':>6} {'same rows':>9}")
    for b, r in sorted(ours.items()):
        got, seq = r["batched"], r["sequential"]
        p = peer.get(b, {}).get("batched")
        print(f"{b:>3} {got['tok_s']:>9.1f} {got['step_ms']:>8.1f} {seq['tok_s']:>8.1f} "
              f"{got['tok_s'] / seq['tok_s']:>6.2f} "
              f"{p['tok_s'] if p else float('nan'):>8.1f} "
              f"{got['tok_s'] / p['tok_s'] if p else float('nan'):>8.2f} "
              f"{got['tok_s'] / single:>6.2f} {r['identical_rows']:>4}/{b}")


def main(argv=None) -> int:
    """Run the benchmark; prints the table (or --json)."""
    ap = argparse.ArgumentParser(description="batched decode: mlxgraph vs sequential vs mlx-lm")
    ap.add_argument("--size", default="small")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=2, help="measured runs per B (the best is kept)")
    ap.add_argument("--no-mlx-lm", action="store_true", help="skip the mlx-lm peer")
    ap.add_argument("--workdir", default=str(ROOT / "out" / "bench"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    folder, graph = workdir / f"hf-{args.size}", workdir / f"{args.size}.mlxg"
    if not (graph.exists() and (folder / "config.json").exists()):
        folder, graph, _, _ = prepare(args.size, workdir, log)
    else:
        log(f"reusing {folder} and {graph}")
    doc = {**json_header_for(format_version()), "benchmark": "batch", "size": args.size,
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
           "cpus": os.cpu_count(), "load_average": [os.getloadavg()[0], None]}
    doc["mlxgraph"] = _engine("mlxgraph", graph, args, log)
    if not args.no_mlx_lm:
        doc["mlx-lm"] = _engine("mlx-lm", folder, args, log)
    doc["load_average"][1] = os.getloadavg()[0]
    (workdir / "batch_bench.json").write_text(json.dumps(doc, indent=1))
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
