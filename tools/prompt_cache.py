"""`generate --prompt-cache FILE`: reuse a saved prompt's KV cache, then save the new one.

When FILE exists, holds token ids, was saved from this graph with this cache policy, and
its history is a prefix of the prompt, the session starts from it and only the rest of
the prompt is prefilled. After the prefill FILE is replaced by the cache of the prompt
without its last token (that token's step gives the first generated token, so a rerun
with the same prompt prefills nothing). A file from another graph, or a damaged one, is
refused (exit 2) rather than overwritten.
"""

import os
import time
from dataclasses import dataclass

from mlxgraph.tools.output import ToolError


@dataclass
class PromptCacheReport:
    """What the prompt cache did (for the stats and the JSON document)."""

    path: str
    reused_tokens: int = 0
    saved_tokens: int | None = None
    file_bytes: int | None = None
    load_seconds: float = 0.0
    save_seconds: float = 0.0
    note: str = ""

    def as_dict(self) -> dict:
        """JSON-ready fields."""
        return dict(self.__dict__)


def load_prompt_cache(path, session, prompt_ids) -> PromptCacheReport:
    """Restore ``path`` into ``session`` when its history is a prefix of ``prompt_ids``.

    Raises:
        ToolError: the file is unreadable, damaged or saved from another graph.
    """
    from mlxgraph.interpreter.cache.file import CacheFile
    from mlxgraph.interpreter.errors import CacheFileError

    report = PromptCacheReport(str(path))
    if not os.path.exists(path):
        report.note = "no file yet"
        return report
    t0 = time.perf_counter()
    try:
        # The seal is checked by the restore, or before the file is replaced: a damaged
        # file is refused either way, and a huge one is measured against the graph first.
        cache = CacheFile(path, check_seal=False)
        if cache.graph != session.program.fingerprint:
            raise ToolError(f"--prompt-cache: {path} was saved from another graph; "
                            "delete it or use another file")
        tokens = cache.tokens
        if tokens is None or list(tokens) != list(prompt_ids[: len(tokens)]):
            cache.check_seal()
            report.note = "its history is not a prefix of this prompt; prefilled from the start"
            return report
        if cache.policy != session.policy:
            cache.check_seal()
            report.note = (
                "saved with another cache policy (capacity, kv dtype/bits, windows, "
                "prefill chunk); not reused"
            )
            return report
        session.restore(cache)
    except CacheFileError as e:
        raise ToolError(f"--prompt-cache: {e}") from None
    if session.length == len(prompt_ids):  # the last prompt token must be stepped for its logits
        if session.stores and min(s.max_trim for s in session.stores.values()) < 1:
            session.reset()
            report.note = (
                "holds the whole prompt and cannot rewind one token; prefilled from the start"
            )
            return report
        session.trim(1)
    report.reused_tokens = session.length
    report.load_seconds = time.perf_counter() - t0
    return report


def save_prompt_cache(report: PromptCacheReport, session, prompt_ids) -> None:
    """Save ``session`` (holding the prompt but its last token) to the report's path.

    Raises:
        ToolError: the file cannot be written.
    """
    t0 = time.perf_counter()
    try:
        report.file_bytes = session.save(report.path, tokens=list(prompt_ids[: session.length]))
    except OSError as e:
        raise ToolError(f"--prompt-cache: cannot write {report.path} ({e.strerror or e})") from None
    report.saved_tokens = session.length
    report.save_seconds = time.perf_counter() - t0
