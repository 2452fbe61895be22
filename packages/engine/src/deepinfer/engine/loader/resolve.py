"""Turn a user's `model=` string into a local checkpoint directory (downloading a hub id on first use)."""

from __future__ import annotations

import os
import re
from pathlib import Path

# What the engine needs from a hub repo: configs (incl. inference/config.json), tokenizer, chat template, weights.
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TRUE = ("1", "true", "yes", "on")


def resolve_model_path(path_or_repo: str | Path, revision: str | None = None) -> Path:
    """Return the local directory of a checkpoint.

    path_or_repo: an existing local directory (used as is), or a Hugging Face hub id `org/name`, fetched with
    `huggingface_hub.snapshot_download` (config, tokenizer and safetensors files only) into the hub cache on
    first use and read from the cache afterwards. revision: branch, tag or commit for a hub id.
    Raises FileNotFoundError for a path that does not exist, RuntimeError when a hub id cannot be fetched
    (offline with HF_HUB_OFFLINE=1 and not cached, unknown repo or revision, no network).
    """
    if not isinstance(path_or_repo, (str, Path)):
        raise TypeError(f"path_or_repo: expected a str or Path, got {type(path_or_repo).__name__}")
    text = str(path_or_repo)
    path = Path(text).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ValueError(f"path_or_repo: expected a checkpoint directory, got a file: {path}")
    if isinstance(path_or_repo, Path) or not _looks_like_repo_id(text):
        raise FileNotFoundError(f"path_or_repo: no such checkpoint directory: {text!r} (and not an 'org/name' hub id)")
    return _download(text, revision)


def _looks_like_repo_id(text: str) -> bool:
    """`org/name` with no leading `/`, `.` or `~` (those are paths that simply do not exist)."""
    return _REPO_ID.match(text) is not None and not text.startswith((".", "~"))


def _download(repo_id: str, revision: str | None) -> Path:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
    hint = (
        f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '<unset>')}; with HF_HUB_OFFLINE=1 the model must already "
        "be in the local hub cache, otherwise check the repo id, the revision, the token and network access"
    )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise RuntimeError(f"cannot fetch hub id {repo_id!r}: huggingface_hub is not installed ({hint})") from e
    try:
        # local_files_only follows the env var read now, so an offline run never opens a connection even if
        # huggingface_hub was imported before HF_HUB_OFFLINE was set.
        local = snapshot_download(
            repo_id, revision=revision, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline
        )
    except Exception as e:  # the hub raises many types (HTTP, offline, not found, ...); report them all the same way
        where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
        raise RuntimeError(f"cannot fetch hub id {where}: {type(e).__name__}: {e} ({hint})") from e
    return Path(local)
