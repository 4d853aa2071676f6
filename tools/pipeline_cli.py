"""`mlxgraph generate --pipeline`: the command line's side of a pipeline run.

Every rank runs the same command under ``mlx.launch``; each loads its stage, all of them
step together and sample the same tokens (the outputs reach every rank, and the sampler's
seed is rank 0's), and only rank 0 writes the text, the stats and the JSON document.
docs/pipeline.md has the how-to.
"""

import os
import sys
from dataclasses import replace

from mlxgraph.tools.output import ToolError


def add_pipeline_options(p) -> None:
    """--pipeline and --pipeline-timeout."""
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="run as one rank of a pipeline by layer ranges, every rank started by mlx.launch "
        "(docs/pipeline.md); rank 0 prints",
    )
    p.add_argument(
        "--pipeline-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a rank waits for another before the run ends (default 300)",
    )


def check_pipeline_options(args) -> None:
    """Refuse what a pipeline run cannot do.

    Raises:
        ToolError: --prompt-cache (each rank holds only its layers' cache), or a timeout
            that is not a positive number.
    """
    if not getattr(args, "pipeline", False):
        if getattr(args, "pipeline_timeout", None) is not None:
            raise ToolError("--pipeline-timeout needs --pipeline")
        return
    if getattr(args, "prompt_cache", None):
        raise ToolError("--prompt-cache cannot be used with --pipeline (each rank holds only "
                        "its own layers' cache)")
    t = args.pipeline_timeout
    if t is not None and not (t > 0 and t < float("inf")):
        raise ToolError(f"--pipeline-timeout must be a positive number of seconds, got {t}")


def load_options(args) -> dict:
    """Program.load's pipeline arguments for ``args``."""
    if not getattr(args, "pipeline", False):
        return {}
    return {"pipeline": True, "pipeline_timeout": args.pipeline_timeout}


def share_seed(program, sampling):
    """``sampling`` with rank 0's seed on every rank (drawn there when --seed is not given);
    greedy choice has no seed (every rank's command is the same, so all skip the gather)."""
    link = program.link
    if link is None or link.size == 1 or sampling.seed is not None or not sampling.temperature:
        return sampling
    mine = int.from_bytes(os.urandom(4), "little") >> 1
    return replace(sampling, seed=link.gather([mine])[0][0])


def quiet_unless_first(program) -> bool:
    """Send this rank's stdout to nowhere unless it is rank 0; True when it was silenced."""
    if program.link is None or program.link.rank == 0:
        return False
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)
    return True


def pipeline_doc(program, mx) -> dict | None:
    """The JSON ``pipeline`` member: ranks, weight bytes and peak memory per rank (a
    collective: every rank calls it at the end of the run)."""
    if program.link is None:
        return None
    from mlxgraph.tools.output import peak_rss_bytes

    rows = program.link.gather([int(mx.get_peak_memory()), peak_rss_bytes()])
    return {
        "ranks": program.link.size,
        "weight_bytes": list(program.stage.stage_weight_bytes),
        "peak_memory_bytes": [r[0] for r in rows],
        "peak_rss_bytes": [r[1] for r in rows],
    }


def print_pipeline(doc, err) -> None:
    """One line per rank: its weights and peak memory."""
    from mlxgraph.tools.output import human_bytes

    for rank, (w, peak, rss) in enumerate(zip(doc["weight_bytes"], doc["peak_memory_bytes"],
                                              doc["peak_rss_bytes"])):
        print(f"pipeline     rank {rank}/{doc['ranks']}: weights {human_bytes(w)}, peak "
              f"memory {human_bytes(peak)} MLX, {human_bytes(rss)} process RSS", file=err)
