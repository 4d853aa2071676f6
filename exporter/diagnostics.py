"""What the export reports about a model it cannot lower: problems and their sources."""

from dataclasses import dataclass

from mlxgraph.exporter.errors import UnsupportedModelError


@dataclass(frozen=True)
class Problem:
    """One op the export cannot lower, and where it comes from."""

    target: str
    node: str
    location: str
    reason: str

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.target}{why} at {self.location} [fx node {self.node}]"


class UnsupportedOpsError(UnsupportedModelError):
    """The model uses ops the exporter cannot lower; ``problems`` lists all of them.

    The message is one line: the first problem in graph order (the op, why, the module and
    the model's source line), then how many more there are and which other ops they name.
    """

    def __init__(self, problems):
        self.problems = list(problems)
        first = self.problems[0]
        why = f" ({first.reason})" if first.reason else ""
        line = f"unsupported op {first.target}{why} at {first.location}"
        others = sorted({p.target for p in self.problems[1:]} - {first.target})
        if len(self.problems) > 1:
            line += f"; {len(self.problems) - 1} more problem(s)"
            line += f", other ops: {', '.join(others)}" if others else ""
        super().__init__(line)


def source_location(node, strip_prefix: str = "model.") -> str:
    """Where a node comes from: the innermost user frame of its stack trace, and its module."""
    trace = node.meta.get("stack_trace") or ""
    frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    # Skip torch's own frames: the useful one is the model code that called the op.
    user = [f for f in frames if "/torch/" not in f]
    where = (user or frames or ["<unknown source>"])[-1]
    module = module_path(node, strip_prefix)
    return f"{where} (module {module})" if module else where


def module_path(node, strip_prefix: str = "model.") -> str:
    """The node's innermost nn.Module path, without the adapter's own attribute prefix."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = [v[0] for v in stack.values() if isinstance(v, tuple) and v and isinstance(v[0], str)]
    paths = [p for p in paths if p and not p.startswith("_")]
    if not paths:
        return ""
    path = paths[-1]
    return path[len(strip_prefix):] if strip_prefix and path.startswith(strip_prefix) else path
