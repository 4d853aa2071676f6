"""Errors raised while running a graph."""

from mlxgraph.schema.errors import Error


class SessionError(Error, ValueError):
    """A step's inputs are not acceptable (shape, dtype, positions, bounds).

    The session is unchanged when this is raised.
    """


class GraphRuntimeError(Error, RuntimeError):
    """A node failed while building a step; names the file, node index, op and source.

    The session is unchanged when this is raised (the step's cache writes are dropped).
    """

    def __init__(self, path, node_index, op, provenance, reason):
        self.path = str(path) if path else "<bytes>"
        self.node_index = node_index
        self.op = op
        self.reason = reason
        src = (
            f" (from {provenance.source} in {provenance.module_path or '?'})"
            if provenance and provenance.source
            else ""
        )
        super().__init__(f"{self.path}: node {node_index} ({op}){src}: {reason}")


class CacheFileError(Error, ValueError):
    """A saved session cache file cannot be used: unreadable, truncated, tampered with, or
    saved from another graph or with another cache policy. Nothing was changed."""


class PipelineError(Error, RuntimeError):
    """A pipeline lost a rank (it died, hung or became unreachable) or cannot be set up.

    The pipeline session that raised it cannot continue: every later call raises again.
    """


class TokenizerError(Error):
    """The graph's tokenizer cannot be loaded, its chat template fails, or a text or a list
    of ids cannot be encoded or decoded with it (one line: which tokenizer and why)."""
