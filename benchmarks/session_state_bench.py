"""Session state figures: fork, save/restore, quantized KV (bytes per token, logits error).

    .venv/bin/python benchmarks/session_state_bench.py [--context 4096] [--json]

On the ~150M-parameter benchmark model ("small" of generate_bench.py: Llama, hidden 1024,
8 layers, 16 heads / 4 KV heads, vocab 32000, seeded random float32 weights, exported with
a 8192-token context), a session is prefilled with ``--context`` random tokens. Then:

- fork: the median time of ``session.fork()``, and of the first decode step after a fork
  (the one that copies the shared buffers) against a decode step on an unforked session;
  peer: a deep copy of every cache buffer (what a fork would cost without sharing).
- save/restore: ``session.save(path)`` and ``program.restore(path)`` (until the restored
  cache is evaluated); peer: recomputing the prefill.
- quantized KV, bits 8 and 4 (group size 64): bytes per cached token (from the saved
  file, which holds only live slots) against float32; over the 256 tokens float32 greedy
  decoding produces after a 1024-token prompt, the logits of each cache fed the same
  tokens: max abs error relative to the logits' range, and greedy (top-1) agreement.
"""

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import generate_bench as gb

from mlxgraph.schema.format import format_version
from mlxgraph.tools.output import json_header_for

WORKDIR = gb.ROOT / "out" / "bench"


def prepare(log) -> Path:
    """The small model's graph file with an 8192-token context (built once, reused)."""
    cfg = {**gb.SIZES["small"], **gb.COMMON, "max_position_embeddings": 8192}
    folder = WORKDIR / "hf-small-8k"
    gb._run(
        [
            sys.executable,
            str(gb.ENGINE_DIR / "make_hf_folder.py"),
            str(folder),
            "--config",
            json.dumps(cfg),
        ],
        what="building the small folder",
    )
    graph = WORKDIR / "small-8k.mlxg"
    if not graph.is_file() or graph.stat().st_mtime < (folder / "bench_stamp.json").stat().st_mtime:
        log(f"exporting {folder} -> {graph}")
        gb._run(
            [
                sys.executable,
                "-c",
                "import sys; from mlxgraph.exporter import export; "
                "export(sys.argv[1], sys.argv[2], dtype='float32', max_seq_len=8192)",
                str(folder),
                str(graph),
            ],
            what="exporting small",
        )
    return graph


def median_time(fn, reps: int) -> float:
    """Median seconds of ``reps`` calls of ``fn``."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prefill(session, ids, chunk=512):
    """Feed ``ids`` in chunks, evaluating the cache after each."""
    import mlx.core as mx

    for i in range(0, len(ids), chunk):
        piece = ids[i : i + chunk]
        session.step(
            mx.array([piece], dtype=mx.int32), range(session.length, session.length + len(piece))
        )
        mx.eval(session.cache_state())


def decode_step(session, token=1):
    """One evaluated single-token step."""
    import mlx.core as mx

    out = session.step(
        mx.array([[token]], dtype=mx.int32), range(session.length, session.length + 1)
    )
    mx.eval(out, *session.cache_state())


def fork_figures(program, session, reps) -> dict:
    """Fork time, the first step after a fork vs a plain step, and a full buffer copy."""
    import mlx.core as mx

    fork = median_time(session.fork, reps)
    copy_all = median_time(lambda: mx.eval([mx.array(a) + 0 for a in session.cache_state()]), reps)
    plain, after = [], []
    for _ in range(reps):
        twin = session.fork()
        t0 = time.perf_counter()
        decode_step(twin)  # copies the buffers it shares with `session`
        after.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        decode_step(twin)  # in place again
        plain.append(time.perf_counter() - t0)
    return {
        "fork_seconds": fork,
        "copy_all_buffers_seconds": copy_all,
        "first_step_after_fork_seconds": statistics.median(after),
        "decode_step_seconds": statistics.median(plain),
        "copy_over_fork": copy_all / fork,
    }


def save_restore_figures(program, session, prefill_seconds, reps) -> dict:
    """Save and restore times of ``session`` against its prefill time."""
    import mlx.core as mx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cache.safetensors"
        save = median_time(lambda: session.save(path), reps)
        size = path.stat().st_size

        def restore():
            mx.eval(program.restore(path).cache_state())

        load = median_time(restore, reps)
    return {
        "tokens": session.length,
        "file_bytes": size,
        "save_seconds": save,
        "restore_seconds": load,
        "prefill_seconds": prefill_seconds,
        "prefill_over_restore": prefill_seconds / load,
    }


def quantized_figures(program, prompt, new_tokens=256) -> dict:
    """Bytes per token, logits error and greedy agreement of 8- and 4-bit caches."""
    import mlx.core as mx
    import numpy as np

    ref = program.session(max_step=512)
    prefill(ref, prompt[:-1])
    greedy, token = [], prompt[-1]
    for _ in range(new_tokens):
        logits = ref.step(mx.array([[token]], dtype=mx.int32), range(ref.length, ref.length + 1))
        token = int(mx.argmax(logits[0, -1]).item())
        greedy.append(token)
    forced = [prompt[-1], *greedy[:-1]]  # the inputs that produced each greedy token
    out = {}
    for bits in (0, 8, 4):
        s = program.session(max_step=512, kv_bits=bits)
        prefill(s, prompt[:-1])
        logits = np.array(
            s.step(mx.array([forced], dtype=mx.int32), range(s.length, s.length + len(forced)))
        )[0]
        with tempfile.TemporaryDirectory() as tmp:
            size = s.save(Path(tmp) / "c.safetensors")
        if bits == 0:
            base = logits
        span = float(base.max() - base.min())
        out[str(bits or "float32")] = {
            "bytes_per_token": size / s.length,
            "logits_max_abs_error": float(np.abs(logits - base).max()),
            "logits_error_over_range": float(np.abs(logits - base).max()) / span,
            "greedy_agreement": float(np.mean(logits.argmax(-1) == np.array(greedy))),
        }
    f32 = out["float32"]["bytes_per_token"]
    for v in out.values():
        v["bytes_vs_float32"] = v["bytes_per_token"] / f32
    return out


def print_report(doc) -> None:
    """The figures as a table (from the --json document)."""
    fork, saved = doc["fork"], doc["save_restore"]
    print(f"model: {Path(doc['graph']).name} (~150M params, float32), context "
          f"{doc['context']} tokens, BLAS {doc['blas']}")
    print(f"fork          {fork['fork_seconds'] * 1e3:8.3f} ms   (copying every buffer: "
          f"{fork['copy_all_buffers_seconds'] * 1e3:.1f} ms, "
          f"{fork['copy_over_fork']:.0f}x the fork)")
    print(f"first decode step after a fork {fork['first_step_after_fork_seconds'] * 1e3:.1f} ms, "
          f"a decode step {fork['decode_step_seconds'] * 1e3:.1f} ms")
    print(f"save          {saved['save_seconds']:8.3f} s    "
          f"({saved['file_bytes'] / 2**20:.1f} MiB)")
    print(f"restore       {saved['restore_seconds']:8.3f} s    (prefill of the same tokens: "
          f"{saved['prefill_seconds']:.1f} s, {saved['prefill_over_restore']:.0f}x the restore)")
    print("KV storage    bytes/token  vs float32  logits max err / range  "
          "greedy agreement (256 tokens)")
    for name, q in doc["quantized_kv"].items():
        label = name if name == "float32" else f"{name}-bit"
        print(f"  {label:<10} {q['bytes_per_token']:10.0f}  {q['bytes_vs_float32']:9.3f}  "
              f"{q['logits_error_over_range']:20.4f}  {q['greedy_agreement'] * 100:14.1f} %")


def main(argv=None) -> int:
    """Run every figure; print a table or one JSON document."""
    ap = argparse.ArgumentParser(description="fork, save/restore and quantized KV figures")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    graph = prepare(log)
    from mlxgraph.interpreter.native.blas import preload_blas

    blas = preload_blas()
    import mlxgraph

    program = mlxgraph.load(graph)
    rng = random.Random(0)
    ids = [rng.randrange(3, 32000) for _ in range(args.context)]
    session = program.session(capacity=args.context + 256, max_step=512)
    t0 = time.perf_counter()
    prefill(session, ids)
    prefill_seconds = time.perf_counter() - t0
    log(f"prefilled {args.context} tokens in {prefill_seconds:.1f}s; fork ...")
    fork = fork_figures(program, session, args.reps)
    log("save/restore ...")
    saved = save_restore_figures(program, session, prefill_seconds, args.reps)
    log("quantized KV ...")
    quant = quantized_figures(program, ids[:1024])
    doc = {
        **json_header_for(format_version()),
        "graph": str(graph),
        "blas": blas.name,
        "context": args.context,
        "fork": fork,
        "save_restore": saved,
        "quantized_kv": quant,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
