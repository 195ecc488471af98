"""The example types every fine-tuning reader returns.

Readers turn each file layout (GLUE's TSVs, CSV/JSON Lines exports, SWAG, CoNLL) into these few
shapes so that tokenization and batching never see a file format. Each example keeps ``source``
("FILE:LINE") so that a problem found later (a label unseen in training, a text too long) can
still name the line it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar

from bertforge.errors import DataError


@dataclass(frozen=True)
class TextExample:
    """One sentence or sentence pair for classification or regression.

    ``label`` is a class name (str), a score (float, regression) or None (unlabeled data).
    """

    id: str
    text_a: str
    text_b: str | None
    label: str | float | None
    source: str


@dataclass(frozen=True)
class ChoiceExample:
    """A multiple-choice question such as SWAG's.

    The model scores one pair per ending: (``context``, ``start + " " + ending``). ``label`` is
    the index of the right ending, or None for unlabeled data.
    """

    id: str
    context: str
    start: str
    endings: list[str]
    label: int | None
    source: str

    def pairs(self) -> list[tuple[str, str]]:
        """The (first, second) segment pair the model sees for each ending, in ending order."""
        return [(self.context, f"{self.start} {ending}".strip()) for ending in self.endings]


@dataclass(frozen=True)
class TaggedExample:
    """One sentence for token classification; ``tags`` is None for unlabeled data."""

    id: str
    tokens: list[str]
    tags: list[str] | None
    source: str


@dataclass(frozen=True)
class Answer:
    """A gold answer: its text and its character start in the context (-1: not found there)."""

    text: str
    start: int


@dataclass(frozen=True)
class QAExample:
    """One question about one context with its gold answers (none: unanswerable or unknown)."""

    id: str
    question: str
    context: str
    answers: list[Answer]
    is_impossible: bool = False
    title: str = ""


E = TypeVar("E", TextExample, ChoiceExample, TaggedExample)


def unique_ids(examples: Sequence[E]) -> Sequence[E]:
    """``examples``, after checking that no two share an id: predictions and scores are keyed
    by id, so a repeat would silently pair one example's output with another's. ``DataError``
    naming both places (``FILE:LINE``)."""
    seen: dict[str, str] = {}
    for example in examples:
        if example.id in seen:
            raise DataError(f"{example.source}: id {example.id!r} was already used at "
                            f"{seen[example.id]}; ids must be unique, since predictions are "
                            "written by id")
        seen[example.id] = example.source
    return examples
