"""Progress bars that only draw where someone watches.

tqdm redraws its bar with carriage returns; on a terminal (or in a notebook) that is a bar, in a
log file or a pipe it is thousands of overwritten lines in one. :func:`progress_bar` draws only
when stderr is a terminal (or in Jupyter, where tqdm draws a widget); elsewhere it returns a
disabled bar, and a caller with something to report (the train loop's metrics) prints plain
lines instead. ``BERTFORGE_PROGRESS=always`` (or ``never``) overrides the choice.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PROGRESS_ENV = "BERTFORGE_PROGRESS"


def interactive() -> bool:
    """Whether progress bars are drawn: the environment's choice, else stderr is a terminal or
    this is a notebook."""
    from tqdm.auto import tqdm

    choice = os.environ.get(PROGRESS_ENV, "").lower()
    if choice in ("always", "never"):
        return choice == "always"
    if "notebook" in tqdm.__module__:
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(*, disable: bool = False, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(**kwargs)``, disabled where it would not be drawn (see the module
    notes) as well as when ``disable``; ``bar.disable`` tells which."""
    from tqdm.auto import tqdm

    return tqdm(disable=disable or not interactive(), **kwargs)


__all__ = ["PROGRESS_ENV", "interactive", "progress_bar"]
