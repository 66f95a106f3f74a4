"""A model the local Hugging Face cache already holds, found by its repo id, offline.

``execstate serve Qwen/Qwen3-30B-A3B`` (a Hugging Face repo id, ``namespace/name``) serves the
snapshot that ``huggingface-cli download`` / ``hf download`` / ``transformers`` left in the cache,
with ``HF_HUB_OFFLINE`` semantics: the cache is read, the network never (execstate downloads
nothing at run time). :func:`cached_snapshot` asks ``huggingface_hub.snapshot_download`` with
``local_files_only=True`` for the snapshot the revision's ref points at (``refs/main`` by
default, as ``from_pretrained`` offline does), in the cache directory Hugging Face's own variables
name at the time of the call:

``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.

A repo id that is not there, a snapshot without ``config.json`` or without weights
(``*.safetensors``), is :class:`ModelNotCachedError`: one line naming the repo, the cache directory
searched and how to fetch it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from execstate.model.errors import UnknownModelError

# Hugging Face repo ids: "namespace/name", letters, digits, '-', '_' and '.', at most 96 characters
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class ModelNotCachedError(UnknownModelError):
    """A repo id the local Hugging Face cache does not hold whole (nothing is downloaded)."""


def looks_like_repo_id(name: str) -> bool:
    """Whether ``name`` has the shape of a Hugging Face repo id (``namespace/name``)."""
    return len(name) <= 96 and _REPO_ID.fullmatch(name) is not None and ".." not in name


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache directory the environment names now (module docstring)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The directory of ``repo_id``'s snapshot at ``revision`` (a branch, tag or commit; None:
    ``main``) in the local cache; :class:`ModelNotCachedError` unless it holds ``config.json`` and
    weights. Reads the cache only."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = hub_cache_dir()
    fetch = (f"fetch it once where there is a network (`hf download {repo_id}`) into that cache, or give "
             "the model's directory")
    try:
        path = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        held = _snapshots(cache, repo_id)
        where = f"; it holds the snapshot(s) {', '.join(held)} but no ref for {revision or 'main'}" if held else ""
        raise ModelNotCachedError(f"model {repo_id!r} is not in the Hugging Face cache at {cache}{where} "
                                  f"(execstate never downloads: {fetch})") from None
    missing = [what for what, ok in (("config.json", (path / "config.json").is_file()),
                                     ("*.safetensors weights", any(path.glob("*.safetensors")))) if not ok]
    if missing:
        raise ModelNotCachedError(f"model {repo_id!r}: the snapshot at {path} has no {' and no '.join(missing)} "
                                  f"(a partial download; {fetch})")
    return path


def _snapshots(cache: Path, repo_id: str) -> list[str]:
    """The snapshot (commit) directories the cache holds for ``repo_id``, if any."""
    folder = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
