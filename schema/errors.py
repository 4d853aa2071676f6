"""mlxgraph's error base, and the one error type for a bad graph file.

Every error mlxgraph raises on purpose is an :class:`Error` (``except mlxgraph.Error``); many
also keep the built-in type they had before (``ValueError``, ``RuntimeError``, ``OSError``)
as a second parent, so existing ``except`` clauses still match. The command line maps them
to the exit codes in README.md ("Exit codes").
"""


class Error(Exception):
    """The base of every error mlxgraph raises on purpose: a bad file, input or option, a
    failed step, a refused export. Anything else escaping mlxgraph is a bug."""


class GraphFormatError(Error):
    """A graph file is not valid.

    Attributes:
        path: the file (or "<bytes>").
        node: index of the node in the main chain, or None.
        field: the field at fault, or None.
        reason: what is wrong, in plain words.
    """

    def __init__(self, reason: str, path=None, node=None, field=None):
        self.path = str(path) if path is not None else "<bytes>"
        self.node = node
        self.field = field
        self.reason = reason
        super().__init__(self._render())

    def _render(self) -> str:
        return f"{self.path}: {self.detail}"

    @property
    def detail(self) -> str:
        """The message without the file: ``node N: field F: reason`` (parts that apply)."""
        where = [f"node {self.node}"] if self.node is not None else []
        if self.field is not None:
            where.append(f"field {self.field}")
        return ": ".join([*where, self.reason])

    def located(self, path=None, node=None, field=None) -> "GraphFormatError":
        """Return a copy with missing location parts filled in."""
        return GraphFormatError(
            self.reason,
            path if self.path == "<bytes>" and path is not None else self.path,
            self.node if self.node is not None else node,
            self.field if self.field is not None else field,
        )
