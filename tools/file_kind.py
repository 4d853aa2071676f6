"""What a path given as a graph file really is, so a wrong one gets a useful sentence.

A new user hands ``generate`` the model folder, or the safetensors file, before exporting.
The verifier's message for those ("identifier b'\\x00\\x00\\x00\\x00'") is true but says
nothing useful; this module recognises the common cases from the first bytes.
"""

import stat
from pathlib import Path

from mlxgraph.schema.format import FILE_IDENTIFIER

# (test on the first 16 bytes, what the file looks like)
_SNIFFERS = (
    (lambda head: head[:4] == b"GGUF", "a GGUF model file (llama.cpp)"),
    (lambda head: head[:4] == b"PK\x03\x04", "a zip archive (a PyTorch checkpoint?)"),
    (
        lambda head: (
            len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 40
        ),
        "a safetensors weights file",
    ),
    (lambda head: head.lstrip()[:1] in (b"{", b"["), "a JSON file"),
)


def _regular(p: Path) -> bool:
    # Opening a FIFO would block: only regular files are sniffed.
    try:
        return stat.S_ISREG(p.stat().st_mode)
    except OSError:
        return False


def _export_hint(path: Path) -> str:
    return f"export it first: mlxgraph export {path} -o {path.name or 'model'}.mlxg"


def graph_path_problem(path) -> str | None:
    """Why ``path`` cannot be a graph file, in one sentence, or None when it may be one.

    Args:
        path: what the user gave as a graph file.
    Returns:
        "<path>: no such file", "<path>: a model folder, not a regular file: export it
        first: ...", "<path>: not a graph file: it looks like a safetensors weights file", ...
        or None (a file that starts with the graph identifier, or one not recognised: the
        verifier then says what is wrong).
    """
    p = Path(path)
    if p.is_dir():
        if (p / "config.json").is_file():
            return f"{p}: a model folder, not a regular file: {_export_hint(p)}"
        return f"{p}: a folder, not a regular file (a .mlxg graph file)"
    if not p.exists():
        return f"{p}: no such file"
    if not _regular(p):
        return None   # the reader refuses it without blocking on it (a FIFO, a device)
    try:
        with p.open("rb") as f:
            f.read(1)
    except OSError as e:
        return f"{p}: cannot read ({e.strerror or e})"
    kind = looks_like(p)
    return f"{p}: not a graph file: {kind}" if kind else None


def looks_like(path) -> str | None:
    """What a file that is not a graph file looks like, with what to do, or None when it
    starts with the graph identifier, cannot be read, or is not recognised.

    Returns:
        e.g. "it looks like a safetensors weights file; export it first: mlxgraph export ...".
    """
    p = Path(path)
    if not _regular(p):
        return None
    try:
        with p.open("rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head[4:8] == FILE_IDENTIFIER:
        return None
    if p.suffix == ".onnx":
        return "it looks like an ONNX model; mlxgraph exports Hugging Face folders"
    for test, kind in _SNIFFERS:
        if test(head):
            weights = kind.startswith(("a safetensors", "a zip"))
            hint = (
                _export_hint(p.parent)
                if weights
                else "graph files are written by `mlxgraph export`"
            )
            return f"it looks like {kind}; {hint}"
    return None


__all__ = ["graph_path_problem", "looks_like"]
