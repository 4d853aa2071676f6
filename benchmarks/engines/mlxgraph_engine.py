"""Benchmark process: greedy generation with an exported graph file, through mlxgraph's own loop.

    python benchmarks/engines/mlxgraph_engine.py --model G.mlxg --prompt-ids 1,2,3 --new-tokens 128

Uses the same generation loop as `mlxgraph generate` (tools/generation.py), EOS ignored so
every engine produces the same number of tokens. The BLAS is preloaded first.
"""

import sys

from common import emit, parse_args, run_all


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    from mlxgraph.interpreter.blas import preload_blas

    blas = preload_blas()
    import mlx.core as mx

    import mlxgraph
    from mlxgraph.tools.generation import generate
    from mlxgraph.tools.sampling import Sampler

    program = mlxgraph.load(args.model)

    def once(prompt, n, timer):
        session = program.session()
        for tok in generate(session, prompt, Sampler(), n):
            timer.token(tok)

    doc = run_all(once, args)
    doc.update(engine="mlxgraph", blas=blas.describe(), peak_mlx_bytes=int(mx.get_peak_memory()))
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
