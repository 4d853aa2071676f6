"""mlxgraph.interpreter: run graph files on MLX (never imports torch).

``Program`` (program.py) is a loaded, verified graph; ``Session`` (session.py) holds the
per-session KV cache (kv_cache.py) and runs steps; kernels/ holds one function per op.
"""
