"""The generate benchmark's table (benchmarks/generate_bench.py builds the document)."""

from machine import describe


def _engine_rows(engines: dict) -> None:
    print(
        f"  {'engine':<20}{'prefill tok/s':>14}{'decode tok/s':>14}{'(median)':>10}{'of bound':>10}"
        f"{'peak RSS':>10}  BLAS"
    )
    for name, r in engines.items():
        print(
            f"  {name:<20}{r['prefill_tps']:>14.1f}{r['decode_tps']:>14.1f}"
            f"{r['decode_tps_median']:>10.1f}{r['decode_bytes_per_s'] / 1e9:>7.1f}"
            f"{r['decode_fraction_of_bound']:>10.0%}{r['peak_rss_bytes'] / 2**20:>8.0f}Mi  "
            f"{r['blas'].split('; /')[0]}"
        )


def _ratio_rows(rep: dict) -> None:
    for peer, q in rep["ratios"].items():
        print(
            f"  mlxgraph/{peer:<20} prefill {q['prefill']:5.2f}x  decode {q['decode']:5.2f}x  "
            f"greedy tokens {rep['greedy_tokens'][peer]}"
        )


def print_report(doc: dict) -> None:
    """Print the human-readable tables of one generate benchmark document."""
    bw = doc["bandwidth"]
    print(
        f"\ngenerate bench: float32, prompt {doc['prompt_tokens']}, "
        f"{doc['new_tokens']} new tokens, greedy, "
        f"EOS ignored; each engine in its own process, {doc['rounds']} rounds taking turns x "
        f"{doc['runs']} runs "
        f"after a warm-up: best run (median in brackets)"
    )
    print(f"machine: {describe(doc['machine'], bw)}; the bound uses {bw['bound'] / 1e9:.1f} GB/s")
    for rep in doc["sizes"]:
        c = rep["config"]
        print(
            f"\n{rep['size']}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, heads "
            f"{c['num_attention_heads']}/{c['num_key_value_heads']}, vocab {c['vocab_size']}; "
            f"{rep['bytes_per_token'] / 2**20:.1f} MiB read per token -> bound "
            f"{rep['decode_bound_tps']:.0f} tok/s; "
            f"export {rep['export_seconds']:.1f} s"
        )
        _engine_rows(rep["engines"])
        _ratio_rows(rep)
    long = doc.get("long_context") or {}
    for run in long.get("runs", []):
        print(
            f"\n{long['size']} after a {run['context']}-token prompt, {run['new_tokens']} new "
            "tokens, one run: "
            f"{run['bytes_per_token'] / 2**20:.1f} MiB read per token -> bound "
            f"{run['decode_bound_tps']:.0f} tok/s"
        )
        _engine_rows(run["engines"])
        _ratio_rows(run)
