"""``export(..., tokenizer=DIR)``: another folder's tokenizer files embedded in the graph.

For checkpoints that come without their tokenizer (a fine-tune's output folder, a model
saved with ``save_pretrained`` alone): the files are read as from a model folder, and
refused when the tokenizer could produce ids the model has no embedding for.
"""

import json
from pathlib import Path

from mlxgraph.exporter.errors import ExportError
from mlxgraph.schema.tokenizer_files import TokenizerFilesError, read_tokenizer_folder


def largest_id(tokenizer_json: str) -> int:
    """The largest token id a tokenizer.json can produce (its vocabulary and added tokens).

    Raises:
        ValueError: not JSON, or no vocabulary this reader knows.
    """
    doc = json.loads(tokenizer_json)
    vocab = (doc.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        ids = [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...] by id
        ids = [len(vocab) - 1] if vocab else []
    else:
        raise ValueError("its model has no vocabulary")
    ids += [t["id"] for t in doc.get("added_tokens") or () if isinstance(t.get("id"), int)]
    if not ids:
        raise ValueError("its vocabulary is empty")
    return max(ids)


def read_tokenizer(folder) -> dict:
    """{file name: text} of ``folder``'s tokenizer files, read before the model loads.

    Raises:
        ExportError: not a folder, no tokenizer.json, a file too large or unreadable.
    """
    try:
        return read_tokenizer_folder(Path(folder))
    except TokenizerFilesError as e:
        raise ExportError(f"cannot embed the tokenizer: {e}") from None


def tokenizer_source(folder, files: dict, vocab_size: int, source: dict) -> dict:
    """The source-info entries (tokenizer, files) for ``files`` read from ``folder``.

    Raises:
        ExportError: a built-in with the byte vocabulary, or a tokenizer whose ids reach
            past ``vocab_size`` (the model's embedding rows).
    """
    if source.get("tokenizer") == "byte":
        raise ExportError(f"{source['source']} is a built-in whose tokens are bytes: it "
                          "takes no tokenizer")
    try:
        top = largest_id(files["tokenizer.json"])
    except ValueError as e:
        raise ExportError(f"{folder}: tokenizer.json: {e}") from None
    if top >= vocab_size:
        raise ExportError(f"{folder}: the tokenizer produces ids up to {top}, past the model's "
                          f"vocabulary of {vocab_size}")
    return {"tokenizer": "embedded", "files": files}


__all__ = ["largest_id", "read_tokenizer", "tokenizer_source"]
