"""The generate benchmark's models and figures: sizes, the decode bound, ratios, token
agreement (benchmarks/generate_bench.py; the bandwidth comes from benchmarks/machine.py)."""

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


def agreement(a: list, b: list) -> str:
    """'identical' or where two token lists first differ."""
    if a == b:
        return "identical"
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return f"differ from token {i}"


def merge(old, new) -> dict:
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


def report(cfg, engines: dict, context: float, bandwidth: dict) -> dict:
    """Fractions of the bound, ratios of mlxgraph to every other engine, token agreement."""
    per_token = bytes_per_token(cfg, context)
    bound = bandwidth["bound"] / per_token
    for r in engines.values():
        r["decode_fraction_of_bound"] = r["decode_tps"] / bound
        r["decode_bytes_per_s"] = r["decode_tps"] * per_token
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
