"""The precision of an evaluation-only fine-tuning run (``bertforge finetune`` without
``data.train``, ``bertforge predict --data``, ``bertforge evaluate finetuned``).

Such a run takes ``precision=auto|fp32|bf16|int8|fp16``. On a CPU, ``auto`` is held to the
quality guard of ``bertforge.runtime.guard`` with the run's own data as the probe: the first
evaluation batch, as the evaluation pass feeds it to the model (the longest features,
``eval.batch_size`` of them); a summarization run probes with its longest articles, cut short
(the guard compares the decoder's vocabulary-wide logits at every token). A run that trains
keeps its training precision (``config.PRECISIONS``; the config refuses int8 with
``data.train``), and so does the evaluation at the end of its training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from bertforge.data.batch import SequenceFeatures, to_device
from bertforge.runtime.guard import PrecisionChoice, Probe


@dataclass(frozen=True)
class Evaluated:
    """One evaluation-only pass: its metrics (empty for unlabelled data), the precision it ran
    in and why, and the wall time of the pass over the data in seconds (the forward passes or
    generation and the task's post-processing; not reading, encoding, loading or the probe)."""

    metrics: dict
    choice: PrecisionChoice
    seconds: float

    def results(self) -> dict:
        """eval_results.json of an evaluation-only run: the metrics, then ``precision`` (what
        ran) and ``precision_reason`` (why: asked, or what ``auto`` found)."""
        return {**self.metrics, "precision": self.choice.name,
                "precision_reason": f"{self.choice.asked}: {self.choice.reason}"}


def batch_probe(features: SequenceFeatures, batch_size: int, device: torch.device,
                inputs: Sequence[str]) -> Probe:
    """The first batch of the evaluation pass (``tasks.finetuning.predict`` orders features
    longest first) as the model's keyword ``inputs``, with its mask flattened to (B, -1): a
    multiple-choice batch is (B, choices, S), and its (B, choices) logits are compared whole."""
    first = np.argsort(-features.lengths, kind="stable")[:batch_size]
    batch = to_device(features.collate(first), device)
    return Probe({k: batch[k] for k in inputs}, batch["attention_mask"].reshape(len(first), -1))


__all__ = ["Evaluated", "batch_probe"]
