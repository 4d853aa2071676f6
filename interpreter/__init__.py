"""mlxgraph.interpreter: run graph files on MLX (never imports torch).

At the top: ``Program`` (program.py, a loaded and verified graph), how its nodes are
resolved and run (node_plan.py, node_runner.py, straight_line.py), the attention core
(attention.py), lazy index checks (index_guard.py), load options, dtypes, memory and the
errors. The rest is grouped by responsibility:

- session/: ``Session``, a graph's per-session state and its step (inputs, lock, options,
  fork protocol);
- cache/: the off-graph KV cache (stores, layouts, codecs) and cache files (safetensors);
- batching/: several sessions in one step (token rows, per-op token rules);
- pipeline/: a graph split over processes with mx.distributed;
- text/: tokenizers and chat templates from a file, each checked and sandboxed;
- native/: the optional C/C++ kernels (sources beside their Python wrappers) and the
  BLAS preload;
- kernels/: one MLX function per op.
"""
