"""Ragged attention for batched decode: one attention per row over its own store, against
padding every row's history to the longest and one masked attention for all.

    python benchmarks/ragged_attention_bench.py [--batches 4,16] [--contexts 128,1024]

The small model's attention geometry (32 query heads, 8 K/V heads, head dim 32, float32).
B rows hold histories of different lengths (context +- 50%); each timed step adds one
token per row. "per-row" is what UpdateAndAttend does in a batched step (each row's store
update, then the fused attention over that row's view, exactly a solo step's calls);
"padded" copies every row's keys and values into one [B, Hkv, S_max, D] buffer each step
and runs one fused attention with a [B, 1, 1, S_max] mask. Both outputs are compared.
"""

import argparse
import sys
import time

import mlxgraph

mlxgraph.preload_blas()

import mlx.core as mx  # noqa: E402  (after the BLAS preload)
import numpy as np  # noqa: E402

from mlxgraph.interpreter.attention import attend  # noqa: E402
from mlxgraph.interpreter.cache.kv_cache import CachePolicy, make_store  # noqa: E402
from mlxgraph.schema.records import LayerCacheInfo  # noqa: E402

HQ, HKV, D = 32, 8, 32


def _stores(b, context, rng):
    geo = LayerCacheInfo(0, HKV, D, D, 0)
    stores = []
    for _ in range(b):
        s = make_store(geo, CachePolicy(capacity=4 * context, kv_dtype=None))
        n = int(context * rng.uniform(0.5, 1.5))
        k = mx.array(rng.standard_normal((1, HKV, n, D)).astype(np.float32))
        s.begin(n)
        s.update(k, k)
        s.commit()
        stores.append(s)
    mx.eval([a for s in stores for a in s.state])
    return stores


def _per_row(stores, q, k, v):
    outs = []
    for i, s in enumerate(stores):
        s.begin(1)
        keys, values, mask = s.update(k[i:i + 1], v[i:i + 1])
        outs.append(attend(q[i:i + 1], keys, values, mask, D ** -0.5, mx.float32))
        s.commit()
    return mx.concatenate(outs, axis=0)


def _padded(stores, q, k, v):
    views, lengths = [], []
    for i, s in enumerate(stores):
        s.begin(1)
        keys, values, _ = s.update(k[i:i + 1], v[i:i + 1])
        s.commit()
        views.append((keys, values))
        lengths.append(keys.shape[2])
    top = max(lengths)
    pad = [(0, 0), (0, 0), (0, 0), (0, 0)]
    keys = mx.concatenate([mx.pad(kk, pad[:2] + [(0, top - kk.shape[2])] + pad[3:])
                           for kk, _ in views], axis=0)
    values = mx.concatenate([mx.pad(vv, pad[:2] + [(0, top - vv.shape[2])] + pad[3:])
                             for _, vv in views], axis=0)
    mask = (mx.arange(top)[None, :] < mx.array(lengths)[:, None])[:, None, None, :]
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=D ** -0.5, mask=mask)


def main(argv=None) -> int:
    """Print per-row vs padded step times per (B, context)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="4,16")
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'B':>3} {'context':>8} {'per-row ms':>10} {'padded ms':>10} {'padded/per-row':>14} "
          f"{'max diff':>9}")
    for b in [int(x) for x in args.batches.split(",")]:
        for context in [int(x) for x in args.contexts.split(",")]:
            base = _stores(b, context, rng)
            times, diff = {}, 0.0
            for name, fn in (("per-row", _per_row), ("padded", _padded)):
                stores = [s.fork() for s in base]
                best = float("inf")
                for _ in range(args.steps):
                    q = mx.array(rng.standard_normal((b, HQ, 1, D)).astype(np.float32))
                    k = mx.array(rng.standard_normal((b, HKV, 1, D)).astype(np.float32))
                    t0 = time.perf_counter()
                    mx.eval(fn(stores, q, k, k))
                    best = min(best, time.perf_counter() - t0)
                times[name] = best * 1000
            q = mx.array(rng.standard_normal((b, HQ, 1, D)).astype(np.float32))
            k = mx.array(rng.standard_normal((b, HKV, 1, D)).astype(np.float32))
            one = _per_row([s.fork() for s in base], q, k, k)
            two = _padded([s.fork() for s in base], q, k, k)
            diff = float(mx.abs(one - two).max())
            print(f"{b:>3} {context:>8} {times['per-row']:>10.2f} {times['padded']:>10.2f} "
                  f"{times['padded'] / times['per-row']:>14.2f} {diff:>9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
