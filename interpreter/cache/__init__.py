"""The off-graph KV cache: per-layer stores, their layouts and codecs, and cache files."""
