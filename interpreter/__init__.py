"""mlxgraph.interpreter."""
