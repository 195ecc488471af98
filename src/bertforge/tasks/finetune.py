"""What every fine-tuning task shares: starting weights, encoded features, batching, evaluation
passes, outputs, and the ``finetune`` entry point.

A fine-tuning task reads its files once, encodes every example into fixed-width numpy arrays
(``FeatureSet``), and hands the runner a ``PretrainingLoader`` over them whose ``make_batch``
trims each micro-batch to its longest sequence. So order, epochs, ranks, accumulation and resume
work exactly as in pretraining. Evaluation runs the bare model over the rank's contiguous share
of the validation features and gathers the outputs, so every rank computes the same metrics.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import statistics
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bertforge.data.batch import Batch, LossOutput, real_tokens, to_device
from bertforge.config import FinetuneConfig, save_config
from bertforge.data.loader import PretrainingLoader, pin_batch
from bertforge.errors import ConfigError, DataError
from bertforge.core.io import write_json_atomic, write_text_atomic
from bertforge.models.auto import config_class, load_config
from bertforge.models.hub import PreTrainedModel
from bertforge.tokenization import load_tokenizer
from bertforge.train.distributed import DistInfo
from bertforge.train.flops import batch_train_flops
from bertforge.train.guards import check_model_fits, explain_oom, refuse_nonfinite
from bertforge.train.precision import build_precision
from bertforge.train.resume import verify_model_files
from bertforge.train.run import RunResult, benchmark_task, distributed_run, run_task

log = logging.getLogger(__name__)

SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids")
RESULTS_FILE = "eval_results.json"


class FeatureSet(torch.utils.data.Dataset):
    """Encoded examples: arrays with one row per feature, sequences padded to a fixed width.

    Sequence arrays (``SEQUENCE_KEYS``, and ``labels`` when it has their shape) are (N, S) or
    (N, C, S) for multiple choice; others are (N,). Indexed by ``(epoch, indices)`` it is the
    loader's ``make_batch``: the rows as tensors, sequences cut to the batch's longest real
    length rounded up to 8 (padding costs compute; fine-tuning data varies a lot in length).
    """

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        mask = arrays["attention_mask"]
        self.width = mask.shape[-1]
        self.lengths = mask.reshape(len(mask), -1, self.width).sum(-1).max(-1)  # (N,) longest
        digest = hashlib.sha256()
        for key in sorted(arrays):
            digest.update(key.encode() + np.ascontiguousarray(arrays[key]).tobytes())
        self.fingerprint = f"{len(mask)} features, sha256 {digest.hexdigest()[:16]}"

    def __len__(self) -> int:
        return len(self.arrays["attention_mask"])

    def is_sequence(self, key: str) -> bool:
        return key in SEQUENCE_KEYS or (
            key == "labels" and self.arrays[key].shape == self.arrays["input_ids"].shape)

    def collate(self, indices: np.ndarray) -> Batch:
        longest = int(self.lengths[indices].max())
        s = min(self.width, -(-longest // 8) * 8)
        return {key: torch.from_numpy(np.ascontiguousarray(
                    value[indices, ..., :s] if self.is_sequence(key) else value[indices]))
                for key, value in self.arrays.items()}

    def __getitem__(self, key: tuple[int, np.ndarray]) -> Batch:
        return self.collate(np.asarray(key[1]))


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
def predict(model: nn.Module, features: FeatureSet, batch_size: int, info: DistInfo,
            autocast: Callable[[], ContextManager],
            outputs: Callable[[Any, Batch], dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
    """Run ``model`` over all features (ranks split them, every rank gets the gathered result).

    ``outputs(model_output, batch)`` picks (B, ...) tensors to keep, padded to the feature width
    where they have a sequence axis; results come back as numpy arrays in feature order.
    """
    model = unwrap(model)
    was_training = model.training
    model.eval()
    share = np.array_split(np.arange(len(features)), info.world_size)[info.rank]
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(share), batch_size):
        batch = features.collate(share[start:start + batch_size])
        if info.device.type == "cuda":
            batch = pin_batch(batch)  # the copy below then overlaps the previous batch's work
        batch = to_device(batch, info.device)
        with autocast():
            out = model(**{k: batch[k] for k in SEQUENCE_KEYS})
        for key, value in outputs(out, batch).items():
            parts.setdefault(key, []).append(value.float().cpu().numpy())
    mine = {k: np.concatenate(v) for k, v in parts.items()}
    model.train(was_training)
    if not (dist.is_available() and dist.is_initialized()):
        return mine
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, mine)
    # A rank whose share was empty (fewer features than ranks) sent no arrays.
    keys = dict.fromkeys(k for part in gathered for k in part)
    return {k: np.concatenate([part[k] for part in gathered if k in part]) for k in keys}


def read_tokenizer(model: str | Path) -> Any:
    """The tokenizer saved in the model directory (WordPiece for BERT, byte-level BPE for BART)."""
    try:
        return load_tokenizer(Path(model))
    except DataError as exc:
        raise ConfigError(f"model={model}: {exc}; fine-tuning needs the model's tokenizer files "
                          "(vocab.txt, tokenizer.json or vocab.json + merges.txt) in its "
                          "directory") from None


def load_model(cls: type[PreTrainedModel], source: Path, seed: int, device: torch.device,
               resumed: bool, **overrides: Any) -> PreTrainedModel:
    """``cls`` with ``source``'s weights; heads the checkpoint lacks (or has in another shape,
    e.g. another label count) start fresh from ``seed`` and are reported."""
    if not (source / "config.json").is_file():
        raise ConfigError(f"model={source} is not a model directory (no config.json); give a "
                          "Hugging Face model directory or a bertforge checkpoint")
    if not resumed:  # a resume was verified whole by resolve_resume
        verify_model_files(source)
    config = cls.config_class.load(source).replace(**overrides)
    check_model_fits(config, device, str(source))
    with explain_oom(config, device, str(source)):
        torch.manual_seed(seed)  # the fresh heads' initial weights
        model = cls.from_pretrained(source, ignore_mismatched_heads=True, **overrides)
        refuse_nonfinite(model.named_parameters(), source / "model.safetensors", source)
        model = model.to(device)
    model.train()  # heads absent from the checkpoint were reported (INFO) by the loader
    return model


def sequence_length(cfg: FinetuneConfig) -> int:
    """``data.max_seq_length``, else the task's default (384 for SQuAD, 1024 for summarization,
    128 otherwise) capped at the model's positions; an explicit value beyond them is an error,
    before data is read."""
    positions = load_config(str(cfg.model)).max_position_embeddings
    if cfg.data.max_seq_length is None:
        return min(cfg.max_seq_length, positions)
    if cfg.data.max_seq_length > positions:
        raise ConfigError(f"data.max_seq_length={cfg.data.max_seq_length} exceeds the model's "
                          f"{positions} positions; lower it")
    return cfg.data.max_seq_length


def train_loader(features: FeatureSet, cfg: FinetuneConfig, info: DistInfo) -> PretrainingLoader:
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
    """The shared half of every fine-tuning task (see ``bertforge.tasks.base.Task``).

    A subclass sets ``name`` and ``model_class`` and implements ``read`` (examples from the
    configured files), ``encode`` (examples -> features), ``loss``, ``collect`` (the evaluation
    outputs: forward passes for the encoder tasks, ``EncoderTask``; generation for
    summarization), ``score`` (metrics of those outputs) and may override ``model_overrides``
    (label count and names) and ``write_predictions``.
    """

    name = "fine-tuning"
    init_key = "model"
    prediction_file = "predictions.jsonl"  # the main file write_predictions writes
    model_class: type[PreTrainedModel]

    def __init__(self, cfg: FinetuneConfig, info: DistInfo, labelled: bool = True) -> None:
        # labelled=False: the validation file is new data to predict (``bertforge predict``).
        self.cfg, self.info, self.labelled = cfg, info, labelled
        self.tokenizer = read_tokenizer(cfg.model)
        self.max_seq_length = sequence_length(cfg)
        self.train_examples, self.eval_examples = self.read()
        self.train = None
        if self.train_examples is not None:
            self.train = train_loader(self.encode(self.train_examples, training=True), cfg, info)
        self.eval_features = (None if self.eval_examples is None
                              else self.encode(self.eval_examples, training=False))
        if self.train is None and self.eval_features is None:
            raise ConfigError("set data.train (to fine-tune) and/or data.validation (to evaluate)")
        self.last_outputs: dict[str, np.ndarray] | None = None

    # -- the task's own parts ---------------------------------------------------------------
    @abstractmethod
    def read(self) -> tuple[list | None, list | None]:
        """(training examples, evaluation examples), each None when its file is not set."""

    @abstractmethod
    def encode(self, examples: list, training: bool) -> FeatureSet:
        """Model inputs (and, for training or scoring, targets) of ``examples``."""

    @abstractmethod
    def collect(self, model: nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, np.ndarray]:
        """Run ``model`` over the evaluation features; what ``score`` and
        ``prediction_rows`` read, gathered from every rank."""

    @abstractmethod
    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        """The task's metrics of the gathered evaluation outputs."""

    def model_overrides(self) -> dict[str, Any]:
        return {}

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        """One JSON object per evaluation example for ``prediction_file`` (JSON Lines); a task
        with another output format overrides ``write_predictions`` instead."""
        return []

    def write_predictions(self, output_dir: Path, outputs: dict[str, np.ndarray]) -> None:
        rows = [json.dumps(row, ensure_ascii=False) for row in self.prediction_rows(outputs)]
        write_text_atomic(output_dir / self.prediction_file, "".join(r + "\n" for r in rows))

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
        return self.eval_features is not None

    def build_model(self, resume_from: Path | None) -> nn.Module:
        source = resume_from or Path(str(self.cfg.model))
        return load_model(self.model_class, source, self.cfg.train.seed, self.info.device,
                          resumed=resume_from is not None, **self.model_overrides())

    def evaluate(self, model: nn.Module, autocast: Callable[[], ContextManager]) -> dict:
        assert self.eval_features is not None
        self.last_outputs = self.collect(model, autocast)
        return self.score(self.last_outputs) if self.labelled else {}

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        # The encoder over the real tokens; the small task heads are not counted.
        return batch_train_flops(unwrap(model).config, batch["attention_mask"])

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

    def evaluate_only(self) -> RunResult:
        """No training data: predict the validation file with ``model`` (and score it when
        labelled) and write the outputs to ``output_dir``."""
        out = Path(self.cfg.output_dir)
        model = self.build_model(None)
        precision = build_precision(self.cfg.precision, self.info.device)
        metrics = self.evaluate(model, precision.autocast)
        self.write_outputs(out, metrics)
        if self.info.is_main and metrics:
            print(f"{self.name} evaluation of {self.cfg.model}\n  {format_metrics(metrics)}\n"
                  f"  results      {out / RESULTS_FILE}")
        return RunResult(output_dir=out, step=0, preempted=False, final_checkpoint=None,
                         validation=metrics)


class EncoderTask(FinetuneTask):
    """A task evaluated by forward passes of an encoder model over its ``FeatureSet`` (SQuAD,
    classification, multiple choice, tagging)."""

    @abstractmethod
    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        """What evaluation keeps of a forward pass: (B, ...) tensors, sequences padded."""

    def collect(self, model: nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, np.ndarray]:
        return predict(model, self.eval_features, self.cfg.eval.batch_size, self.info,
                       autocast, self.outputs)


# --- entry points ------------------------------------------------------------------------------


def build_task(cfg: FinetuneConfig, info: DistInfo, labelled: bool = True):
    """The task object for ``cfg.task`` (``labelled=False``: predict, do not score)."""
    if not cfg.model:
        raise ConfigError("model is not set: give --model=DIR (a Hugging Face BERT or BART "
                          "directory, or a bertforge checkpoint)")
    if not Path(cfg.model).is_dir():
        raise ConfigError(f"model={cfg.model} does not exist or is not a directory")
    from bertforge.models.bart_config import BartConfig

    is_bart = config_class(cfg.model) is BartConfig
    if is_bart != (cfg.task == "summarization"):
        family, wanted = ("BART", "BERT") if is_bart else ("BERT", "BART")
        raise ConfigError(f"model={cfg.model} is a {family} model but task {cfg.task} needs a "
                          f"{wanted} model")
    if cfg.task == "summarization":
        from bertforge.tasks.summarize import SummarizationTask
        return SummarizationTask(cfg, info, labelled)
    if cfg.task == "squad":
        from bertforge.tasks.squad import SquadTask
        return SquadTask(cfg, info, labelled)
    if cfg.task in ("glue", "classification"):
        from bertforge.tasks.classify import ClassificationTask
        return ClassificationTask(cfg, info, labelled)
    if cfg.task == "swag":
        from bertforge.tasks.swag import MultipleChoiceTask
        return MultipleChoiceTask(cfg, info, labelled)
    from bertforge.tasks.tagging import TokenClassificationTask
    return TokenClassificationTask(cfg, info, labelled)


def finetune(cfg: FinetuneConfig) -> RunResult:
    """Fine-tune (or, without ``data.train``, only evaluate) as ``cfg`` says; docs/finetuning.md."""
    with distributed_run(cfg, "finetune") as info:
        task = build_task(cfg, info)
        if task.train is None:
            return task.evaluate_only()
        return run_task(task, cfg, info)


def benchmark_finetuning(cfg: FinetuneConfig) -> dict:
    """``bertforge finetune --benchmark``: the benchmark.json report."""
    with distributed_run(cfg, "finetune") as info:
        task = build_task(cfg, info)
        if task.train is None:
            raise ConfigError("--benchmark times training steps: set data.train")
        return benchmark_task(task, cfg, info)


def finetune_seeds(cfg: FinetuneConfig, seeds: Sequence[int]) -> dict:
    """One run per seed (each in ``output_dir/seed-N``), then each run's metrics and the median
    of every numeric metric in ``output_dir/seeds.json``."""
    root = Path(cfg.output_dir)
    runs: dict[str, dict] = {}
    for seed in seeds:
        one = dataclasses.replace(cfg, output_dir=str(root / f"seed-{seed}"),
                                  train=dataclasses.replace(cfg.train, seed=seed))
        result = finetune(one)
        runs[str(seed)] = dict(result.validation)
    names = [k for k in next(iter(runs.values()), {}) if all(
        isinstance(r.get(k), (int, float)) for r in runs.values())]
    median = {k: float(statistics.median(r[k] for r in runs.values())) for k in names}
    report = {"seeds": [int(s) for s in seeds], "runs": runs, "median": median}
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / "seeds.json", report, sort_keys=False)
    save_config(cfg, root / "config.yaml")
    print(f"seeds {', '.join(map(str, seeds))}: median {format_metrics(median)} "
          f"-> {root / 'seeds.json'}")
    return report


__all__ = ["EncoderTask", "FeatureSet", "benchmark_finetuning", "build_task", "finetune", "finetune_seeds",
           "load_model", "predict", "read_tokenizer"]
