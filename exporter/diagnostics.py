"""What the export reports about a model it cannot lower: problems and their sources."""

from dataclasses import dataclass

from mlxgraph.schema.errors import Error


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


class UnsupportedOpsError(Error):
    """The model uses ops the exporter cannot lower; ``problems`` lists all of them."""

    def __init__(self, problems):
        self.problems = list(problems)
        targets = sorted({p.target for p in self.problems})
        lines = [f"{len(targets)} unsupported op(s): {', '.join(targets)}"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


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
