"""KV cache + attention core against a dense float64 numpy oracle.

Random schedules (seeded) drive session-like steps over one or more layers at once:
chunked prefills, single-token decodes, steps longer than a ring's max_step, trims
(within and beyond what the store can rewind), resets, steps over a flat store's
capacity, bad inputs and rollbacks. A failed call must raise CacheError and leave the
store unchanged, which the schedule checks by carrying on against the oracle. EVERY
attention output is compared with dense attention over the true history.

Tolerance (float32 compute vs float64 oracle): |out - ref| <= ATOL + RTOL * |ref|. With
float16/bfloat16 storage the oracle's history is rounded to the storage dtype, so the
same tolerance applies. The module prints a summary line with the figures; measured:
default run 96 schedules, 6,406 committed steps, 11,991 attention outputs compared,
3,761 rejected calls checked (~4 s of schedules, the file ~5-10 s on 2 cores);
``-m slow`` 180 schedules, 44,703 steps, 85,916 outputs, 18,221 rejections (~75 s).
"""

from __future__ import annotations

import time

import pytest
from kv_schedule import FAMILIES, TOTALS, run_schedule

from mlxgraph.interpreter.cache import store as cache_store


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    yield
    t = TOTALS
    line = (
        f"kv_cache oracle: {t['schedules']} schedules, {t['steps']} committed steps, "
        f"{t['attentions']} attention outputs compared, {t['rejected']} rejected calls "
        f"checked, {t['forks']} forks and {t['restores']} save/restores checked bitwise, "
        f"{t['seconds']:.1f}s"
    )
    # Shown even under output capture: the lead quotes these figures.
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print("\n" + line)


def family_args(family: str) -> dict:
    """run_schedule's kinds, kv_dtype and bits for a family."""
    kinds, storage = FAMILIES[family]
    bits = storage if isinstance(storage, int) else 0
    return {"kinds": kinds, "kv_dtype": None if bits else storage, "bits": bits}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_schedules_match_dense_oracle(family, monkeypatch, tmp_path):
    """16 schedules (4 quantized) x 120 operations per family, every output against the oracle."""
    # Small first allocation so dynamic stores grow (by doubling) inside short schedules.
    monkeypatch.setattr(cache_store, "_FIRST_ALLOC", 4)
    start = time.perf_counter()
    args = family_args(family)
    for seed in range(4 if args["bits"] else 16):  # quantized: wider heads, slower oracle
        run_schedule(1000 * len(family) + seed, ops=120, tmp_path=tmp_path, **args)
    TOTALS["seconds"] += time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_schedules_match_dense_oracle_long(family, tmp_path):
    """30 schedules x 400 operations, larger capacities and windows, default first allocation."""
    start = time.perf_counter()
    for seed in range(30):
        run_schedule(7919 + 31 * seed + len(family), ops=400, big=300, scale=5, tmp_path=tmp_path,
                     **family_args(family))
    TOTALS["seconds"] += time.perf_counter() - start
