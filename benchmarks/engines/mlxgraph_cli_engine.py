"""Benchmark process: greedy generation by the command line, `mlxgraph generate --json`.

    python benchmarks/engines/mlxgraph_cli_engine.py --model G.mlxg --prompt-ids 1,2,3

Each run is one `mlxgraph generate` process, as a user runs it (a warm-up run first, so
the file is in the page cache as for the other engines); the figures are the CLI's own
stats (the same prefill/decode definitions as the other engines' harness).
"""

import json
import subprocess
import sys

from common import WARMUP_PROMPT, emit, parse_args, summarise


def _generate(model, prompt, n) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "mlxgraph.tools",
        "generate",
        model,
        "--prompt-ids",
        ",".join(map(str, prompt)),
        "--max-tokens",
        str(n),
        "--ignore-eos",
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"mlxgraph generate failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    _generate(args.model, args.prompt[:WARMUP_PROMPT], args.warmup_tokens)
    docs = [_generate(args.model, args.prompt, args.new_tokens) for _ in range(args.runs)]
    figs = [
        {
            "prefill_tps": d["stats"]["prefill_tokens_per_second"],
            "decode_tps": d["stats"]["decode_tokens_per_second"],
        }
        for d in docs
    ]
    doc = summarise(
        figs, [d["token_ids"] for d in docs], max(d["stats"]["peak_rss_bytes"] for d in docs)
    )
    blas = docs[0]["stats"]["blas"]
    doc.update(
        engine="mlxgraph-cli",
        blas=f"{blas['name']} router {blas['router'] or '-'}",
        peak_mlx_bytes=max(d["stats"]["peak_memory_bytes"] for d in docs),
    )
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
