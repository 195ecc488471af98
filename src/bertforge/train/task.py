"""What a task plugs into the one runner (``bertforge.train.run``): the protocol the runner
drives, in the runner's own package so that the runner never imports a task (the task classes
in ``bertforge.tasks`` sit above it and implement this).

A task knows its data, its model class, its loss and its metrics; the runner owns everything
else: restore and resume, precision, DDP, the train loop, logging, checkpoints, preemption,
benchmark mode and the summary frame. Pretraining, SQuAD, GLUE/classification, SWAG and token
classification are each one ``Task``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol

from torch import nn

from bertforge.data.batch import Batch, LossOutput


class TrainStream(Protocol):
    """This rank's training micro-batches: endless, resumable at a global-batch boundary."""

    accumulation_steps: int
    batches_per_epoch: int  # global batches (optimizer steps) per pass over the data

    def __iter__(self) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Task(Protocol):
    name: str              # "pretraining", "squad", ...: the summary's first word
    init_key: str          # the config key that starts a run from a checkpoint's weights only
    tokenizer: Any         # saved with every checkpoint (None: the data records no tokenizer)
    train: TrainStream
    phase: int             # the training phase recorded in its checkpoints (meta.json)
    supports_fsdp: bool
    """Whether the task may train with its weights sharded over the ranks (``train.fsdp``):
    its ``evaluate`` and ``finish`` work on every rank from a sharded model. False for a task
    whose ``finish`` writes the model from rank 0 alone (fine-tuning)."""

    def total_steps(self) -> int:
        """Optimizer steps of the run, the schedule's length: ``train.max_steps``, or what the
        task's config counts instead (fine-tuning: ``train.epochs`` passes over the data,
        :func:`steps_for_epochs`)."""

    def build_model(self, resume_from: Path | None) -> nn.Module:
        """The model to train, on the task's device: the checkpoint being resumed (already
        verified), else the task's starting weights."""

    def loss(self, model: nn.Module, batch: Batch) -> LossOutput: ...

    @property
    def has_validation(self) -> bool: ...

    def evaluate(self, model: nn.Module, autocast: Callable[[], ContextManager]) -> dict:
        """Validation metrics (floats, flat names) on every rank; called only with validation."""

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        """Training FLOPs of one micro-batch from its CPU tensors (benchmark MFU; no syncs)."""

    def finish(self, model: nn.Module, output_dir: Path, validation: dict) -> dict:
        """After the last step, on every rank: write the task's own outputs (predictions,
        eval_results.json, the final model) and return what the summary should report."""

    def describe(self, last: dict, validation: dict) -> list[str]:
        """The task's lines of the end-of-run summary (its losses and metrics)."""


def steps_for_epochs(epochs: float, train: TrainStream) -> int:
    """Optimizer steps of ``epochs`` passes over ``train`` (at least one): ``total_steps`` of a
    task whose config counts passes instead of steps."""
    return max(1, math.ceil(epochs * train.batches_per_epoch))
