"""Benchmark process: greedy generation with an exported graph file, the Python API path.

    python benchmarks/engines/mlxgraph_engine.py --model G.mlxg --prompt-ids 1,2,3 --new-tokens 128

As a user's script does it: ``mlxgraph.load()`` (which preloads the BLAS by itself, before
mlx is imported), then the same generation loop as `mlxgraph generate`
(generation/loop.py), EOS ignored so every engine produces the same number of tokens.
"""

import sys

from common import emit, parse_args, run_all


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    import mlxgraph

    program = mlxgraph.load(args.model, int8_activations=args.int8_activations)
    blas = mlxgraph.blas_in_use()
    import mlx.core as mx

    from mlxgraph.generation.loop import generate
    from mlxgraph.generation.sampling import Sampler

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
