"""One chunk of the runtime fuzz, run in its own process by tests/test_fuzz_runtime.py.

    python tests/fuzz_runtime_worker.py SEED FIRST COUNT PROGRESS_FILE

Mutates real graph files (the verifier fuzz's mutations: bit flips, wild offsets, odd
scalars, truncations...) and takes each file that passes ``verify`` through
``load -> session -> one step -> evaluation -> session.check()``. The only exceptions a
file may cause are the documented ones (GraphFormatError, SessionError, CacheError,
GraphRuntimeError); anything else is counted by type with its first case. A crash or a
hang kills this process: the last case started is in PROGRESS_FILE. Prints one JSON line.
"""

import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import mlx.core as mx  # noqa: E402
from make_golden import build_sample  # noqa: E402
from test_fuzz_verifier import _small, field_positions, mutate  # noqa: E402
from tiny_graph import build_tiny_graph  # noqa: E402

import mlxgraph  # noqa: E402
from mlxgraph import CacheError, GraphFormatError, GraphRuntimeError, SessionError  # noqa: E402
from mlxgraph.schema.verifier import verify_buffer  # noqa: E402

DOCUMENTED = (GraphFormatError, SessionError, CacheError, GraphRuntimeError)


def bases() -> list:
    """Valid files to mutate: a tiny embedding graph, the golden sample, an attention graph."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = [_small(tmp)]
        build_sample().write(tmp / "sample.mlxg")
        out.append((tmp / "sample.mlxg").read_bytes())
        build_tiny_graph(tmp / "tiny.mlxg", max_t=16)
        out.append((tmp / "tiny.mlxg").read_bytes())
    return out


def one_case(data: bytes) -> str:
    """'rejected', 'refused:<Type>' (a documented error after verify) or 'ran'."""
    try:
        verify_buffer(data)
    except GraphFormatError:
        return "rejected"
    try:
        program = mlxgraph.load(data)
        session = program.session(capacity=16)
        vocab = max(1, program.metadata.vocab_size)
        out = session.step([[1 % vocab, 2 % vocab]], [0, 1])
        mx.eval(out if not isinstance(out, dict) else list(out.values()))
        session.check()
    except DOCUMENTED as e:
        return f"refused:{type(e).__name__}"
    return "ran"


def main(seed: int, first: int, count: int, progress: str) -> dict:
    """Run cases first .. first + count - 1 of the seeded sequence; returns the tallies."""
    files = bases()
    where = [field_positions(b) for b in files]
    tally, undocumented = {}, {}
    with open(progress, "w") as prog:
        for case in range(first, first + count):
            rng = random.Random(f"{seed}-{case}")
            k = rng.randrange(len(files))
            data = mutate(rng, files[k], where[k])
            prog.seek(0)
            prog.write(f"{case:12d}\n")
            prog.flush()
            try:
                kind = one_case(data)
            except Exception as e:  # noqa: BLE001 - the point: anything undocumented is counted
                kind = f"undocumented:{type(e).__name__}"
                undocumented.setdefault(kind, f"case {case}: {e}"[:300])
            tally[kind] = tally.get(kind, 0) + 1
    return {"first": first, "count": count, "tally": tally, "undocumented": undocumented}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
