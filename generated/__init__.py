"""mlxgraph.generated."""
