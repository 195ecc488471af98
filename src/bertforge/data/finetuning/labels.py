"""Label names <-> class ids, shared by every classification and tagging task.

A model's output layer has one row per class, so the order of classes must be the same in
training, evaluation and prediction, and must be saved with the model (``id2label`` in
config.json). For the user's own data the order is the sorted set of training labels, which any
run on the same data reproduces; for a benchmark such as GLUE it is the benchmark's own order, so
that predictions can be written back in its label names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bertforge.data.finetuning.examples import ChoiceExample, TaggedExample, TextExample
from bertforge.errors import DataError

MAX_LISTED = 20  # labels named in an error message; a tag set can be large


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown if len(names) <= MAX_LISTED else f"{shown}, ... ({len(names)} in all)"


@dataclass(frozen=True)
class LabelMap:
    """A fixed order of label names.

    ``fixed`` says the names came from a task definition rather than from training data, which
    only changes how an unknown label is explained.
    """

    names: list[str]
    fixed: bool = False
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"label names repeat: {self.names}")
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.names)})

    @classmethod
    def from_labels(cls, labels: Iterable[str]) -> LabelMap:
        """The sorted set of ``labels``: the same data always gives the same order."""
        return cls(sorted(set(labels)))

    @classmethod
    def from_examples(cls, examples: Iterable[TextExample | TaggedExample | ChoiceExample],
                      names: Sequence[str] | None = None) -> LabelMap:
        """A map of the labels (or tags) used in ``examples``.

        With ``names`` (a task's canonical order) the map is those names, and every example's
        label is checked against them so that a stray label is reported at its line.
        """
        seen: dict[str, str] = {}  # label -> source of its first use
        for example in examples:
            if isinstance(example, TaggedExample):
                for tag in example.tags or ():
                    seen.setdefault(tag, example.source)
            elif isinstance(example, TextExample):
                if isinstance(example.label, float):
                    raise TypeError(f"{example.source}: a regression score has no class id")
                if example.label is not None:
                    seen.setdefault(example.label, example.source)
            else:
                raise TypeError("multiple-choice labels are ending indices, not names")
        if names is None:
            return cls.from_labels(seen)
        fixed = cls(list(names), fixed=True)
        for label, source in seen.items():
            fixed.id(label, source)
        return fixed

    @property
    def label2id(self) -> dict[str, int]:
        return dict(self._index)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.names))

    def __len__(self) -> int:
        return len(self.names)

    def id(self, label: str, source: str) -> int:
        """The class id of ``label``; ``source`` ("FILE:LINE") is named if it is unknown."""
        class_id = self._index.get(label)
        if class_id is None:
            where = "one of the task's labels" if self.fixed else "seen in the training data"
            fix = ("correct the label" if self.fixed else
                   "add examples of it to the training data or correct the label")
            raise DataError(f"{source}: label {label!r} was not {where} "
                            f"(labels: {_listing(self.names)}); {fix}")
        return class_id

    def name(self, class_id: int) -> str:
        """The label name of a predicted class id."""
        return self.names[class_id]
