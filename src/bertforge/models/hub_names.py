"""Model names from the Hugging Face Hub: ``bert-base-uncased``, ``google-bert/bert-base-uncased``
or ``NAME@REVISION`` (a branch, tag or commit) -> a local snapshot directory, through
``huggingface_hub`` and its cache.

What a model setting names, in this order (``bertforge.models.loading`` applies it):

1. an existing local path (a model directory or a config.json) always wins;
2. where a fresh model is wanted (pretraining's ``model``), a bertforge preset name;
3. a Hub repo id: its cached snapshot when the cache holds what is needed (no network then),
   else a download of config.json, the tokenizer files, generation_config.json and the
   weights (``model*.safetensors``; ``pytorch_model*.bin`` only when the repo has no
   safetensors). Nothing is downloaded when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``,
   or ``huggingface_hub.constants.HF_HUB_OFFLINE``) is set.

The cache is huggingface_hub's (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``), read when a name is resolved, so it is shared with transformers.
"""

from __future__ import annotations

import glob
import importlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from bertforge.errors import ConfigError

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
EXTRA_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
               "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json")
"""Files fetched with config.json besides the weights (those that exist in the repo)."""

_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")
_SAFETENSORS = re.compile(r"model(?:-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json")
_PICKLED = re.compile(r"pytorch_model(?:-\d+-of-\d+)?\.bin|pytorch_model\.bin\.index\.json")
_TRUE = ("1", "on", "yes", "true")
_FILE_SUFFIXES = (".json", ".jsonl", ".txt", ".yaml", ".yml", ".csv", ".tsv", ".bin", ".pt",
                  ".pth", ".ckpt", ".safetensors", ".onnx", ".model", ".gz", ".tar", ".zip")
"""A name ending so is a file the user meant, not a Hub model."""


@dataclass(frozen=True)
class HubName:
    """A Hub model repo id and the revision asked for (None: the default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hub_name(text: str) -> HubName | None:
    """The Hub name ``text`` spells (``ORG/NAME`` or ``NAME``, optionally ``@REVISION``), or None
    when it cannot be one: a path with more than one folder, one starting with ``.`` or ``/``,
    a file name (``config.json``, ``vocab.txt``...), spaces, ``--`` or ``..``."""
    repo, at, revision = text.partition("@")
    if (at and not revision) or repo.lower().endswith(_FILE_SUFFIXES) or len(repo) > 96:
        return None
    if not _REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo:
        return None
    return HubName(repo, revision or None)


def hub_offline() -> bool:
    """Whether the Hub may not be reached: ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` as
    they are now, or huggingface_hub's constant (set when it was imported, or by a program)."""
    if any(os.environ.get(k, "").strip().lower() in _TRUE
           for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, by the environment as it is now."""
    env = os.environ
    chosen = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not chosen and env.get("HF_HOME"):
        chosen = os.path.join(env["HF_HOME"], "hub")
    if not chosen:
        from huggingface_hub import constants

        chosen = constants.HF_HUB_CACHE
    return Path(os.path.expandvars(os.path.expanduser(chosen)))


def has_weights(directory: Path) -> bool:
    """Whether a snapshot holds model weights (safetensors or PyTorch, single or sharded)."""
    return any(_SAFETENSORS.fullmatch(p.name) or _PICKLED.fullmatch(p.name)
               for p in directory.iterdir())


def files_to_fetch(repo_files: Iterable[str], weights: bool = True) -> list[str]:
    """The files of a repo (paths as the Hub lists them) worth downloading: config.json, the
    tokenizer and generation files at its top level and, with ``weights``, its safetensors
    weights, or its PyTorch ones when it has no safetensors."""
    top = [f for f in repo_files if "/" not in f]
    wanted = [f for f in top if f == CONFIG_FILE or f in EXTRA_FILES]
    if weights:
        safe = [f for f in top if _SAFETENSORS.fullmatch(f)]
        wanted += safe or [f for f in top if _PICKLED.fullmatch(f)]
    return wanted


def cached_snapshot(name: HubName, cache: Path) -> Path | None:
    """The snapshot folder of ``name`` in ``cache`` that holds config.json, or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name.repo_id, CONFIG_FILE, cache_dir=str(cache),
                                   revision=name.revision)
    return Path(found).parent if isinstance(found, str) else None


def hub_snapshot(name: HubName, what: str | None = None, *, weights: bool = True) -> Path:
    """The local snapshot directory of ``name``: the cached one when it holds config.json (and,
    with ``weights``, weights), else downloaded. ``ConfigError`` (one line, starting with
    ``what``: the setting and the value given, e.g. ``--model bert-base-uncased``) when offline
    without it in the cache, or when the Hub refuses."""
    cache = hub_cache_dir()
    what = what or str(name)
    found = cached_snapshot(name, cache)
    if found is not None and (not weights or has_weights(found)):
        log.info("%s: Hugging Face Hub model %s from the cache, %s", what, name, found)
        return found
    if hub_offline():
        held = (f"is cached in {found} without weights" if found is not None
                else f"is not in the cache {cache}")
        raise ConfigError(
            f"{what} is not a local path, and the Hugging Face Hub model {name} {held} while "
            f"offline (HF_HUB_OFFLINE=1): go online once, run `hf download "
            f"{name.repo_id}`, or give a local model directory")
    return _download(name, cache, what, weights)


def _download(name: HubName, cache: Path, what: str, weights: bool) -> Path:
    """Download the files ``files_to_fetch`` picks into ``cache``; one-line errors."""
    from huggingface_hub import HfApi, snapshot_download

    try:
        listed = HfApi().list_repo_files(name.repo_id, revision=name.revision)
        wanted = files_to_fetch(listed, weights)
        _check_listing(name, what, wanted, weights)
        log.info("%s: downloading %s from the Hugging Face Hub (%s) into %s", what, name,
                 ", ".join(wanted), cache)
        folder = snapshot_download(name.repo_id, revision=name.revision, cache_dir=str(cache),
                                   allow_patterns=[glob.escape(f) for f in wanted])
    except _hub_errors() as exc:
        raise ConfigError(_hub_failure(name, what, exc)) from None
    return Path(folder)


def _hub_errors() -> tuple[type[Exception], ...]:
    """What fetching from the Hub raises for reasons outside the code: huggingface_hub's errors
    (``OSError`` and ``ValueError`` subclasses) and those of its HTTP client (httpx in newer
    versions, requests in older ones)."""
    found: list[type[Exception]] = [OSError, ValueError]
    for module, name in (("httpx", "HTTPError"), ("httpx2", "HTTPError"),
                         ("requests", "RequestException")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _check_listing(name: HubName, what: str, wanted: list[str], weights: bool) -> None:
    if CONFIG_FILE not in wanted:
        raise ConfigError(f"{what}: the Hugging Face Hub repo {name} has no config.json at its "
                          "top level; it is not a transformers model directory")
    if weights and not any(_SAFETENSORS.fullmatch(f) or _PICKLED.fullmatch(f) for f in wanted):
        raise ConfigError(f"{what}: the Hugging Face Hub repo {name} has no PyTorch weights "
                          "(model.safetensors or pytorch_model.bin); give a model that has them")


def _hub_failure(name: HubName, what: str, exc: Exception) -> str:
    """The one-line message for an error huggingface_hub raised while fetching ``name``."""
    from huggingface_hub.utils import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                       RepositoryNotFoundError, RevisionNotFoundError)

    url = f"https://huggingface.co/{name.repo_id}"
    if isinstance(exc, GatedRepoError):
        return (f"{what}: the Hugging Face Hub model {name.repo_id} is gated; accept its terms "
                f"at {url} and log in (`hf auth login`)")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"{what} is not a local path, and the Hugging Face Hub has no model "
                f"{name.repo_id} (if it is private, log in with `hf auth login`)")
    if isinstance(exc, RevisionNotFoundError):
        return f"{what}: the Hugging Face Hub model {name.repo_id} has no revision {name.revision}"
    detail = (str(exc).strip().splitlines() or [""])[0][:200]
    if isinstance(exc, HfHubHTTPError) and not isinstance(exc, LocalEntryNotFoundError):
        return f"{what}: the Hugging Face Hub refused {name} ({detail})"
    # no answer: the connection, a proxy, offline mode switched on by a program
    return (f"{what}: cannot reach the Hugging Face Hub for {name} ({type(exc).__name__}: "
            f"{detail}); check the connection, or give a local model directory")


__all__ = ["HubName", "cached_snapshot", "files_to_fetch", "has_weights", "hub_cache_dir",
           "hub_offline", "hub_snapshot", "parse_hub_name"]
