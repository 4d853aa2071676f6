"""The hostile cache corpus (tests/hostile_caches.py) through every reader, in its own process.

    python tests/cache_corpus_worker.py FOLDER

Saves genuine files (float32 with a wrapped ring, bfloat16 storage, 4-bit quantized), builds
their mutants, and takes each through ``cache inspect``'s view, ``cache diff`` against the
genuine file, ``session.restore``, ``program.restore`` and ``generate --prompt-cache``; a
restored session then steps once. The only errors allowed are the documented ones
(CacheFileError, and the tool's one-line error for --prompt-cache). Prints one JSON line:
tallies, anything undocumented with its case, the slowest case and the peak RSS.
"""

import contextlib
import io
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import mlxgraph  # noqa: E402

mlxgraph.preload_blas()  # before mlx is imported
import mlx.core as mx  # noqa: E402
from hostile_caches import corpus  # noqa: E402
from synthetic_graphs import llama  # noqa: E402
from tiny_graph import build_tiny_graph  # noqa: E402

from mlxgraph.interpreter.cache.file import CacheFile  # noqa: E402
from mlxgraph.interpreter.errors import CacheFileError  # noqa: E402
from mlxgraph.tools.cache_view import diff_caches, file_view  # noqa: E402
from mlxgraph.tools.cli import main as cli_main  # noqa: E402
from mlxgraph.tools.output import ToolError  # noqa: E402
from mlxgraph.tools.prompt_cache import load_prompt_cache  # noqa: E402

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]


def bases(folder: Path) -> list:
    """[(program, session options, genuine file)]."""
    build_tiny_graph(folder / "tiny.mlxg", windows=(3, 0))
    llama(layers=2, hidden=128, heads=2, kv_heads=1, intermediate=64, vocab=64).write(
        folder / "wide.mlxg")
    out = []
    for graph, options in (
        ("tiny.mlxg", {"capacity": 32, "max_step": 4}),
        ("tiny.mlxg", {"capacity": 32, "max_step": 4, "kv_dtype": "bfloat16"}),
        ("wide.mlxg", {"capacity": 32, "max_step": 4, "kv_bits": 4, "kv_group_size": 32}),
    ):
        program = mlxgraph.load(folder / graph)
        session = program.session(**options)
        mx.eval(session.step([PROMPT[:7]], range(7)))
        path = folder / f"base{len(out)}.safetensors"
        session.save(path, tokens=PROMPT[:7])
        out.append((program, options, path))
    return out


def run_case(program, options, good, path, tools=True) -> str:
    """'refused' or 'read' per reader, joined; raises anything undocumented. ``tools``:
    also ``mlxgraph cache inspect`` / ``diff`` (they read a whole file that fits memory)."""
    seen = []
    for name, reader in (
        ("cli", lambda: _cli(path, good)),
        ("inspect", lambda: file_view(CacheFile(path))),
        ("diff", lambda: diff_caches(CacheFile(good), CacheFile(path), 1e-3, 4)),
        ("session.restore", lambda: _step(program.session(**options), path)),
        ("program.restore", lambda: _step(program.restore(path), None)),
        ("prompt-cache", lambda: _prompt(program.session(**options), path)),
    ):
        if not tools and name in ("cli", "inspect", "diff"):
            continue
        try:
            reader()
            seen.append(f"{name}:read")
        except (CacheFileError, ToolError):
            seen.append(f"{name}:refused")
    return " ".join(seen)


def _cli(path, good):
    """`cache inspect` and `cache diff`: exit 0/1 or 2 with one line, never a traceback."""
    for argv in (["cache", "inspect", str(path)], ["cache", "diff", str(good), str(path)],
                 ["cache", "inspect", "--json", str(path)]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
        lines = err.getvalue().splitlines()
        if code not in (0, 1, 2) or (code == 2) != bool(lines) or len(lines) > 1:
            raise AssertionError(f"{argv[:2]}: exit {code}, stderr {err.getvalue()[-300:]!r}")
        if code == 2:
            raise CacheFileError(lines[0])


def _step(session, path):
    if path is not None:
        session.restore(path)
    mx.eval(session.step([[1]], [session.length]))


def _prompt(session, path):
    load_prompt_cache(path, session, PROMPT)
    mx.eval(session.step([PROMPT[session.length:]], range(session.length, len(PROMPT))))


def run(folder: Path) -> dict:
    tally, undocumented, slowest = {}, {}, (0.0, "")
    for k, (program, options, good) in enumerate(bases(folder)):
        sub = folder / f"c{k}"
        sub.mkdir()
        for name, path in corpus(good, sub):
            t0 = time.perf_counter()
            try:
                kind = run_case(program, options, good, path, "restores only" not in name)
                kind = "all refused" if "read" not in kind else "some read"
            except Exception as e:  # noqa: BLE001 - the point: anything undocumented is named
                kind = f"undocumented:{type(e).__name__}"
                undocumented[f"{k}:{name}"] = f"{type(e).__name__}: {e}"[:300]
            spent = time.perf_counter() - t0
            slowest = max(slowest, (spent, f"{k}:{name}"))
            tally[kind] = tally.get(kind, 0) + 1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"tally": tally, "undocumented": undocumented, "slowest": slowest, "max_rss": rss,
            "cases": sum(tally.values())}


if __name__ == "__main__":
    print(json.dumps(run(Path(sys.argv[1]))))
