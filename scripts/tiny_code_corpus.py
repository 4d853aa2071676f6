"""tiny-code's corpus: the pinned list of standard-library files (tiny_code_corpus.txt).

Each line of the list is ``split sha256 bytes path`` (path relative to the stdlib folder;
split ``train`` or ``heldout``). ``list_corpus`` is the rule that made the list;
``read_corpus`` reads the listed files from a Python's stdlib and says which differ.
Shared by scripts/train_tiny_code.py and benchmarks/perplexity_bench.py.
"""

import hashlib
import platform
import sysconfig
from pathlib import Path

CORPUS_LIST = Path(__file__).with_name("tiny_code_corpus.txt")
# Folders of the stdlib that are tests, tools' own data or encoding tables, not idiomatic code.
_SKIP_PARTS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "encodings",
               "pydoc_data", "__pycache__"}
# Tables of data rather than code.
_SKIP_FILES = {"html/entities.py", "stringprep.py"}
HELDOUT_EVERY = 20   # every 20th listed file (sorted by path) is held out


def stdlib_root() -> Path:
    """The running Python's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_corpus(root: Path) -> list[str]:
    """Lines of the corpus list for the stdlib at ``root`` (the rule that made the pinned list)."""
    paths = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                   if not _SKIP_PARTS.intersection(p.relative_to(root).parts[:-1])
                   and p.relative_to(root).as_posix() not in _SKIP_FILES
                   and not p.name.startswith("_sysconfigdata")
                   and not p.parts[-2].startswith("config-"))
    lines = [f"# python {platform.python_version()} stdlib; split sha256 bytes path"]
    for i, rel in enumerate(paths):
        data = (root / rel).read_bytes()
        split = "heldout" if i % HELDOUT_EVERY == HELDOUT_EVERY // 2 else "train"
        lines.append(f"{split} {hashlib.sha256(data).hexdigest()} {len(data)} {rel}")
    return lines


def read_corpus(root: Path) -> tuple[dict, list[str]]:
    """({"train": texts, "heldout": texts}, listed paths missing or different at ``root``).

    A listed file that exists but differs from its pinned hash is still read (the caller
    decides whether a different corpus is acceptable); a missing one is left out.
    """
    splits, bad = {"train": [], "heldout": []}, []
    for line in CORPUS_LIST.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        split, digest, _size, rel = line.split(" ", 3)
        path = root / rel
        data = path.read_bytes() if path.is_file() else None
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            bad.append(rel)
            if data is None:
                continue
        splits[split].append(data.decode("utf-8"))
    return splits, bad
