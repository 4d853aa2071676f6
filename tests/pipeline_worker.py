"""One rank of a pipeline test, started by ``mlx.launch`` (tests/test_pipeline.py).

usage: pipeline_worker.py GRAPH OUT_DIR MODE TIMEOUT

MODE ``schedule`` runs SCHEDULE (steps, greedy decode, trim, a step one rank rejects,
reset) and writes ``rank<R>.json``: every step's tokens and logits, what each rank loaded
and its peak memory. ``states`` (a graph with recurrent state layers) runs SCHEDULE, then
``state_rewinds`` (rewinds a state's snapshots allow and one they refuse, a fork) instead
of the ring store's refusal. ``die``: the last rank exits (status 0, so mlx.launch lets the
others run) after the first step, and the others must end with a PipelineError. ``hang``:
the last rank stops answering; the others' watchdog must end them after TIMEOUT seconds.
Rank 0 of ``schedule`` and ``states`` then runs the same on one ordinary session
(``reference.json``).
"""

import json
import os
import sys
import time
from pathlib import Path

import mlxgraph

PROMPT = [1, 7, 3, 12, 5, 9, 2]
SECOND_PROMPT = [4, 4, 8]


def greedy(session, logits, n, record):
    """Feed ``n`` greedy tokens after ``logits``; every step's logits go to ``record``."""
    import mlx.core as mx

    for _ in range(n):
        token = int(mx.argmax(logits[0, -1]).item())
        logits = session.step([[token]], [session.length])
        record.append({"tokens": [token], "logits": logits.tolist()})
    return logits


def schedule(session, rank, size, record, events):
    """The schedule the test replays on a single-process session (SCHEDULE in the test)."""
    logits = session.step([PROMPT], range(len(PROMPT)))
    record.append({"tokens": PROMPT, "logits": logits.tolist()})
    logits = greedy(session, logits, 6, record)
    events.append(["trim", session.trim(2)])
    if size > 1:
        # Rank 1 asks for another position: every rank must reject the step, nothing written.
        wrong = session.length + (1 if rank == 1 else 0)
        try:
            session.step([[3]], [wrong])
            events.append(["accepted", session.length])
        except mlxgraph.SessionError as e:
            events.append(["rejected", session.length, str(e)])
        try:  # every rank's own token: the ranks disagree on the call
            session.step([[3 + rank]], [session.length])
            events.append(["accepted", session.length])
        except mlxgraph.SessionError as e:
            events.append(["disagreed", session.length, str(e)])
    try:
        session.trim(session.length + 1)
    except mlxgraph.SessionError as e:
        events.append(["trim_refused", session.length, str(e)])
    # Re-feed the token that trim removed from the end, then decode more.
    logits = session.step([[record[-2]["tokens"][0]]], [session.length])
    record.append({"tokens": record[-2]["tokens"], "logits": logits.tolist()})
    greedy(session, logits, 3, record)
    session.reset()
    events.append(["reset", session.length])
    logits = session.step([SECOND_PROMPT], range(len(SECOND_PROMPT)))
    record.append({"tokens": SECOND_PROMPT, "logits": logits.tolist()})
    greedy(session, logits, 2, record)


def ring_refusal(program, events):
    """A trim only the last stage's ring store cannot take: refused on every rank alike."""
    last = max(program.metadata.layers, key=lambda lc: lc.layer_id)
    window = max(4, last.sliding_window)
    session = program.session(capacity=64, windows={last.layer_id: window}, max_step=4)
    n = window + 10
    session.step([(PROMPT * n)[:n]], range(n))
    try:
        session.trim(n - 2)
        events.append(["ring_trimmed", session.length])
    except mlxgraph.CacheError as e:
        events.append(["ring_refused", session.length, str(e),
                       {str(k): v for k, v in session.approximations.items()}])


def state_rewinds(program, record, events):
    """A prefill in two chunks, a fork that goes its own way, a rewind to the second
    chunk's start and the chunk again (the same logits), decode steps, then a rewind no
    snapshot covers (refused on every rank) and one a kept step start allows."""
    session = program.session(capacity=64, state_snapshots=2)
    first, n = PROMPT * 2, len(PROMPT) * 2
    session.step([first], range(n))
    twin = session.fork()  # on every rank; the twin's states are its own from here on
    logits = twin.step([SECOND_PROMPT[::-1]], range(n, n + 3))
    record.append({"tokens": SECOND_PROMPT[::-1], "logits": logits.tolist()})
    logits = session.step([SECOND_PROMPT], range(n, n + 3))
    record.append({"tokens": SECOND_PROMPT, "logits": logits.tolist()})
    events.append(["rewound", session.trim(3)])  # to the chunk's start: a kept step start
    logits = session.step([SECOND_PROMPT], range(n, n + 3))
    record.append({"tokens": SECOND_PROMPT, "logits": logits.tolist()})
    greedy(session, logits, 3, record)
    for back in (3, 2):  # snapshots at the last 2 step starts only: 3 back is not kept
        try:
            events.append(["trimmed", session.trim(back)])
        except mlxgraph.CacheError as e:
            events.append(["state_refused", session.length, str(e)])
    greedy(twin, logits, 1, record)
    events.append(["states", [layer["layer"] for layer in session.describe()["layers"]
                              if "snapshot_bytes" in layer]])


def main(argv) -> int:
    graph, out_dir, mode, timeout = argv[1], Path(argv[2]), argv[3], float(argv[4])
    program = mlxgraph.load(graph, pipeline=True, pipeline_timeout=timeout)
    import mlx.core as mx

    rank, size = program.link.rank, program.link.size
    session = program.session(capacity=64)
    record, events, error = [], [], None
    try:
        if mode in ("schedule", "states"):
            schedule(session, rank, size, record, events)
            if mode == "states":
                state_rewinds(program, record, events)
            else:
                ring_refusal(program, events)
        else:
            session.step([PROMPT], range(len(PROMPT)))
            if rank == size - 1:
                if mode == "die":
                    os._exit(0)
                time.sleep(10 * timeout)  # hang: never answer again
            session.step([[1]], [session.length])
    except mlxgraph.PipelineError as e:
        error = str(e)
    doc = {
        "rank": rank, "size": size, "layers": list(program.stage.layers),
        "states": list(program.stage.states),
        "weight_bytes": program.stage.weight_bytes,
        "stage_weight_bytes": list(program.stage.stage_weight_bytes),
        "loaded_bytes": sum(a.nbytes for a in program.constants.values()),
        "peak_memory_bytes": int(mx.get_peak_memory()),
        "steps": record, "events": events, "error": error,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(doc))
    if mode in ("schedule", "states") and rank == 0:
        # The reference, once this rank's figures are taken: one ordinary session of the
        # whole graph, in a process like the ranks (the same BLAS, the same roundings).
        ref, whole = [], mlxgraph.load(graph)
        mx.reset_peak_memory()
        schedule(whole.session(capacity=64), 0, 1, ref, [])
        if mode == "states":
            state_rewinds(whole, ref, [])
        doc = {"steps": ref, "peak_memory_bytes": int(mx.get_peak_memory())}
        (out_dir / "reference.json").write_text(json.dumps(doc))
    return 3 if error else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
