"""The export's own errors (the lowering's and the adapter's live with them)."""

from mlxgraph.schema.errors import Error


class ExportError(Error):
    """The export cannot start: unknown model, unreadable folder, bad option.

    ``option`` names the export() parameter at fault (None when it is not an option), so a
    front end can name its own flag instead: ``message_for({"max_seq_len": "--max-seq-len"})``.
    """

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option

    def message_for(self, names: dict) -> str:
        """The message with the option's parameter name replaced by ``names[option]``."""
        text = str(self)
        return text.replace(self.option, names[self.option]) if self.option in names else text


class UnsupportedModelError(Error):
    """The model cannot be exported exactly, so it is refused (the CLI's exit 1).

    Every refusal has one shape, one line: ``<model type>: <where>: <why>``. ``reason`` is
    the where and why; ``model_type`` (the config's) is filled in by export() once known.
    The adapter's, the tracer's and the lowering's refusals are subclasses.
    """

    def __init__(self, reason: str, model_type: str = ""):
        # One line, whatever a caller passes (torch's and transformers' texts run to pages).
        self.reason = " ".join(str(reason).split())
        self.model_type = model_type
        super().__init__(self.reason)

    def __str__(self) -> str:
        return f"{self.model_type}: {self.reason}" if self.model_type else self.reason


class TraceError(UnsupportedModelError):
    """torch.export could not trace the adapted model (e.g. data-dependent control flow)."""


__all__ = ["ExportError", "TraceError", "UnsupportedModelError"]
