"""Host cost of one decode step: building its lazy MLX graph, mlxgraph against mlx-lm.

    python benchmarks/step_build_bench.py --graph G.mlxg --folder HF_FOLDER [--steps 64]
        [--prompt 128] [--json]

On a GPU the host builds each step's graph and launches its kernels while the device
waits, so the build is the critical path; on the CPU it hides behind the compute. Both
engines prefill the same prompt, then decode ``--steps`` single tokens: each step is
timed twice, from the call to the lazy logits being returned ("build": graph
construction, all Python) and from there to ``mx.eval`` returning ("eval": the device,
plus whatever the host still does inside eval). mlxgraph's ``step`` also hands the cache
it leaves to ``mx.async_eval`` before returning (so no other thread evaluates that graph:
docs/architecture.md, "A step"); on the CPU that call can wait for kernels in flight, so there
"build" holds part of the evaluation and build + eval is the figure to compare. Printed:
median and best ms of each, their sum, and mlxgraph's build time and sum as multiples of
mlx-lm's. Runs on MLX's default device.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def _time_steps(step, steps: int) -> dict:
    """``step(i) -> lazy output``, timed ``steps`` times (after 4 warm-up steps)."""
    import mlx.core as mx

    build, run = [], []
    for i in range(steps + 4):
        t0 = time.perf_counter()
        out = step(i)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        if i >= 4:
            build.append((t1 - t0) * 1e3)
            run.append((t2 - t1) * 1e3)
    return {"build_ms": statistics.median(build), "build_ms_best": min(build),
            "eval_ms": statistics.median(run), "eval_ms_best": min(run)}


def mlxgraph_steps(graph: str, prompt: list, steps: int) -> dict:
    """mlxgraph: ``session.step`` of one token after the prompt's prefill."""
    import mlxgraph

    program = mlxgraph.load(graph)
    import mlx.core as mx

    session = program.session(capacity=len(prompt) + steps + 8)
    mx.eval(session.step(mx.array([prompt]), range(len(prompt))))
    token = mx.array([[prompt[-1]]])
    return _time_steps(lambda i: session.step(token, [len(prompt) + i]), steps)


def mlx_lm_steps(folder: str, prompt: list, steps: int) -> dict:
    """mlx-lm: the model called on one token with its prompt cache, as generate_step does."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(folder))
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([prompt]), cache=cache))
    token = mx.array([[prompt[-1]]])
    return _time_steps(lambda i: model(token, cache=cache), steps)


def print_report(doc) -> None:
    """The table of a ``--json`` document."""
    print(f"one decode step after a {doc['prompt']}-token prompt, {doc['steps']} steps, "
          f"device {doc['device']}, load average {doc['load_average'][0]:.2f}: "
          "median (best) ms")
    for name in ("mlxgraph", "mlx-lm"):
        r = doc.get(name)
        if r and "build_ms" in r:
            print(f"  {name:<9} build {r['build_ms']:7.3f} ({r['build_ms_best']:.3f})   "
                  f"eval {r['eval_ms']:7.3f} ({r['eval_ms_best']:.3f})   "
                  f"sum {r['build_ms'] + r['eval_ms']:7.3f}")
        elif r:
            print(f"  {name:<9} not measured: {r['missing']}")
    peer = doc.get("mlx-lm", {})
    if "build_ms" in peer:
        ours = doc["mlxgraph"]
        ratio = ours["build_ms"] / peer["build_ms"]
        total = (ours["build_ms"] + ours["eval_ms"]) / (peer["build_ms"] + peer["eval_ms"])
        print(f"  mlxgraph / mlx-lm: build {ratio:.2f}x, build + eval {total:.2f}x")


def main(argv=None) -> int:
    """Measure both engines in this process, one after the other; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", required=True)
    ap.add_argument("--folder", help="the same model as a Hugging Face folder, for mlx-lm")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    prompt = [3 + (i * 7919) % 250 for i in range(args.prompt)]
    doc = {"steps": args.steps, "prompt": args.prompt,
           "mlxgraph": mlxgraph_steps(args.graph, prompt, args.steps)}
    if args.folder:
        try:
            doc["mlx-lm"] = mlx_lm_steps(args.folder, prompt, args.steps)
        except ImportError as e:
            doc["mlx-lm"] = {"missing": str(e)}
    import mlx.core as mx

    doc["device"] = str(mx.default_device())
    doc["load_average"] = os.getloadavg()
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_report(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
