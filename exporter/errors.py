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


class TraceError(Error):
    """torch.export could not trace the adapted model (e.g. data-dependent control flow)."""


__all__ = ["ExportError", "TraceError"]
