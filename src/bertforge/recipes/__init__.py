"""The YAML recipes shipped inside the package, found by name (``bert-large-phase1``) or by path.

They are package data rather than a top-level ``configs/`` folder so that an installed wheel has
them too: ``bertforge pretrain --config bert-large-phase1`` and ``bertforge demo`` work from any
directory. Torch-free on purpose: the CLI resolves and loads a config before importing torch, so a
mistyped name fails at once.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from bertforge.errors import ConfigError

__all__ = ["RECIPES_DIR", "list_recipes", "recipe_summary", "resolve_recipe"]

# Wheels and editable installs both put the package on disk as plain files, so this is a real
# directory whose files can be opened (and copied by users who want to edit one).
RECIPES_DIR = Path(__file__).resolve().parent
_SUFFIX = ".yaml"


def list_recipes(*folders: str) -> list[str]:
    """Recipe names with their folder and without ``.yaml``, e.g. ``pretrain/bert-large-phase1``;
    only those in ``folders`` when given."""
    names = sorted(p.relative_to(RECIPES_DIR).with_suffix("").as_posix()
                   for p in RECIPES_DIR.rglob(f"*{_SUFFIX}"))
    return [n for n in names if not folders or n.split("/", 1)[0] in folders]


def recipe_summary(name: str, width: int = 72) -> str:
    """What a recipe is, for ``--help``: the first sentence of its leading comment, cut to about
    ``width`` characters at a word."""
    lines = []
    for line in (RECIPES_DIR / f"{name}{_SUFFIX}").read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = re.split(r"(?<!e\.g)\.\s+(?=[A-Z])", " ".join(lines), maxsplit=1)[0].rstrip(".:")
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0] + " ..."


def resolve_recipe(name_or_path: str | Path) -> Path:
    """An existing file as given; otherwise a recipe's file, named with or without its folder and
    ``.yaml`` (``tiny-cpu``, ``debug/tiny-cpu.yaml``). Anything else is a ``ConfigError``."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = str(name_or_path).removesuffix(_SUFFIX)
    names = list_recipes()
    for recipe in names:
        if name in (recipe, recipe.rsplit("/", 1)[-1]):
            return RECIPES_DIR / f"{recipe}{_SUFFIX}"
    # Starts as load_config's own message for a missing file, which is what most typos are.
    start = f"config file not found: {name_or_path} is neither an existing file nor a recipe name"
    meant = _closest(name, names)
    if meant:
        raise ConfigError(f"{start}. Did you mean '{meant}'?")
    raise ConfigError(f"{start}; recipes (folder and .yaml optional): {', '.join(names)}")


def _closest(name: str, names: list[str]) -> str | None:
    """The recipe a mistyped ``name`` most likely means, by its whole name or its last part."""
    by_leaf = {n.rsplit("/", 1)[-1]: n for n in names}
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return close[0]
    close = difflib.get_close_matches(name.rsplit("/", 1)[-1], list(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]] if close else None
