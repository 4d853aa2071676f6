"""mlxgraph.tools."""
