"""One chunk of the runtime fuzz, run in its own process by tests/test_fuzz_runtime.py.

    python tests/fuzz_runtime_worker.py SEED FIRST COUNT PROGRESS_FILE

Mutates real graph files (the verifier fuzz's mutations: bit flips, wild offsets, odd
scalars, truncations...) and takes each file that passes ``verify`` through
``load -> session -> one step -> evaluation -> session.check()``, then through the session's
other calls (fork, save and restore, trim, a step from another thread, a lazy bad token
id: ``session_calls``). The only exceptions a file may cause are the documented ones
(GraphFormatError, SessionError, CacheError, GraphRuntimeError, CacheFileError); anything
else is counted by type with its first case. A crash or a hang kills this process: the
last case started is in PROGRESS_FILE. Prints one JSON line.
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
from mlxgraph import (  # noqa: E402
    CacheError,
    CacheFileError,
    GraphFormatError,
    GraphRuntimeError,
    SessionError,
)
from mlxgraph.schema.verifier import verify_buffer  # noqa: E402

DOCUMENTED = (GraphFormatError, SessionError, CacheError, GraphRuntimeError, CacheFileError)


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
    return "ran" + session_calls(program, session, vocab)


def session_calls(program, session, vocab) -> str:
    """What a file that ran takes next: a fork stepped on, save and restore into a fresh
    session and by the program, trim, a lazy token id outside the vocabulary (its second
    step after must raise SessionError), a step from another thread. Returns a tally
    suffix: '' when every call did what it documents, ':<Type>' for a documented refusal."""
    import threading

    def out_of(x):
        mx.eval(x if not isinstance(x, dict) else list(x.values()))

    try:
        twin = session.fork()
        out_of(twin.step([[3 % vocab]], [2]))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "c.safetensors"
            session.save(path, tokens=[1 % vocab, 2 % vocab])
            fresh = program.session(capacity=16)
            fresh.restore(path)
            again = program.restore(path)
            if fresh.length != 2 or again.length != 2:
                raise AssertionError("a restored session lost its length")
        session.trim(1)
        box = []  # (outputs belong to the thread that built them: evaluated there)

        def in_thread():
            try:
                out_of(session.step([[1 % vocab]], [1]))
            except BaseException as e:  # noqa: BLE001 - raised again on this thread
                box.append(e)

        worker = threading.Thread(target=in_thread)
        worker.start()
        worker.join()
        if box:
            raise box[0]
        session.step(mx.array([[vocab + 3]]), [2])
        session.step([[0]], [3])
        try:
            session.step([[0]], [4])
        except SessionError as e:
            if "outside the vocabulary" not in str(e):
                raise
        else:
            raise AssertionError("a lazy token id past the vocabulary was not refused")
    except DOCUMENTED as e:
        return f":{type(e).__name__}"
    return ""


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
