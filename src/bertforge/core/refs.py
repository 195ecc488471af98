"""``Ref``: a named reference to an object in another module, imported only when used.

The registries (``bertforge.models.registry``, ``bertforge.tasks.registry``) are plain data that
the command line reads before torch is imported, so they name the classes and functions of each
family and task instead of importing them. A ``Ref`` is an import edge all the same: the
project's import-cycle test (tests/unit/test_structure.py) reads ``Ref("module", ...)`` as an
import of ``module``, so a registry cannot hide a cycle.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ref:
    module: str
    """Dotted module path, e.g. ``bertforge.tasks.squad``."""
    name: str
    """The attribute of that module, e.g. ``SquadTask``."""

    def load(self) -> Any:
        """The object itself (imports its module on first use)."""
        return getattr(importlib.import_module(self.module), self.name)

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"


__all__ = ["Ref"]
