"""A Hugging Face Hub cache built on disk, in huggingface_hub's own layout, for tests.

``models--<org>--<name>/blobs/<hash>`` holds each file once, ``snapshots/<commit>/<file>``
links to it, ``refs/main`` names the commit: what ``hf download`` leaves behind, so
``snapshot_download`` finds the repo offline exactly as it finds a downloaded one.
"""

import hashlib
import shutil
from pathlib import Path

TINY_CODE = Path(__file__).resolve().parent.parent / "exporter" / "models" / "tiny-code"


def add_repo(cache: Path, repo_id: str, folder: Path) -> Path:
    """Put ``folder``'s files into ``cache`` as repo ``repo_id``'s main revision; returns the
    snapshot folder."""
    org, name = repo_id.split("/")
    repo = cache / f"models--{org}--{name}"
    files = sorted(p for p in folder.iterdir() if p.is_file())
    commit = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for p in files:
        blob = repo / "blobs" / hashlib.sha256(p.read_bytes()).hexdigest()
        shutil.copyfile(p, blob)
        (snapshot / p.name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
