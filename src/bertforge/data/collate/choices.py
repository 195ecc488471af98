"""Batches of multiple-choice examples (SWAG): every example is C sequences of (context, ending).

The arrays are (N, C, S); a batch is (B, C, S), cut to the longest real sequence of any choice of
its examples (rounded up to 8), and the labels (N,) name the right choice. One example counts as
one sequence of C x S tokens in throughput.
"""

from __future__ import annotations

import numpy as np

from bertforge.data.batch import SequenceFeatures


class ChoiceFeatures(SequenceFeatures):
    """``SequenceFeatures`` with a choice axis: ``input_ids`` and its companions are (N, C, S)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        if arrays["input_ids"].ndim != 3:
            raise ValueError(f"multiple-choice features are (examples, choices, tokens), got "
                             f"shape {arrays['input_ids'].shape}")
        super().__init__(arrays)

    @property
    def choices(self) -> int:
        return int(self.arrays["input_ids"].shape[1])


__all__ = ["ChoiceFeatures"]
