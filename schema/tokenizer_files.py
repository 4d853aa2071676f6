"""The tokenizer files a graph file embeds, and where they live in the format.

The export reads them from the Hugging Face folder (``--tokenizer DIR`` reads the same set
at run time) and stores each in ``ModelMetadata.extra`` under the key
``tokenizer_file:<file name>`` with the file's UTF-8 text as the value, with
``ModelMetadata.tokenizer = "embedded"``. That is a metadata convention of format 1.0 (no
schema change: any 1.0 reader reads such a file); the reader hands them out apart from the
other extra entries, as ``ModelInfo.tokenizer_files``.
"""

from pathlib import Path

from mlxgraph.schema.errors import Error

# The files of a Hugging Face folder that make up its tokenizer and its stop tokens.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
# tokenizer.json of the largest vocabularies is ~20 MB; past this a folder is refused.
MAX_TOKENIZER_FILE_BYTES = 64 << 20


EXTRA_PREFIX = "tokenizer_file:"


class TokenizerFilesError(Error):
    """A folder's tokenizer files cannot be read."""


def read_tokenizer_folder(folder) -> dict:
    """{file name: text} of the tokenizer files in a Hugging Face folder.

    Raises:
        TokenizerFilesError: not a folder, no tokenizer.json, a file too large or not UTF-8.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise TokenizerFilesError(f"{folder}: not a folder")
    files = {}
    for name in TOKENIZER_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_TOKENIZER_FILE_BYTES:
            raise TokenizerFilesError(f"{path}: larger than {MAX_TOKENIZER_FILE_BYTES >> 20} MiB")
        try:
            files[name] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerFilesError(f"{path}: cannot read ({e})") from None
    if "tokenizer.json" not in files:
        raise TokenizerFilesError(f"{folder}: no tokenizer.json (a fast tokenizer is needed)")
    return files


def split_extra(extra: dict) -> tuple:
    """(other extra entries, {file name: text}) of a file's metadata extra map."""
    files = {k[len(EXTRA_PREFIX) :]: v for k, v in extra.items() if k.startswith(EXTRA_PREFIX)}
    rest = {k: v for k, v in extra.items() if not k.startswith(EXTRA_PREFIX)}
    return rest, files


def join_extra(extra: dict, files: dict) -> dict:
    """The extra map to write: ``extra`` plus each file under its ``tokenizer_file:`` key.

    Raises:
        ValueError: ``extra`` already uses the prefix (it is reserved for the files).
    """
    clash = sorted(k for k in extra if str(k).startswith(EXTRA_PREFIX))
    if clash:
        raise ValueError(
            f"metadata extra key {clash[0]!r}: the {EXTRA_PREFIX!r} prefix is reserved "
            "for embedded tokenizer files (ModelInfo.tokenizer_files)"
        )
    return {**extra, **{EXTRA_PREFIX + k: v for k, v in files.items()}}


__all__ = [
    "EXTRA_PREFIX",
    "MAX_TOKENIZER_FILE_BYTES",
    "TOKENIZER_FILES",
    "TokenizerFilesError",
    "join_extra",
    "read_tokenizer_folder",
    "split_extra",
]
