"""Decode-step cost of the KV cache: mlxgraph's flat store vs a naive cache vs mlx-lm.

    .venv/bin/python benchmarks/cache_bench.py [--json] [--dtype float32] [--reps 60]

For each context length the cache is prefilled, then each decode step writes one token's
k/v and attends one query over the whole history, evaluated. Every rep trims the token
back off, so the context stays fixed. Reported: the median per-step time of write+attend
and of the write alone (with the bytes it newly allocates: 0 means in place), the bytes
the cache holds per cached token, and the ratio of each
peer's time to the static flat store's (measured in the same run, round-robin, so that
drift hits every cache alike).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import mlx.core as mx

from mlxgraph.interpreter.attention import attend
from mlxgraph.interpreter.cache.kv_cache import CachePolicy, make_store
from mlxgraph.schema.format import format_version
from mlxgraph.schema.records import LayerCacheInfo
from mlxgraph.tools.output import json_header_for

CONTEXTS = (256, 1024, 4096, 8192)
B, HKV, HQ, D = 1, 8, 32, 64
SCALE = D**-0.5


class Cache:
    """What every compared cache does; one decode step is ``step`` then ``trim``."""

    name = ""

    def step(self, q, k, v) -> list:
        """Write one step's k/v and attend q over the history; returns the arrays to evaluate."""
        raise NotImplementedError

    def write(self, k, v) -> list:
        """Write only; returns the arrays to evaluate."""
        raise NotImplementedError

    def trim(self) -> None:
        """Drop the last token."""
        raise NotImplementedError

    def bytes_per_token(self) -> float:
        """Bytes held per cached token."""
        raise NotImplementedError


class Flat(Cache):
    """mlxgraph's store: staged write, commit, fused-mask attention."""

    def __init__(self, dtype, capacity: int, preallocate: bool):
        self.name = "flat-static" if preallocate else "flat-dynamic"
        policy = CachePolicy(capacity=capacity, kv_dtype=dtype, preallocate=preallocate)
        self.store = make_store(LayerCacheInfo(0, HKV, D, D, 0), policy)

    def step(self, q, k, v):
        out = attend(q, *self.store.update(k, v), SCALE, q.dtype)
        self.store.commit()
        return [out]

    def write(self, k, v):
        self.store.update(k, v)
        self.store.commit()
        return list(self.store.state)

    def trim(self):
        self.store.trim(1)

    def bytes_per_token(self):
        return self.store.bytes_per_token


class Naive(Cache):
    """Concatenate the new token onto the history every step (a copy of everything)."""

    name = "naive-concat"

    def __init__(self, dtype):
        self.keys = self.values = None

    def _append(self, k, v):
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = mx.concatenate([self.keys, k], axis=2)
            self.values = mx.concatenate([self.values, v], axis=2)

    def step(self, q, k, v):
        self._append(k, v)
        mask = "causal" if k.shape[2] > 1 else None
        return [
            mx.fast.scaled_dot_product_attention(q, self.keys, self.values, scale=SCALE, mask=mask)
        ]

    def write(self, k, v):
        self._append(k, v)
        return [self.keys, self.values]

    def trim(self):
        self.keys, self.values = self.keys[:, :, :-1], self.values[:, :, :-1]

    def bytes_per_token(self):
        return (self.keys.nbytes + self.values.nbytes) / self.keys.shape[2]


class MlxLm(Cache):
    """mlx-lm's KVCache (grows in 256-token chunks, writes in place)."""

    name = "mlx-lm KVCache"

    def __init__(self, dtype):
        from mlx_lm.models.cache import KVCache

        self.cache = KVCache()

    def step(self, q, k, v):
        keys, values = self.cache.update_and_fetch(k, v)
        mask = "causal" if k.shape[2] > 1 else None
        return [mx.fast.scaled_dot_product_attention(q, keys, values, scale=SCALE, mask=mask)]

    def write(self, k, v):
        self.cache.update_and_fetch(k, v)
        return [self.cache.keys, self.cache.values]

    def trim(self):
        self.cache.trim(1)

    def bytes_per_token(self):
        return self.cache.nbytes / self.cache.offset


def make_caches(dtype, capacity: int) -> list:
    """The caches compared: flat static and dynamic, naive, and mlx-lm if importable."""
    caches = [Flat(dtype, capacity, True), Flat(dtype, capacity, False), Naive(dtype)]
    try:
        caches.append(MlxLm(dtype))
    except ImportError:
        print("mlx-lm not importable: skipping its KVCache (pip install mlx-lm)")
    return caches


def timed(fn) -> float:
    """Seconds to build and evaluate fn()."""
    start = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - start


def write_cost(cache, k, v) -> tuple[float, int]:
    """Seconds and bytes newly allocated by one evaluated write (then trimmed off)."""
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    seconds = timed(lambda: cache.write(k, v))
    # The peak counts everything live, so subtract what was live before the write.
    allocated = max(0, mx.get_peak_memory() - before)
    cache.trim()
    return seconds, allocated


def measure(context: int, dtype, reps: int, warmup: int) -> list[dict]:
    """Median step and write costs of every cache at one context length."""
    caches = make_caches(dtype, max(CONTEXTS) + 64)
    rand = lambda *shape: mx.random.normal(shape).astype(dtype)  # noqa: E731
    prefill = rand(B, HKV, context, D), rand(B, HKV, context, D)
    q, k, v = rand(B, HQ, 1, D), rand(B, HKV, 1, D), rand(B, HKV, 1, D)
    mx.eval(*prefill, q, k, v)
    for c in caches:  # the prefill only writes: its causal attention is not what we measure
        mx.eval(c.write(*prefill))
    steps = {c.name: [] for c in caches}
    writes = {c.name: [] for c in caches}
    allocs = {c.name: [] for c in caches}
    for i in range(warmup + reps):
        for c in caches:  # round-robin: every cache sees the same machine state
            t_step = timed(lambda c=c: c.step(q, k, v))
            c.trim()
            if i >= warmup:
                steps[c.name].append(t_step)
    for i in range(warmup + reps):
        for c in caches:
            # Writes in short back-to-back bursts: right after a long attention the
            # first small task mostly measures worker threads waking up.
            burst = [write_cost(c, k, v) for _ in range(3)]
            if i >= warmup:
                writes[c.name] += [t for t, _ in burst[1:]]
                allocs[c.name] += [n for _, n in burst[1:]]
    rows = []
    for c in caches:
        rows.append({
            "context": context,
            "cache": c.name,
            "step_us": statistics.median(steps[c.name]) * 1e6,
            "write_us": statistics.median(writes[c.name]) * 1e6,
            "write_alloc_bytes": int(statistics.median(allocs[c.name])),
            "bytes_per_token": c.bytes_per_token(),
        })
    base = rows[0]
    for r in rows:
        r["step_ratio"] = r["step_us"] / base["step_us"]
        r["write_ratio"] = r["write_us"] / base["write_us"]
    return rows


def main() -> None:
    """Run the benchmark and print a table (or JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--reps", type=int, default=60, help="timed reps per cache and context")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    dtype = getattr(mx, args.dtype)
    config = {
        "batch": B, "kv_heads": HKV, "q_heads": HQ, "head_dim": D, "dtype": args.dtype,
        "device": str(mx.default_device()), "machine": platform.machine(),
        "mlx": mx.__version__, "reps": args.reps, "warmup": args.warmup,
    }
    rows = [r for c in CONTEXTS for r in measure(c, dtype, args.reps, args.warmup)]
    if args.json:
        print(
            json.dumps(
                {
                    **json_header_for(format_version()),
                    "benchmark": "cache",
                    "config": config,
                    "rows": rows,
                },
                indent=2,
            )
        )
        return
    print(
        f"decode step = write 1 token's k/v + attend 1 query, evaluated; B={B} Hkv={HKV} "
        f"Hq={HQ} D=Dv={D} {args.dtype} on {config['device']} (mlx {mx.__version__}); "
        f"median of {args.reps} reps after {args.warmup} warm-up; ratio = time / flat-static;\n"
        "write = the write alone (back-to-back); write alloc = bytes newly allocated per "
        "write (0: in place); bytes/token = bytes held / tokens cached"
    )
    head = (
        f"{'context':>7}  {'cache':<15} {'step us':>9} {'ratio':>6}  {'write us':>9} {'ratio':>6} "
        f"{'write alloc':>12}  {'bytes/token':>11}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['context']:>7}  {r['cache']:<15} {r['step_us']:>9.1f} {r['step_ratio']:>6.2f}  "
            f"{r['write_us']:>9.1f} {r['write_ratio']:>6.2f} {r['write_alloc_bytes']:>12}  "
            f"{r['bytes_per_token']:>11.0f}"
        )


if __name__ == "__main__":
    main()
