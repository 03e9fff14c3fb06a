"""Where ``--model`` points: a built-in name, a checkpoint directory, or a Hugging Face hub id.

A hub id (``ORG/NAME``) is resolved with ``huggingface_hub.snapshot_download`` in the process
that loads the model (the replica), because each node has its own cache: a replica on another
node finds (or downloads) the checkpoint in its own ``HF_HOME``, not in the serve process's.
``huggingface_hub`` itself reads ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` (cache only,
no network) and ``HF_TOKEN`` (gated and private repositories).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Only what the loader reads: no *.bin / *.pth / *.gguf duplicates of the weights.
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelNotFoundError(ValueError):
    """``--model`` names nothing this process can load; the message says where it looked."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved ``--model``: ``builtin`` (a ``tiny-*`` name) or ``path`` (a checkpoint
    directory); ``name`` is what the user gave."""

    name: str
    builtin: str | None = None
    path: str | None = None


def hub_cache_dir() -> str:
    """The cache ``snapshot_download`` reads and fills (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def is_hub_id(model: str) -> bool:
    return bool(_HUB_ID.match(model)) and not model.startswith((".", "/"))


def resolve(model: str, builtins: frozenset[str], revision: str | None = None) -> ModelSource:
    """``model`` as something to load: a name in ``builtins``, an existing directory, or a hub
    id downloaded (or found in the cache) at ``revision`` (default: ``main``). Raises
    ``ModelNotFoundError`` naming the model, and for a hub id the cache it looked in."""
    if model in builtins:
        return ModelSource(model, builtin=model)
    if os.path.isdir(model):
        return ModelSource(model, path=os.path.abspath(model))
    if not is_hub_id(model):
        raise ModelNotFoundError(
            f"unknown model {model!r}: not a built-in ({', '.join(sorted(builtins))}), an existing "
            "checkpoint directory or a hub id ORG/NAME"
        )
    return ModelSource(model, path=download(model, revision))


def download(repo_id: str, revision: str | None) -> str:
    """The local snapshot directory of ``repo_id`` at ``revision``."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision}" if revision else ""
    offline = " (HF_HUB_OFFLINE is set: the cache only)" if constants.HF_HUB_OFFLINE else ""
    where = f"hub id {repo_id!r}{at}: looked in the cache {hub_cache_dir()}{offline}"
    try:
        return snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=CHECKPOINT_FILES,
            token=os.environ.get("HF_TOKEN") or None,
        )
    except GatedRepoError as exc:
        raise ModelNotFoundError(f"{where}; the repository is gated: set HF_TOKEN") from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ModelNotFoundError(f"{where}; the hub has no such model or revision") from exc
    except LocalEntryNotFoundError as exc:
        raise ModelNotFoundError(
            f"{where}; not there, and it could not be downloaded ({exc.__class__.__name__})"
        ) from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ModelNotFoundError(f"{where}; download failed: {exc}") from exc
