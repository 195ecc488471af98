"""Choosing the task of a model directory and loading its pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bertforge.errors import ConfigError, DataError
from bertforge.inference.pipelines.base import PRECISIONS, Pipeline, TASKS, TRUNCATION
from bertforge.inference.pipelines.encoders import (FeatureExtractionPipeline, FillMaskPipeline,
                                                    TextClassificationPipeline,
                                                    TokenClassificationPipeline)
from bertforge.inference.pipelines.qa import QuestionAnsweringPipeline
from bertforge.inference.pipelines.summarize import SummarizationPipeline
from bertforge.tokenization import load_tokenizer
from bertforge.train.precision import build_precision

PIPELINES: dict[str, type[Pipeline]] = {cls.task: cls for cls in (
    QuestionAnsweringPipeline, TextClassificationPipeline, TokenClassificationPipeline,
    FillMaskPipeline, SummarizationPipeline, FeatureExtractionPipeline)}


# --- loading -------------------------------------------------------------------------------------

# Architectures (config.json) each task's head can be read from; feature extraction reads any.
_FITS = {
    "question-answering": ("BertForQuestionAnswering",),
    "text-classification": ("BertForSequenceClassification",),
    "token-classification": ("BertForTokenClassification",),
    "fill-mask": ("BertForMaskedLM", "BertForPreTraining", "BartForConditionalGeneration"),
    "summarization": ("BartForConditionalGeneration",),
}
_BY_ARCHITECTURE = {
    "BertForQuestionAnswering": "question-answering",
    "BertForSequenceClassification": "text-classification",
    "BertForTokenClassification": "token-classification",
    "BertForMaskedLM": "fill-mask", "BertForPreTraining": "fill-mask",
    "BertModel": "feature-extraction", "BartModel": "feature-extraction",
    "BartForConditionalGeneration": "summarization",
}


def infer_task(config: Any, source: str) -> str:
    """The task a model was fine-tuned (or pretrained) for, from config.json's
    ``finetuning_task``, else its ``architectures``; ``ConfigError`` when neither tells."""
    tuned = config.finetuning_task or ""
    if tuned in ("squad", "squad_v2"):
        return "question-answering"
    if tuned.startswith("glue/") or tuned == "classification":
        return "text-classification"
    if tuned in ("token-classification", "summarization"):
        return tuned
    for name in config.architectures or ():
        if name in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[name]
    raise ConfigError(f"{source}/config.json does not say which task the model does "
                      f"(finetuning_task={config.finetuning_task!r}, architectures="
                      f"{config.architectures}); pass the task: {', '.join(TASKS)}")


def _check_fit(task: str, config: Any, source: str) -> None:
    """``ConfigError`` unless ``task`` is known and config.json's architectures can do it."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    wanted = _FITS.get(task)
    if wanted is None or not config.architectures:
        return  # feature extraction fits all; without architectures the weights decide
    if not set(config.architectures) & set(wanted):
        raise ConfigError(f"{source} is a {'/'.join(config.architectures)} model; task {task} "
                          f"needs a {' or '.join(wanted)} model")


def _model_class(task: str, is_bart: bool) -> tuple[type, str | None]:
    """The model class of a task and the weight prefix of the head it must find in the files."""
    from bertforge.models import (BartForConditionalGeneration, BartModel, BertForMaskedLM,
                                  BertForQuestionAnswering, BertForSequenceClassification,
                                  BertForTokenClassification, BertModel)

    if is_bart:
        if task in ("summarization", "fill-mask"):
            return BartForConditionalGeneration, None
        if task == "feature-extraction":
            return BartModel, None
        raise ConfigError(f"task {task} needs a BERT model; BART models do summarization, "
                          "fill-mask and feature-extraction")
    if task == "summarization":
        raise ConfigError("task summarization needs a BART model (an encoder-decoder)")
    return {"question-answering": (BertForQuestionAnswering, "qa_outputs."),
            "text-classification": (BertForSequenceClassification, "classifier."),
            "token-classification": (BertForTokenClassification, "classifier."),
            "fill-mask": (BertForMaskedLM, "cls.predictions."),
            "feature-extraction": (BertModel, None)}[task]


def _load_model(task: str, model_dir: Path, is_bart: bool, device: torch.device) -> Any:
    """The task's model with the directory's weights, on ``device``, in eval mode; a head the
    files lack is a ``ConfigError`` (it would answer at random), not a fresh initialisation."""
    from bertforge.models.hub import read_weights

    cls, head = _model_class(task, is_bart)
    config = cls.config_class.load(model_dir)
    # Feature extraction never uses BERT's pooler, so it is not built (nor reported missing).
    model = cls(config, add_pooling_layer=False) if cls.__name__ == "BertModel" else cls(config)
    weights, source = read_weights(model_dir)
    report = model.load_hf_state_dict(weights, source=source)
    if head and any(k.startswith(head) for k in report.initialized):
        raise ConfigError(f"{source} has no {head.rstrip('.')} weights, the head task {task} "
                          "needs; give a model fine-tuned (or pretrained) for it")
    model.load_extras(model_dir)
    return (model.encoder if task == "feature-extraction" and is_bart else model).to(device).eval()


def _run_settings(model_dir: Path) -> dict[str, Any]:
    """QA window and n-best settings of the run that wrote ``model_dir`` (its config.yaml)."""
    path = model_dir / "config.yaml"
    if not path.is_file():
        return {}
    from bertforge.config import FinetuneConfig, load_config

    cfg = load_config(FinetuneConfig, path)
    if cfg.task != "squad":
        return {}
    return {"max_length": cfg.max_seq_length, "doc_stride": cfg.data.doc_stride,
            "max_query_length": cfg.data.max_query_length, "n_best_size": cfg.eval.n_best_size,
            "max_answer_length": cfg.eval.max_answer_length,
            "null_score_diff_threshold": cfg.eval.null_score_diff_threshold}


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device {name!r} is not a device; use auto, cpu, cuda or "
                          "cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name} was asked for but no CUDA GPU is available; use cpu")
    return device


def load_pipeline(model_dir: str | Path, task: str | None = None, *, device: str = "auto",
                  precision: str = "auto", max_length: int | None = None,
                  truncation: str | None = None, backend: Any = None,
                  **options: Any) -> Pipeline:
    """The pipeline of ``model_dir`` for ``task`` (None: the task the model was fine-tuned for).

    ``max_length``: tokens per input (default: the run's data.max_seq_length for QA, else the
    model's positions within the tokenizer's limit). ``truncation``: "error" or "truncate"
    (default: "truncate" for summarization, else "error"; QA windows instead). ``backend``: a
    callable with the PyTorch model's call signature and outputs (e.g. onnxruntime-backed) used
    instead of the PyTorch model. ``options``: the task's own (QA: doc_stride, max_query_length,
    n_best_size, max_answer_length, null_score_diff_threshold, max_windows; fill-mask: top_k;
    feature-extraction: pooling, normalize). User mistakes raise ``ConfigError``.
    """
    from bertforge.models.auto import is_seq2seq, load_config

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"model {model_dir} is not a model directory (no config.json)")
    config = load_config(model_dir)
    if task is None:
        task = infer_task(config, str(model_dir))
    _check_fit(task, config, str(model_dir))
    cls = PIPELINES[task]
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        allowed = ", ".join(cls.options) or "none"
        raise ConfigError(f"option {unknown[0]} does not apply to {task} (its options: {allowed})")
    truncation = truncation or cls.default_truncation
    if truncation not in TRUNCATION:
        raise ConfigError(f"truncation must be error or truncate, got {truncation!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    try:
        tokenizer = load_tokenizer(model_dir)
    except DataError as exc:
        raise ConfigError(f"model {model_dir}: {exc}") from None
    positions = config.max_position_embeddings
    settings = _run_settings(model_dir) if task == "question-answering" else {}
    run_length = settings.pop("max_length", None)
    limit = max_length or run_length or (
        384 if task == "question-answering" else tokenizer.model_max_length)
    if max_length is not None and not 3 <= max_length <= positions:
        raise ConfigError(f"max_length={max_length} must be between 3 and the model's "
                          f"{positions} positions")
    target = _device(device)
    if backend is not None:
        # A backend runs where its runtime put it (its ``device``; onnxruntime may have dropped
        # CUDA): report that device, and keep the inputs on the CPU when it is the CPU.
        target = torch.device(getattr(backend, "device", target))
    model = backend if backend is not None else _load_model(task, model_dir, is_seq2seq(config),
                                                            target)
    extra: dict[str, Any] = {**settings, **options}
    if task == "question-answering":
        extra["version_2"] = config.finetuning_task == "squad_v2"
    return cls(model=model, tokenizer=tokenizer, model_dir=model_dir, config=config,
               device=target,
               # onnxruntime computes in the exported fp32 (or int8): torch's autocast has no say
               precision=build_precision("fp32" if backend is not None else precision, target),
               max_length=min(limit, positions), truncation=truncation,
               backend="pytorch" if backend is None else type(backend).__name__, **extra)
