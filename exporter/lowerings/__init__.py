"""mlxgraph.exporter.lowerings."""
