"""Serving throughput and latency: `mlxgraph serve` against `mlx_lm.server`, same folder, same
load, same run.

    python benchmarks/serve_bench.py [--clients 1,4,16] [--seconds 20] [--json]
    python benchmarks/serve_bench.py --features [--clients 4] [--seconds 20] [--json]

The model is generate_bench's `small` Llama (seeded random weights, float32) with a
word-level tokenizer of its 32000-token vocabulary added to the folder (both servers need
one; each word is one token, so both see the same ids), exported once for mlxgraph. Both
servers run at once, each in its own process (mlx_lm.server with the same OpenBLAS
preloaded and no router, as generate_bench runs mlx-lm); for each client count the two
take turns under the same load (benchmarks/serve_load.py): every client streams greedy
completions of fresh random prompts (--prompt-tokens, --max-tokens) one after another for
--seconds. Printed per client count and server: requests, aggregate completion tok/s, time
to first token and inter-token latency p50/p99, and the ratio mlxgraph/mlx-lm of tok/s;
and whether both servers' greedy texts for one prompt agree.
--features runs mlxgraph alone on the same model with a BPE tokenizer instead
(serve_features.py): JSON-schema-constrained against unconstrained throughput, and n=4 in
one request against four requests.
This process imports neither torch nor mlx.
"""

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from generate_bench import prepare
from generate_figures import SIZES
from serve_features import add_bpe_tokenizer, print_features, run_features
from serve_load import run_load, stream_once, words_prompt

ROOT = Path(__file__).resolve().parent.parent
MLX_LM_LAUNCH = (
    "import sys; from mlxgraph.interpreter.native.blas import preload_blas; preload_blas(); "
    "from mlx_lm.server import main; sys.argv = ['mlx_lm.server', *sys.argv[1:]]; main()"
)


def add_word_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer.json over the whole vocabulary (<unk>, <s>, </s>, w3, w4, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlxgraph(graph: Path, log_path: Path):
    """`mlxgraph serve` on a free port (it prints the address to its log); (process, url)."""
    proc = subprocess.Popen([sys.executable, "-m", "mlxgraph", "serve", str(graph), "--port", "0",
                             "--log-level", "warning"], stderr=open(log_path, "w"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        m = re.search(r"http://\S+", log_path.read_text())
        if m:
            return proc, m.group()
        if proc.poll() is not None:
            raise SystemExit(f"serve_bench: mlxgraph serve exited; see {log_path}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("serve_bench: mlxgraph serve did not start")


def start_mlx_lm(folder: Path, log_path: Path):
    """mlx_lm.server on a free port, waiting until /health answers; returns (process, url)."""
    port = free_port()
    env = dict(os.environ, MLXGRAPH_BLAS_ROUTER="0", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, "-c", MLX_LM_LAUNCH, "--model", str(folder),
                             "--port", str(port), "--log-level", "WARNING"],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve_bench: mlx_lm.server exited; see {log_path}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("serve_bench: mlx_lm.server did not start")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def print_report(doc) -> None:
    """The table: per client count, both servers and the ratio."""
    print(f"serve_bench: {doc['size']} Llama, {doc['prompt_tokens']}-token prompts, "
          f"{doc['max_tokens']} new tokens, greedy, {doc['seconds']} s per run; "
          f"same greedy text: {doc['same_text']}")
    head = (f"{'clients':>7} {'server':<10} {'reqs':>5} {'tok/s':>8} {'TTFT p50':>9} "
            f"{'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}")
    print(head)
    for row in doc["runs"]:
        for name in ("mlxgraph", "mlx-lm"):
            r = row[name]
            if not r.get("requests"):
                print(f"{row['clients']:>7} {name:<10} failed: {r.get('errors')}")
                continue
            print(f"{row['clients']:>7} {name:<10} {r['requests']:>5} {r['tok_per_s']:>8.1f} "
                  f"{r['ttft_ms_p50']:>7.0f}ms {r['ttft_ms_p99']:>7.0f}ms "
                  f"{r['itl_ms_p50']:>6.1f}ms {r['itl_ms_p99']:>6.1f}ms")
        if row.get("ratio"):
            print(f"{row['clients']:>7} mlxgraph/mlx-lm tok/s: {row['ratio']:.2f}x")
    print(f"load average {doc['load_before']:.1f} before, {doc['load_after']:.1f} after "
          "(the machine is shared: compare within a run)")


def main(argv=None) -> int:
    """Run the benchmark; prints the table (or --json)."""
    ap = argparse.ArgumentParser(description="mlxgraph serve vs mlx_lm.server")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=20.0, help="load time per run")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--workdir", default=str(ROOT / "out" / "serve-bench"))
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--features", action="store_true",
                    help="constrained vs plain and n=4 vs 4 requests, mlxgraph alone")
    args = ap.parse_args(argv)
    if args.features:
        return features(args)
    clients = [int(c) for c in args.clients.split(",") if c]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    vocab = SIZES[args.size]["vocab_size"]
    folder, graph, _, _ = prepare(args.size, workdir, log,
                                  extend=lambda f: add_word_tokenizer(f, vocab))
    doc = {"size": args.size, "prompt_tokens": args.prompt_tokens, "seconds": args.seconds,
           "max_tokens": args.max_tokens, "load_before": os.getloadavg()[0], "runs": []}
    log("starting both servers ...")
    servers = {"mlxgraph": start_mlxgraph(graph, workdir / "mlxgraph-serve.log"),
               "mlx-lm": start_mlx_lm(folder, workdir / "mlx-lm-server.log")}
    try:
        prompt = words_prompt(args.prompt_tokens, vocab, random.Random(7))
        texts = {}
        for name, (_, url) in servers.items():  # warm-up, and the agreement check
            with httpx.Client(timeout=600) as client:
                texts[name] = stream_once(client, url, prompt, args.max_tokens)["text"]
        doc["same_text"] = texts["mlxgraph"].strip() == texts["mlx-lm"].strip()
        for n in clients:
            row = {"clients": n}
            for name, (_, url) in servers.items():
                log(f"[{n} clients] {name} for {args.seconds:.0f} s ...")
                row[name] = run_load(url, n, args.seconds, args.prompt_tokens,
                                     args.max_tokens, vocab, seed=n)
            a, b = row["mlxgraph"].get("tok_per_s"), row["mlx-lm"].get("tok_per_s")
            row["ratio"] = a / b if a and b else None
            doc["runs"].append(row)
    finally:
        for proc, _ in servers.values():
            stop(proc)
    doc["load_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_report(doc)
    return 0


def features(args) -> int:
    """--features: mlxgraph alone, on the model with a BPE tokenizer."""
    workdir = Path(args.workdir) / "features"
    workdir.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    vocab = SIZES[args.size]["vocab_size"]
    _, graph, _, _ = prepare(args.size, workdir, log,
                             extend=lambda f: add_bpe_tokenizer(f, vocab))
    proc, url = start_mlxgraph(graph, workdir / "mlxgraph-serve.log")
    try:
        clients = int(args.clients.split(",")[0])
        doc = run_features(url, clients, args.seconds, args.max_tokens,
                           "Structured output from a tiny server:")
    finally:
        stop(proc)
    doc = {"size": args.size, "clients": clients, "seconds": args.seconds,
           "max_tokens": args.max_tokens, "runs": doc, "load": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_features(doc["runs"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
