"""What every fine-tuning task shares: its record, starting weights, examples and features,
batching, evaluation passes and outputs. The entry points: ``finetune`` in
``bertforge.commands.train`` (the command), ``build_task`` beside the task records
(``bertforge.tasks.registry``).

A task is built in explicit steps, each returning data of the same types for every task:

1. ``open_model``: the starting model's family and config (config.json read once for the run);
2. ``read() -> Examples``: the training and evaluation examples and the facts learned from the
   files or the model (label names, SQuAD version, GLUE task...);
3. ``encode(examples, training) -> Encoded``: fixed-width features the runner batches (a
   ``bertforge.data.collate`` batch maker) and what maps outputs back to examples.

Nothing is set on the task as a side effect of reading or encoding; the task object holds the
results of these steps (``examples``, ``features``) and, after an evaluation, its outputs.
Training batches come from a ``PretrainingLoader`` over the features (``make_batch`` trims each
micro-batch to its longest sequence), so order, epochs, ranks, accumulation and resume work
exactly as in pretraining. Evaluation runs the bare model over the rank's contiguous share of
the evaluation features and gathers the outputs, so every rank computes the same metrics.
A run that only evaluates chooses its precision as ``bertforge.tasks.eval_precision`` says.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bertforge.config import FinetuneConfig
from bertforge.core.io import finite_json, write_json_atomic, write_text_atomic
from bertforge.core.limits import length_within
from bertforge.data.batch import (SEQUENCE_KEYS, Batch, LossOutput, SequenceFeatures, real_tokens,
                                  to_device)
from bertforge.data.loader import PretrainingLoader
from bertforge.errors import ConfigError, DataError, in_context
from bertforge.models.loading import ModelSource, open_model
from bertforge.runtime.guard import PrecisionChoice, Probe, choose_precision
from bertforge.runtime.precision import Precision
from bertforge.tokenization import load_tokenizer
from bertforge.train.distributed import DistInfo
from bertforge.train.flops import batch_train_flops
from bertforge.train.guards import load_for_training, verify_model_files
from bertforge.speed import apply_speed_options, read_positions
from bertforge.tasks.eval_precision import Evaluated, batch_probe
from bertforge.train.run import RunResult
from bertforge.train.task import steps_for_epochs

log = logging.getLogger(__name__)

RESULTS_FILE = "eval_results.json"


@dataclass(frozen=True)
class Examples:
    """What a task reads: its examples and what it learned from the files or the model."""

    train: Sequence | None
    evaluation: Sequence | None
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Encoded:
    """Encoded examples: the features (a batch maker) and, for evaluation, what maps model
    outputs back to the examples (QA windows, the first sub-token of each word), if anything."""

    features: Any
    alignment: Any = None


@dataclass(frozen=True)
class Features:
    train: Encoded | None
    evaluation: Encoded | None


def pad_to(t: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """``t`` padded with ``value`` along its sequence axis (dim 1) to ``width``."""
    extra = width - t.shape[1]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[1] = extra
    return torch.cat([t, t.new_full(shape, value)], dim=1)


def unwrap(model: nn.Module) -> nn.Module:
    """The model under DDP and torch.compile wrappers (evaluation needs no gradient sync, and
    ranks may run different numbers of batches)."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


@torch.no_grad()
def predict(model: nn.Module, features: SequenceFeatures, batch_size: int, info: DistInfo,
            autocast: Callable[[], ContextManager],
            outputs: Callable[[Any, Batch], dict[str, torch.Tensor]],
            inputs: Sequence[str] = SEQUENCE_KEYS) -> dict[str, np.ndarray]:
    """Run ``model`` over all features (ranks split them, every rank gets the gathered result).

    ``inputs``: the batch keys the model takes (its family's). ``outputs(model_output, batch)``
    picks (B, ...) tensors to keep, padded to the feature width
    where they have a sequence axis; results come back as numpy arrays in feature order.
    """
    model = unwrap(model)
    was_training = model.training
    model.eval()
    share = np.array_split(np.arange(len(features)), info.world_size)[info.rank]
    # Longest first, so that each batch holds features of similar lengths (little padding, few
    # attention groups) and the largest batch comes first; outputs return to feature order.
    order = np.argsort(-features.lengths[share], kind="stable")
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(share), batch_size):
        # Not pinned: reading each batch's outputs back waits for the GPU, so an asynchronous
        # copy would overlap nothing and pinning would only add a host copy.
        batch = to_device(features.collate(share[order[start:start + batch_size]]), info.device)
        with autocast():
            out = model(**{k: batch[k] for k in inputs})
        for key, value in outputs(out, batch).items():
            parts.setdefault(key, []).append(value.float().cpu().numpy())
    inverse = np.argsort(order)
    mine = {k: np.concatenate(v)[inverse] for k, v in parts.items()}
    model.train(was_training)
    return gather_outputs(mine, info)


def gather_outputs(mine: dict[str, np.ndarray], info: DistInfo) -> dict[str, np.ndarray]:
    """Every rank's share of the evaluation outputs, concatenated in rank order."""
    if not (dist.is_available() and dist.is_initialized()):
        return mine
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, mine)
    # A rank whose share was empty (fewer features than ranks) sent no arrays.
    keys = dict.fromkeys(k for part in gathered for k in part)
    return {k: np.concatenate([part[k] for part in gathered if k in part]) for k in keys}


def read_tokenizer(model: str | Path, family: Any = None) -> Any:
    """The tokenizer saved in the model directory (WordPiece for BERT, byte-level BPE for BART);
    ``family``: the model's, when it is open already."""
    try:
        return load_tokenizer(Path(model), family)
    except DataError as exc:  # it names the files it expected
        raise ConfigError(in_context(f"model={model}", exc, str(model))) from None


def require_weights(source: ModelSource) -> ModelSource:
    """``source`` with a model directory: fine-tuning starts from weights. A name that opened as
    a preset (a shape) is taken as a Hugging Face Hub name instead (presets have no weights);
    a bare config.json is refused."""
    if source.directory is not None:
        return source
    if Path(source.name).exists():
        raise ConfigError(f"model={source.name} is a config file, not a model directory: "
                          "fine-tuning starts from trained weights (a Hugging Face directory or "
                          "Hub name, or a bertforge checkpoint)")
    return open_model(source.name, "model", weights=True)


def sequence_length(cfg: FinetuneConfig, spec: Any, positions: int) -> int:
    """``data.max_seq_length``, else the task's default (``spec.max_length``: 384 for question
    answering, 1024 for summarization, 128 otherwise), within the model's ``positions``."""
    return length_within(cfg.data.max_seq_length, "data.max_seq_length", spec.max_length,
                         positions, ConfigError)


def train_loader(features: Any, cfg: FinetuneConfig, info: DistInfo) -> PretrainingLoader:
    """A resumable stream of this rank's micro-batches; every example is seen once per epoch
    (the last global batch of an epoch is completed from the epoch's first samples)."""
    if len(features) < cfg.train.global_batch_size:
        log.warning("the training data has %d features, fewer than one global batch (%d); "
                    "batches repeat examples", len(features), cfg.train.global_batch_size)
    try:
        return PretrainingLoader(
            features, global_batch_size=cfg.train.global_batch_size,
            micro_batch_size=cfg.train.micro_batch_size, rank=info.rank,
            world_size=info.world_size, seed=cfg.train.seed, drop_last=False,
            pin_memory=info.device.type == "cuda", make_batch=features)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def choice_loss(logits: torch.Tensor, batch: Batch) -> LossOutput:
    """Cross-entropy of (B, classes or choices) logits against ``batch["labels"]``, with the
    batch's accuracy as a stat; one example is one sequence."""
    logits = logits.float()
    loss = F.cross_entropy(logits, batch["labels"])
    acc = (logits.detach().argmax(-1) == batch["labels"]).float().mean()
    return LossOutput(loss, {"loss": loss.detach(), "acc": acc}, sequences=int(logits.shape[0]),
                      tokens=real_tokens(batch))


def format_metrics(metrics: dict) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in metrics.items())


class FinetuneTask(ABC):
    """The shared half of every fine-tuning task (see ``bertforge.train.task.Task`` and the
    module docstring). A subclass implements ``read``, ``encode``, ``loss``, ``collect`` (the
    evaluation outputs: forward passes for the encoder tasks, ``EncoderTask``; generation for
    summarization) and ``score``, and may override ``model_overrides`` (label count and names),
    ``prediction_rows`` or ``write_predictions``."""

    init_key = "model"
    phase = 1  # one phase: the meta.json field pretraining numbers
    supports_fsdp = False  # finish() writes the model from rank 0 alone
    prediction_file = "predictions.jsonl"  # the main file write_predictions writes

    def __init__(self, cfg: FinetuneConfig, info: DistInfo, spec: Any,
                 source: ModelSource, labelled: bool = True) -> None:
        # ``spec``: the task's record (``bertforge.tasks.registry.TaskSpec``, given by the
        # command, which looks it up); ``source``: the starting model (config.json read once);
        # labelled=False: the evaluation file is new data to predict (``bertforge predict``).
        source = require_weights(source)
        self.cfg, self.info, self.spec, self.source = cfg, info, spec, source
        self.labelled = labelled
        self.tokenizer = read_tokenizer(source.directory, source.family)
        self.max_seq_length = sequence_length(cfg, spec, source.config.max_position_embeddings)
        self.check_settings()
        self.examples = self.read()
        ex = self.examples
        self.features = Features(
            train=None if ex.train is None else self.encode(ex.train, training=True),
            evaluation=None if ex.evaluation is None else self.encode(ex.evaluation,
                                                                        training=False))
        if self.features.train is None and self.features.evaluation is None:
            raise ConfigError("set data.train (to fine-tune) and/or data.validation (to evaluate)")
        self.train = (None if self.features.train is None
                      else train_loader(self.features.train.features, cfg, info))
        self.last_outputs: dict[str, Any] | None = None  # of the latest evaluation
        self.precision_choice: PrecisionChoice | None = None  # of the latest evaluation model

    @property
    def name(self) -> str:
        """The summary's first word: the canonical task name."""
        return self.spec.name

    # -- the task's own parts ---------------------------------------------------------------
    def check_settings(self) -> None:
        """Check the task's own settings against the model (lengths, generation), before any
        data is read: a setting that cannot work fails now, not after training. A task with a
        settings section of its own checks it here (``tasks.settings.check_task_settings``)."""

    @abstractmethod
    def read(self) -> Examples:
        """The training and evaluation examples (each None when its file is not set)."""

    @abstractmethod
    def encode(self, examples: Sequence, training: bool) -> Encoded:
        """Model inputs (and, for training or scoring, targets) of ``examples``."""

    @abstractmethod
    def collect(self, model: nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, Any]:
        """Run ``model`` over the evaluation features; what ``score`` and ``prediction_rows``
        read, gathered from every rank."""

    @abstractmethod
    def score(self, outputs: dict[str, Any]) -> dict:
        """The task's metrics of the gathered evaluation outputs."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        """The training loss of ``batch`` and its logged stats."""

    def batches(self, *arrays: Any, **options: Any) -> Any:
        """The training features over encoded ``arrays``, made by the batch maker the task's
        record names (``spec.batches``, from ``bertforge.data.collate``)."""
        return self.spec.batches.load()(*arrays, **options)

    def model_overrides(self) -> dict[str, Any]:
        return {}

    def model_inputs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The batch's model inputs the model's family takes (BERT's token types; ModernBERT
        has none)."""
        return {k: batch[k] for k in self.source.family.inputs}

    def prediction_rows(self, outputs: dict[str, Any]) -> list[dict]:
        """One JSON object per evaluation example for ``prediction_file`` (JSON Lines); a task
        with another output format overrides ``write_predictions`` instead."""
        return []

    def write_predictions(self, output_dir: Path, outputs: dict[str, Any]) -> None:
        path = output_dir / self.prediction_file
        rows = finite_json(self.prediction_rows(outputs), str(path))
        write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n"
                                        for r in rows))

    def write_outputs(self, output_dir: Path, metrics: dict) -> None:
        """The predictions of the latest evaluation and eval_results.json (rank 0 writes)."""
        if not self.info.is_main:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        if self.last_outputs is not None:
            self.write_predictions(output_dir, self.last_outputs)
        if metrics:
            write_json_atomic(output_dir / RESULTS_FILE, metrics, sort_keys=False)

    # -- the Task protocol ------------------------------------------------------------------
    @property
    def has_validation(self) -> bool:
        return self.features.evaluation is not None

    def total_steps(self) -> int:
        """``train.max_steps``, else ``train.epochs`` passes over the training data."""
        train = self.cfg.train
        if train.max_steps is not None:
            return train.max_steps
        return steps_for_epochs(train.epochs, self.train)

    def build_model(self, resume_from: Path | None) -> nn.Module:
        """The task's head on the starting weights (heads they lack start fresh from
        ``train.seed``), or the checkpoint being resumed; verified, on the task's device."""
        source = self.source if resume_from is None else open_model(resume_from, "resume")
        if resume_from is None:  # a resume was verified whole by resolve_resume
            verify_model_files(source.directory)
        return load_for_training(source.replace(**self.model_overrides()), self.spec.head,
                                 self.info.device, seed=self.cfg.train.seed,
                                 checkpoint=resume_from, new_heads=True,
                                 fallback="start from another model directory")

    def evaluate(self, model: nn.Module, autocast: Callable[[], ContextManager]) -> dict:
        assert self.features.evaluation is not None
        self.last_outputs = self.collect(model, autocast)
        return self.score(self.last_outputs) if self.labelled else {}

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        # The encoder over the real tokens (its last layer where the head reads it); the small
        # task heads are not counted.
        inner = unwrap(model)
        return batch_train_flops(inner.config, batch["attention_mask"],
                                 read=read_positions(inner))

    def finish(self, model: nn.Module, output_dir: Path, validation: dict) -> dict:
        self.write_outputs(output_dir, validation)
        if self.info.is_main:  # the fine-tuned model, a Hugging Face directory in output_dir
            unwrap(model).save_pretrained(output_dir, tokenizer=self.tokenizer)
        return validation

    def describe(self, last: dict, validation: dict) -> list[str]:
        lines = [f"  last loss    {last['loss']:.4f}"] if "loss" in last else []
        if validation:
            lines.append(f"  validation   {format_metrics(validation)}")
            lines.append(f"  results      {Path(self.cfg.output_dir) / RESULTS_FILE}")
        lines.append(f"  model        {self.cfg.output_dir} (Hugging Face format)")
        return lines

    def evaluation_probe(self) -> Probe | None:
        """The batch the quality guard compares precisions on (``runtime.guard``): the first
        evaluation batch's model inputs (``EncoderTask``; summarization: its longest articles).
        None: the task has none (sentence-similarity embeds texts as it scores them)."""
        return None

    def evaluation_model(self, precision: str | None = None) -> tuple[nn.Module, Precision]:
        """The model as an evaluation-only run runs it: its weights in eval mode, the run's
        speed options (``train.unpad``) and ``precision`` (default: the run's), chosen and
        applied by ``runtime.guard.choose_precision``: on a CPU ``auto`` is held to
        the quality guard on :meth:`evaluation_probe`, bf16 stores the linear weights in bf16
        once (not for encoder-decoders), int8 swaps in int8 linear layers. Returns the model
        and the ``Precision`` whose ``autocast`` ``evaluate`` takes; the choice is kept as
        ``precision_choice``."""
        model = self.build_model(None)
        apply_speed_options(model, unpad=self.cfg.train.unpad,
                            attention_backend=self.cfg.train.attention_backend)
        model.eval()  # the guard compares deterministic passes (no dropout)
        self.precision_choice, numerics = choose_precision(
            model, self.info.device, precision or self.cfg.precision, self.evaluation_probe(),
            seq2seq=self.source.family.seq2seq, where=f"{self.name} evaluation")
        return model, numerics

    def evaluate_at(self, precision: str | None = None) -> Evaluated:
        """One evaluation-only pass at ``precision`` (default: the run's) over the evaluation
        data read once: the metrics, the precision's choice and the pass's wall time. The
        outputs are kept as ``last_outputs``; nothing is written."""
        model, numerics = self.evaluation_model(precision)
        start = time.perf_counter()
        metrics = self.evaluate(model, numerics.autocast)
        return Evaluated(metrics, self.precision_choice, time.perf_counter() - start)

    def evaluate_only(self) -> RunResult:
        """No training data: predict the evaluation file at the run's precision (and score it
        when labelled) and write the outputs to ``output_dir``; eval_results.json holds the
        metrics, ``precision`` and ``precision_reason``."""
        out = Path(self.cfg.output_dir)
        done = self.evaluate_at()
        self.write_outputs(out, done.results() if done.metrics else {})
        if self.info.is_main and done.metrics:
            c = done.choice
            print(f"{self.name} evaluation of {self.cfg.model}\n  {format_metrics(done.metrics)}\n"
                  f"  precision    {c.name} ({c.asked}: {c.reason})\n"
                  f"  results      {out / RESULTS_FILE}")
        return RunResult(output_dir=out, step=0, preempted=False, final_checkpoint=None,
                         validation=done.metrics)


class EncoderTask(FinetuneTask):
    """A task evaluated by forward passes of an encoder model over its features (SQuAD,
    classification, multiple choice, tagging)."""

    @abstractmethod
    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        """What evaluation keeps of a forward pass: (B, ...) tensors, sequences padded."""

    def evaluation_probe(self) -> Probe | None:
        """The first batch of the evaluation pass, as :func:`predict` feeds it to the model."""
        assert self.features.evaluation is not None
        return batch_probe(self.features.evaluation.features, self.cfg.eval.batch_size,
                           self.info.device, self.source.family.inputs)

    def collect(self, model: nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, Any]:
        assert self.features.evaluation is not None
        return predict(model, self.features.evaluation.features, self.cfg.eval.batch_size,
                       self.info, autocast, self.outputs, self.source.family.inputs)


__all__ = ["EncoderTask", "Encoded", "Examples", "Features", "FinetuneTask", "RESULTS_FILE",
           "choice_loss", "format_metrics", "gather_outputs", "pad_to", "predict",
           "read_tokenizer", "sequence_length", "train_loader", "unwrap"]
