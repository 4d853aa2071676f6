"""A Hugging Face Hub repo id (``org/name``) to the folder of its files in the Hub's cache.

``huggingface_hub`` (installed with transformers) does the work: its cache layout, tokens,
revisions and ``HF_HUB_OFFLINE``. Only what an export reads is fetched: JSON files
(config, tokenizer, generation config), safetensors weights and chat templates, never
pickled ``*.bin`` checkpoints. Offline, a cached repo is used as it is and a missing one
says how to fetch it.
"""

import re
from pathlib import Path

from mlxgraph.exporter.errors import ExportError

# org/name as the Hub spells it (letters, digits, '-', '_', '.'), optionally @revision.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
# What export reads from a folder (exporter/model_loading.py, schema/tokenizer_files.py).
FETCHED = ["*.json", "*.safetensors", "*.jinja"]


def looks_like_repo_id(name: str) -> bool:
    """Whether ``name`` is a Hub repo id rather than a path: ``org/name`` (``@revision``
    optional) that names nothing on this disk."""
    return bool(_REPO_ID.match(name)) and not Path(name).exists()


def _offline() -> bool:
    from huggingface_hub import constants  # (it reads HF_HUB_OFFLINE once, at import)

    return bool(constants.HF_HUB_OFFLINE)


def hub_folder(name: str) -> Path:
    """The cached snapshot folder of repo ``name`` (``org/name[@revision]``), downloading
    what export reads when it is not cached and the Hub may be reached.

    Raises:
        ExportError: one line: not cached while offline (with the command that fetches
            it), no such repo, a gated repo, or the Hub could not be reached.
    """
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # transformers brings it; a trimmed install may not
        raise ExportError(f"{name}: a Hub repo id needs huggingface_hub: "
                          "pip install huggingface_hub") from None
    repo_id, _, revision = name.partition("@")
    try:
        return Path(snapshot_download(repo_id, revision=revision or None,
                                      allow_patterns=FETCHED))
    except GatedRepoError:
        raise ExportError(f"{name}: a gated repo: accept its terms on huggingface.co, then "
                          "`hf auth login`") from None
    except RepositoryNotFoundError:
        raise ExportError(f"{name}: no such model on the Hugging Face Hub (a private one "
                          "needs `hf auth login`), and no such folder here") from None
    except RevisionNotFoundError:
        raise ExportError(f"{name}: the repo has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        if _offline():
            raise ExportError(
                f"{name}: not in the Hugging Face cache and HF_HUB_OFFLINE is set: fetch it "
                f"first with `hf download {repo_id}` (or unset HF_HUB_OFFLINE)") from None
        raise ExportError(f"{name}: not in the Hugging Face cache, and the Hub could not be "
                          "reached") from None
    except (OSError, ValueError) as e:  # network, disk, a malformed id
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ExportError(f"{name}: cannot fetch it from the Hugging Face Hub: {line}") from None


__all__ = ["FETCHED", "hub_folder", "looks_like_repo_id"]
