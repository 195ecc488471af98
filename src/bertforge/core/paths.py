"""Paths that users and files give: an empty path option, and files named by a directory's own
metadata (a shard index, a manifest, modules.json) that must stay inside that directory.

A model directory or prepared data directory may come from anyone (the Hugging Face Hub, a
colleague, a download). The names its metadata holds are data, not instructions: an absolute name
or one that climbs out with ``..`` or through a symbolic link would make bertforge read a file the
directory's author chose from anywhere on the machine. :func:`named_file` is the one place such a
name becomes a path.

A Hugging Face Hub cache snapshot (``models--ORG--NAME/snapshots/REVISION``) holds symbolic
links into the repo's ``blobs/`` folder, so inside a snapshot a name may resolve anywhere under
the repo folder ``models--ORG--NAME``, and nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Sequence

from bertforge.errors import ConfigError, UserError

HUB_REPO_PREFIXES = ("models--", "datasets--", "spaces--")


def check_path_text(value: object, option: str, need: str = "a path or a name") -> None:
    """``ConfigError`` naming ``option`` when a path (or name) given as text is empty or only
    white space: ``Path("")`` is the current directory, which nobody means by it. ``need`` says
    what to give instead."""
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{option} is empty ({value!r}); give {need}")


def cache_root(directory: Path) -> Path:
    """The folder that a name inside ``directory`` may resolve into: the repo folder of a Hub
    cache snapshot (its links point into ``blobs/``), else ``directory`` itself; both resolved."""
    resolved = Path(os.path.realpath(directory))
    for candidate in (Path(os.path.abspath(directory)), resolved):
        parent = candidate.parent
        if parent.name == "snapshots" and parent.parent.name.startswith(HUB_REPO_PREFIXES):
            return Path(os.path.realpath(parent.parent))
    return resolved


def named_file(directory: Path, name: object, *, named_by: str,
               suffixes: Sequence[str] = (), error: type[UserError] = ConfigError,
               fix: str = "") -> Path:
    """The path of the file ``name`` that ``named_by`` (e.g. ``DIR/model.safetensors.index.json``
    key ``weight_map``) names inside ``directory``. ``error`` unless ``name`` is a non-empty
    relative name that, symbolic links followed, stays inside ``directory`` (a Hub snapshot:
    inside its repo folder, see the module docstring) and, when ``suffixes`` are given, ends in
    one of them. The file itself need not exist (the caller says what a missing one means)."""
    tail = f"; {fix}" if fix else ""
    if not isinstance(name, str) or not name.strip():
        raise error(f"{named_by} names {name!r}, not a file name{tail}")
    if (PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
            or PureWindowsPath(name).drive or name.startswith(("/", "\\"))):
        raise error(f"{named_by} names {name!r}, an absolute path: a model or data directory "
                    f"may only name files inside itself ({directory}){tail}")
    if suffixes and not name.endswith(tuple(suffixes)):
        raise error(f"{named_by} names {name!r}, which is not a {' or '.join(suffixes)} file"
                    f"{tail}")
    path = directory / name
    root = cache_root(directory)
    resolved = Path(os.path.realpath(path))
    if resolved != root and root not in resolved.parents:
        how = "through a symbolic link " if ".." not in Path(name).parts else ""
        raise error(f"{named_by} names {name!r}, which leads {how}outside {directory} (to "
                    f"{resolved}): a model or data directory may only name files inside "
                    f"itself{tail}")
    return path


__all__ = ["HUB_REPO_PREFIXES", "cache_root", "check_path_text", "named_file"]
