"""mlxgraph.exporter."""
