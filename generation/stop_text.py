"""Stop strings on streamed text: emit what cannot be part of a stop string, hold the rest.

Text arrives in pieces ("Hel", "lo\\n", "User:"); a stop string can straddle pieces, so the
end of the text that is still a prefix of some stop string is held back until the next
piece decides. The stop string itself is never emitted.
"""


class StopText:
    """Filters streamed text for stop strings.

    Args:
        stops: the stop strings (empty ones are ignored).
    """

    def __init__(self, stops=()):
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, piece: str) -> tuple:
        """Take the next piece of text.

        Returns:
            (text to emit, True when a stop string was reached; the text then ends before it).
        """
        if not self.stops:
            return piece, False
        text = self._held + piece
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return text[: min(hits)], True
        keep = self._longest_partial(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The text held back, at the end of the stream (it ended no stop string)."""
        held, self._held = self._held, ""
        return held

    def _longest_partial(self, text: str) -> int:
        """Length of the longest end of ``text`` that starts some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best


__all__ = ["StopText"]
