"""Benchmark process: greedy generation with mlx-lm loading the Hugging Face folder.

    python benchmarks/engines/mlx_lm_engine.py --model FOLDER --prompt-ids 1,2,3 --new-tokens 128

As its users run it: mlx-lm imported as installed, so MLX's products run on the BLAS the
MLX wheel brings. ``BENCH_PRELOAD_BLAS=1`` (the labelled row "mlx-lm+openblas") first puts
mlxgraph's preloaded OpenBLAS under MLX, as ``mlxgraph.load()`` does for itself. mlx-lm's
``generate_step`` is used as is (greedy sampler, its default prefill chunking; it never stops
at EOS by itself).
"""

import sys
from pathlib import Path

from common import emit, mlx_lm_blas, parse_args, run_all


def main() -> int:
    """Run the benchmark and print the result line."""
    args = parse_args()
    blas = mlx_lm_blas()
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(args.model))
    dtypes = sorted({str(v.dtype) for _, v in tree_flatten(model.parameters())})

    def once(prompt, n, timer):
        for tok, _ in generate_step(mx.array(prompt), model, max_tokens=n):
            timer.token(tok)

    doc = run_all(once, args)
    doc.update(engine="mlx-lm", blas=blas, peak_mlx_bytes=int(mx.get_peak_memory()),
               param_dtypes=dtypes)
    emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
