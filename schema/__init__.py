"""mlxgraph.schema."""
