"""Which module was running when tracing failed, and what torch's error means, in one line:
torch.export's own errors say neither (and run to pages)."""

import torch


class ModuleScope:
    """Context manager: tracks the innermost running submodule of ``model`` while active.

    After an exception, ``failed_in`` is ``"<path> (<class>)"`` of the innermost module
    that had started and not finished (None if the failure happened outside them all).
    Hooks are removed on exit, so the model is left as it was.
    """

    def __init__(self, model: torch.nn.Module, prefix: str = ""):
        self.model, self.prefix = model, prefix
        self.stack, self.handles, self.failed_in = [], [], None

    def __enter__(self):
        for path, module in self.model.named_modules():
            name = f"{self.prefix}{path}" if path else type(self.model).__name__
            label = f"{name} ({type(module).__name__})" if path else name
            self.handles.append(module.register_forward_pre_hook(self._enter(label)))
            # Not always_call: a module that raises stays on the stack, which is the point.
            self.handles.append(module.register_forward_hook(self._leave))
        return self

    def _enter(self, label):
        def hook(_module, _args):
            self.stack.append(label)

        return hook

    def _leave(self, _module, _args, _out):
        if self.stack:
            self.stack.pop()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.stack:
            self.failed_in = self.stack[-1]
        for h in self.handles:
            h.remove()
        self.handles = []
        return False


# torch's errors that mean "the model's code cannot be one graph", said in words.
_TORCH_REASONS = (
    ("GuardOnDataDependentSymNode",
     "control flow or a shape depends on tensor values (data-dependent), which one graph "
     "cannot follow"),
    ("Constraints violated",
     "the code fixes the sequence length to the traced example's, so no graph serves every "
     "length"),
)


def torch_reason(e: Exception, limit: int = 240) -> str:
    """One line: what torch's error means where known, then its own first informative line."""
    text = f"{type(e).__name__}: {e}"
    lines = [ln.strip(" -") for ln in str(e).strip().splitlines()]
    # A constraint violation's first line says only "Constraints violated (T)!": the
    # detail is the next one.
    detail = next((ln for ln in lines if ln and not ln.startswith("Constraints violated")),
                  lines[0] if lines else "")
    detail = detail if len(detail) <= limit else detail[:limit] + "..."
    own = f"{type(e).__name__}: {detail}"
    known = next((why for key, why in _TORCH_REASONS if key in text), None)
    return f"{known} ({own})" if known else own
