"""What the two pretraining tasks share (BERT's masked LM, ``tasks/mlm.py``, and BART's
denoising, ``tasks/denoise.py``): ``CorpusTask``, a task over prepared data (its streams,
validation over the held-out split, the run's length and phase), and the starting weights (the
checkpoint being resumed, ``init_from``, or a fresh model shaped by the data's vocabulary).
Neither task derives from the other; both are corpus tasks."""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from bertforge.config import PretrainConfig
from bertforge.data.batch import Batch, LossOutput, to_device
from bertforge.errors import ConfigError
from bertforge.models.loading import ModelSource, open_model
from bertforge.train.data import MakeBatch, PreparedData, PretrainData, open_pretrain_data
from bertforge.train.distributed import DistInfo, all_reduce_sum
from bertforge.train.guards import RESTART, check_vocab, load_for_training, verify_model_files

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate_stream(model: nn.Module, data: PretrainData, info: DistInfo, num_batches: int,
                    autocast: Callable[[], ContextManager],
                    loss: Callable[[nn.Module, Batch], LossOutput],
                    keys: tuple[str, ...]) -> dict[str, float]:
    """Means of the ``loss`` stats ``keys`` (as ``val_<key>``) over the first ``num_batches``
    validation micro-batches, the same batches at every evaluation."""
    model.eval()
    totals = torch.zeros(len(keys) + 1, device=info.device)   # the stats, batches
    for i, batch in enumerate(data.validation_batches()):
        if i == num_batches:
            break
        with autocast():
            stats = loss(model, to_device(batch, info.device)).stats
        totals += torch.stack([*(stats[k] for k in keys), torch.ones((), device=info.device)])
    totals = all_reduce_sum(totals)
    n = max(float(totals[-1]), 1.0)
    return {f"val_{k}": float(totals[i]) / n for i, k in enumerate(keys)}


def weights_source(cfg: PretrainConfig, resume_from: Path | None) -> ModelSource:
    """Where the starting weights come from, config.json read: the checkpoint being resumed,
    ``init_from``, or none: the ``model`` preset or config shapes a fresh model. Nothing is
    verified here (``CorpusTask.build_model`` verifies the files it loads)."""
    if resume_from is not None:
        return open_model(resume_from, "resume")
    if cfg.init_from:
        source = open_model(cfg.init_from, "init_from", weights=True)
        if source.directory is None:
            raise ConfigError(f"init_from={cfg.init_from} is not a model directory; give a "
                              "checkpoint (e.g. runs/phase1/checkpoint-7038)")
        return source
    # ``model`` gives the shape only (a preset, a config.json or a model directory's config):
    # training starts from fresh weights.
    return dataclasses.replace(open_model(cfg.model), directory=None)


def check_data_vocab(source: ModelSource, data: PretrainData, cfg: PretrainConfig) -> None:
    """A model with weights must have the data's vocabulary: the same size, and (where both
    sides record their tokens) the same tokens."""
    if source.directory is None:
        return
    size = data.vocab_size or (data.tokenizer.vocab_size if data.tokenizer else None)
    if size and source.config.vocab_size != size:
        raise ConfigError(
            f"{source.directory} has vocab_size {source.config.vocab_size} but the data at "
            f"{cfg.data.path} was prepared with {size} tokens; prepare the data with the "
            "model's vocab")
    if not check_vocab(source.directory, data.vocab_tokens, cfg.data.path):
        log.warning("cannot compare the vocabulary of %s with the data's (one side has no "
                    "vocab.txt/tokenizer.json); only the sizes were checked", source.directory)


def starting_model(source: ModelSource, head: str, cfg: PretrainConfig, data: PretrainData,
                   device: torch.device, missing_head: str | None = None) -> nn.Module:
    """The ``head`` model of ``source`` with its (finite) weights, or fresh from ``train.seed``
    for a preset, on ``device``; refuses data longer than the model's positions and a model
    that cannot fit in the device's memory. ``missing_head``: what to do when the files lack
    the head."""
    config = source.config
    positions = config.max_position_embeddings
    if data.max_seq_length and data.max_seq_length > positions:
        raise ConfigError(
            f"the data at {cfg.data.path} has sequences of up to {data.max_seq_length} tokens but "
            f"the model has {positions} positions; prepare with --max-seq-length {positions} or "
            f"use a model with more positions")
    return load_for_training(source, head, device, seed=cfg.train.seed,
                             checkpoint=source.directory, fallback=RESTART,
                             missing_head=missing_head)


class CorpusTask(ABC):
    """A pretraining task over prepared data (the runner's ``Task``): its model (from the
    checkpoint being resumed, ``init_from`` or a fresh one), its training and validation
    streams, validation means of its loss's ``stat_keys``, a run of ``train.max_steps``, its
    final checkpoint as its product. A subclass adds the model family check, what a fresh model
    takes from the data, the batches when they are not masked-LM's, the loss and the summary
    lines."""

    init_key = "init_from"
    supports_fsdp = True
    stat_keys: tuple[str, ...] = ("loss",)  # validation reports val_<key>

    def __init__(self, cfg: PretrainConfig, info: DistInfo, spec: Any,
                 prepared: PreparedData) -> None:
        # ``spec``: the task's record (``bertforge.tasks.registry``), given by the command.
        self.cfg, self.info, self.spec = cfg, info, spec
        self.prepared = prepared
        # A resumed run has the same model (a run-defining key), so its config says the same.
        self.source = weights_source(cfg, None)
        self.check_model(self.source)
        self.data = open_pretrain_data(cfg, info, prepared, self.batch_maker())
        self.train = self.data.train
        self.tokenizer = self.data.tokenizer
        self.phase = cfg.phase

    @property
    def has_validation(self) -> bool:
        return self.data.has_validation

    def total_steps(self) -> int:
        return self.cfg.train.max_steps

    # -- the task's own parts ---------------------------------------------------------------
    def check_model(self, source: ModelSource) -> None:
        """ConfigError unless a model of ``source``'s family can learn from this data."""

    def batch_maker(self) -> MakeBatch | None:
        """How micro-batches are made of the data; None: the loader's masked-LM batches."""
        return None

    def model_head(self) -> str:
        """The head kind of the model trained (the record's)."""
        return self.spec.head

    def missing_head_remedy(self) -> str | None:
        """What to do when the starting checkpoint lacks the head (None: the loader's advice)."""
        return None

    @abstractmethod
    def fresh_config(self) -> dict[str, Any]:
        """Config fields a fresh model takes from the data (vocabulary size, special ids)."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        """The training loss of ``batch`` and its logged stats."""

    # -- shared ------------------------------------------------------------------------------
    def build_model(self, resume_from: Path | None) -> nn.Module:
        """The checkpoint being resumed (verified whole by ``resolve_resume``), else the
        ``init_from`` weights (their files verified here), else a fresh model shaped by
        ``model`` and the data; weights must have the data's vocabulary."""
        source = self.source if resume_from is None else weights_source(self.cfg, resume_from)
        if source.directory is None:
            # The fields the family's config has (BERT's casing, ModernBERT's [CLS]/[SEP] ids).
            known = {f.name for f in dataclasses.fields(source.config)}
            source = source.replace(**{k: v for k, v in self.fresh_config().items()
                                       if k in known})
        else:
            if resume_from is None:
                verify_model_files(source.directory)
            check_data_vocab(source, self.data, self.cfg)
        return starting_model(source, self.model_head(), self.cfg, self.data, self.info.device,
                              self.missing_head_remedy())

    def evaluate(self, model: nn.Module, autocast: Callable[[], ContextManager]) -> dict:
        return evaluate_stream(model, self.data, self.info, self.cfg.train.eval_batches,
                               autocast, self.loss, self.stat_keys)

    def finish(self, model: nn.Module, output_dir: Path, validation: dict) -> dict:
        return validation  # the final checkpoint is the product


__all__ = ["CorpusTask", "check_data_vocab", "evaluate_stream", "starting_model",
           "weights_source"]
