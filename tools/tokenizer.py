"""Tokenizers for `mlxgraph generate`: byte-level for the built-in models, else the model's own.

A graph file records its tokenizer in ``metadata.tokenizer``: ``"byte"`` for the built-in
tiny models (token id = the byte's value, vocabulary 256; BOS and EOS from the metadata,
which for the built-ins are the control bytes STX = 2 and ETX = 3, see
exporter/builtins.py), or the Hugging Face model folder it was exported from, whose
``tokenizer.json`` is read with the ``tokenizers`` library. ``transformers`` is not used:
importing it imports torch, and the generate process must not run torch next to MLX's BLAS.

Text comes out through a :class:`StreamDecoder`, which only emits complete characters, so
a multi-byte character split across tokens is printed once it is whole.
"""

import codecs
import json
from pathlib import Path


class TokenizerError(Exception):
    """The graph's tokenizer cannot be loaded, or the text cannot be encoded with it."""


class ByteTokenizer:
    """Token id = byte value (UTF-8); ``bos`` (when >= 0) starts every prompt.

    Args:
        vocab_size: the model's vocabulary (bytes must fit in it).
        bos: the BOS id, or -1 for none.
        specials: ids that are not bytes (BOS, EOS); decoding skips them.
    """

    name = "byte"

    def __init__(self, vocab_size: int, bos: int = -1, specials=()):
        self.vocab_size, self.bos = int(vocab_size), int(bos)
        self.specials = frozenset(int(s) for s in specials) | (
            {self.bos} if self.bos >= 0 else set()
        )

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of ``text``, after BOS.

        Raises:
            TokenizerError: a byte outside the vocabulary, or one that is a special id.
        """
        ids = list(text.encode("utf-8"))
        if ids and max(ids) >= self.vocab_size:
            raise TokenizerError(
                f"byte {max(ids)} of the prompt is outside the model's vocabulary of "
                f"{self.vocab_size}"
            )
        clash = sorted(self.specials.intersection(ids))
        if clash:
            raise TokenizerError(
                f"the prompt contains byte {clash[0]}, which this model uses as a special token"
            )
        return ([self.bos] if self.bos >= 0 else []) + ids

    def stream_decoder(self) -> "StreamDecoder":
        """A fresh incremental decoder."""
        return _ByteStream(self)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (fast tokenizer), loaded with the tokenizers library.

    Args:
        folder: the model folder holding tokenizer.json (and maybe tokenizer_config.json).
        bos: the model's BOS id (-1 none), prepended when the folder asks for it and the
            tokenizer's own post-processor did not add it.
    Raises:
        TokenizerError: no tokenizer.json, or it cannot be read.
    """

    def __init__(self, folder, bos: int = -1):
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(
                f"{folder}: no tokenizer.json (the graph's tokenizer folder); use --prompt-ids"
            )
        try:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the library raises plain Exceptions
            raise TokenizerError(f"{path}: cannot load the tokenizer ({e})") from None
        self.name = str(folder)
        self.bos = int(bos)
        self._add_bos = False
        config = folder / "tokenizer_config.json"
        if config.is_file():
            try:
                self._add_bos = bool(json.loads(config.read_text()).get("add_bos_token", False))
            except (OSError, ValueError):
                pass

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with the tokenizer's special tokens (BOS)."""
        ids = self._tok.encode(text, add_special_tokens=True).ids
        if self._add_bos and self.bos >= 0 and (not ids or ids[0] != self.bos):
            ids = [self.bos] + ids
        return ids

    def decode(self, ids) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def stream_decoder(self) -> "StreamDecoder":
        """A fresh incremental decoder."""
        return _TextStream(self)


class StreamDecoder:
    """Turns tokens into text as they come: ``add(id) -> new text`` and ``flush() -> rest``."""

    def add(self, token: int) -> str:  # pragma: no cover - interface
        """Take the next token; returns the text it completes ('' while a character is partial)."""
        raise NotImplementedError

    def flush(self) -> str:  # pragma: no cover - interface
        """The text still held back, at the end of the stream."""
        raise NotImplementedError


class _ByteStream(StreamDecoder):
    def __init__(self, tok: ByteTokenizer):
        self._tok = tok
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int) -> str:
        if token in self._tok.specials or not 0 <= token < 256:
            return ""
        return self._utf8.decode(bytes([token]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class _TextStream(StreamDecoder):
    """Decodes a sliding window of tokens, so spacing rules that depend on the previous
    token (SentencePiece's leading space) come out right, and holds text back while it
    ends in an incomplete character (U+FFFD)."""

    def __init__(self, tok: HFTokenizer):
        self._tok = tok
        self._ids: list[int] = []
        self._prefix = 0   # window start
        self._read = 0     # tokens already turned into emitted text

    def add(self, token: int) -> str:
        self._ids.append(int(token))
        before = self._tok.decode(self._ids[self._prefix:self._read])
        now = self._tok.decode(self._ids[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return now[len(before):]
        return ""

    def flush(self) -> str:
        before = self._tok.decode(self._ids[self._prefix:self._read])
        now = self._tok.decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return now[len(before):]


def load_tokenizer(metadata, graph_path=None):
    """The tokenizer a graph file records.

    Args:
        metadata: the graph's ModelInfo (tokenizer, vocab_size, bos/eos ids).
        graph_path: the graph file; a relative tokenizer folder is looked up next to it.
    Returns:
        a ByteTokenizer or HFTokenizer.
    Raises:
        TokenizerError: none recorded, or the recorded folder is missing.
    """
    kind = (metadata.tokenizer or "").strip()
    if kind == "byte":
        return ByteTokenizer(metadata.vocab_size, metadata.bos_token_id, metadata.eos_token_ids)
    if not kind:
        raise TokenizerError("the graph records no tokenizer; use --prompt-ids")
    folder = Path(kind).expanduser()
    if not folder.is_absolute() and not folder.is_dir() and graph_path is not None:
        folder = Path(graph_path).parent / folder
    if not folder.is_dir():
        raise TokenizerError(
            f"the graph's tokenizer folder {kind} does not exist here; use --prompt-ids"
        )
    return HFTokenizer(folder, metadata.bos_token_id)


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters other than newline and tab escaped.

    Random-weight models emit arbitrary bytes; an escape sequence must not drive the terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


__all__ = [
    "decode_all",
    "ByteTokenizer",
    "HFTokenizer",
    "StreamDecoder",
    "TokenizerError",
    "load_tokenizer",
    "printable",
]


def decode_all(tokenizer, ids) -> str:
    """The text of ``ids`` as the stream decoder gives it (specials skipped)."""
    dec = tokenizer.stream_decoder()
    return "".join(dec.add(t) for t in ids) + dec.flush()
