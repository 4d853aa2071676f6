"""A session: one history of a loaded graph, its off-graph state and its step."""
