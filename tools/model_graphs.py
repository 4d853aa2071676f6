"""A model given where a graph file is expected: exported once into a content-addressed cache.

mlx-lm users hand `generate`, `chat` and `serve` a Hugging Face folder or a Hub repo id;
those commands take them too (and the built-in names), export the model once and run the
graph. The cache's key is a hash of everything the graph depends on: the model's files
(their contents: a changed weight is a new graph, a renamed folder is not), the exporter's
and format's own source, and the versions of torch and transformers. So a cached graph is
never stale, and two folders with the same files share one graph.

Hashing a large folder on every run would cost seconds, so each file's hash is remembered
by (path, size, mtime, inode), as git remembers its index: a file that changed is hashed
again. The export runs in a child process (`mlxgraph export`, its progress on stderr): the
running command never imports torch, and the export's peak memory is returned before the
model is loaded. Concurrent commands wait for one export (a lock per key).

The cache is ``MLXGRAPH_GRAPH_CACHE`` (default ``$XDG_CACHE_HOME/mlxgraph/graphs``, or
``~/.cache/mlxgraph/graphs``); deleting it is always safe.
"""

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from mlxgraph.interpreter.knobs import GRAPH_CACHE
from mlxgraph.schema.errors import Error

KEY_VERSION = 1
_PACKAGE = Path(__file__).resolve().parent.parent  # the folder holding exporter/ and schema/
# What an export's output depends on, besides the model: this code and these libraries.
_CODE = ("exporter", "schema", "generated")
_LIBRARIES = ("torch", "transformers", "safetensors")


class ModelGraphError(Error, RuntimeError):
    """The export into the cache failed; ``code`` is the export's exit code (its message
    is already on stderr)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def cache_root() -> Path:
    """The graph cache folder (not created here)."""
    given = GRAPH_CACHE.read()
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlxgraph" / "graphs"


def is_model_name(name: str) -> bool:
    """Whether ``name`` names a model rather than a graph file: a folder with config.json,
    a built-in name, or a Hub repo id (org/name) that is no path here."""
    from mlxgraph.exporter.builtin_names import BUILTINS, TRAINED_BUILTINS
    from mlxgraph.exporter.hub import looks_like_repo_id

    p = Path(name)
    return (p.is_dir() and (p / "config.json").is_file()) or (
        name in (*BUILTINS, *TRAINED_BUILTINS) and not p.exists()) or looks_like_repo_id(name)


def _file_hash(path: Path, index: dict) -> str:
    st = path.stat()  # (follows links: the Hub's snapshots link to blobs)
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    if key not in index:
        h = hashlib.blake2b(digest_size=16)
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        index[key] = h.hexdigest()
    return index[key]


def _code_hash() -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in _CODE:
        for p in sorted((_PACKAGE / part).rglob("*")):
            if p.suffix in (".py", ".fbs", ".json", ".safetensors") and p.is_file():
                h.update(str(p.relative_to(_PACKAGE)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _versions() -> dict:
    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _resolve(name: str) -> Path | None:
    """The folder of ``name``'s files, or None for a random built-in (code only)."""
    from mlxgraph.exporter.builtin_names import BUILTINS, TRAINED_BUILTINS
    from mlxgraph.exporter.hub import hub_folder, looks_like_repo_id

    p = Path(name)
    if p.is_dir():
        return p
    if name in TRAINED_BUILTINS:
        return TRAINED_BUILTINS[name]
    if name in BUILTINS:
        return None
    if looks_like_repo_id(name):
        return hub_folder(name)
    return p


def graph_key(name: str, root: Path) -> str:
    """The content hash that names ``name``'s graph in the cache."""
    folder = _resolve(name)
    index_path = root / "file-hashes.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    known = len(index)
    files = [["builtin", name]] if folder is None else [
        [p.name, _file_hash(p, index)] for p in sorted(folder.iterdir()) if p.is_file()]
    if len(index) != known:  # a file hashed now: remember it (a cached run writes nothing)
        tmp = index_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, index_path)
    doc = {"v": KEY_VERSION, "code": _code_hash(), "libraries": _versions(), "files": files}
    return hashlib.blake2b(json.dumps(doc, sort_keys=True).encode(), digest_size=16).hexdigest()


def _export(name: str, out: Path) -> None:
    print(f"mlxgraph: exporting {name} once, into the graph cache: {out}", file=sys.stderr,
          flush=True)
    r = subprocess.run([sys.executable, "-m", "mlxgraph", "export", name, "-o", str(out)],
                       stdout=subprocess.DEVNULL)  # (its progress and errors: stderr)
    if r.returncode != 0:
        raise ModelGraphError(f"{name}: the export failed", r.returncode)


def model_graph(name: str) -> tuple:
    """(graph path, True when exported now) for model ``name``: the cached graph, exported
    first when the cache does not hold it.

    Raises:
        ModelGraphError: the export failed (exit code 1 for a model it cannot export).
        mlxgraph.exporter.ExportError: a Hub repo id that cannot be resolved.
        OSError: the cache folder cannot be written.
    """
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = graph_key(name, root)
    out = root / f"{key}.mlxg"
    with open(root / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another command may be exporting it right now
        if out.is_file():
            return out, False
        _export(name, out)
    return out, True




def use_model_graph(args) -> None:
    """Point ``args.graph`` at the cached graph when it names a model (exporting it first),
    keeping the name in ``args.model`` (None when ``args.graph`` is a graph file); says on
    stderr which graph runs.

    Raises:
        ToolError: a Hub repo id that cannot be resolved, or a cache that cannot be written.
        ModelGraphError: the export failed (its own message is on stderr).
    """
    from mlxgraph.exporter.errors import ExportError
    from mlxgraph.tools.output import ToolError, printable

    args.model = None
    if not is_model_name(args.graph):
        return
    try:
        path, fresh = model_graph(args.graph)
    except ExportError as e:
        raise ToolError(str(e)) from None
    except OSError as e:
        raise ToolError(f"the graph cache {cache_root()}: {e.strerror or e}") from None
    how = "exported now" if fresh else "cached"
    print(printable(f"mlxgraph: graph: {path} ({args.graph}, {how})"), file=sys.stderr,
          flush=True)
    args.model, args.graph = args.graph, str(path)


def model_id(args) -> str:
    """The name a server gives its model: the folder's name, the repo id or built-in name,
    or the graph file's name without .mlxg."""
    if args.model is None:
        return Path(args.graph).name.removesuffix(".mlxg")
    return Path(args.model).name if Path(args.model).is_dir() else args.model


__all__ = ["ModelGraphError", "cache_root", "graph_key", "is_model_name", "model_graph",
           "model_id", "use_model_graph"]
