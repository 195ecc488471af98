"""Choosing the task of a model directory and loading its pipeline: the task registry says which
pipeline a task has and the head kind its model needs; ``bertforge.models.loading`` loads that
head (config.json read once, weights verified)."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import torch

from bertforge.core.arguments import check_argument, checked
from bertforge.core.limits import INFERENCE_PRECISIONS, setting_changed
from bertforge.errors import ConfigError, DataError, in_context
from bertforge.export.sentence_transformers import SENTENCE_BERT_CONFIG, saved_max_seq_length
from bertforge.inference.pipelines.base import Pipeline, TRUNCATION
from bertforge.inference.pipelines.chunking import CHUNK_OPTIONS
from bertforge.inference.pipelines.numerics import settle_precision
from bertforge.models.loading import ModelSource, load_model, model_directory, open_model
from bertforge.models.registry import family_of_architecture
from bertforge.tasks.registry import (TaskSpec, check_model_fits_task, get_task, task_names,
                                      task_of_finetuned, task_of_head)
from bertforge.tokenization import load_tokenizer
from bertforge.speed import apply_speed_options
from bertforge.runtime.device import resolve_device
from bertforge.runtime.precision import build_precision


def infer_task(config: Any, source: str) -> str:
    """The task a model was fine-tuned (or pretrained) for, from config.json's
    ``finetuning_task``, else its ``architectures``; ``ConfigError`` when neither tells."""
    spec = task_of_finetuned(config.finetuning_task)
    if spec is not None and spec.pipeline is not None:
        return spec.name
    for name in config.architectures or ():
        found = family_of_architecture(name)
        for head in found[0].heads_in(name) if found is not None else ():
            spec = task_of_head(head)
            if spec is not None:
                return spec.name
    raise ConfigError(f"{source}/config.json does not say which task the model does "
                      f"(finetuning_task={config.finetuning_task!r}, architectures="
                      f"{config.architectures}); pass the task: "
                      f"{', '.join(task_names(served=True))}")


def _check_fit(spec: TaskSpec, source: ModelSource) -> None:
    """``ConfigError`` unless the model's family can do task ``spec`` and config.json's
    architectures (when it names them) is a model with the head ``spec`` needs."""
    family, where = source.family, str(source.directory)
    check_model_fits_task(spec, family, where)
    named = source.config.architectures
    if spec.head != "base" and named and not any(spec.head in family.heads_in(n) for n in named):
        classes = family.architectures()
        direct = [n for n, heads in classes.items() if spec.head in heads]
        fits = direct + [n for n in classes if n not in direct and spec.head in family.heads_in(n)]
        raise ConfigError(f"{where} is a {'/'.join(named)} model; task {spec.name} needs a "
                          f"{' or '.join(fits)} model")


def _load_model(spec: TaskSpec, source: ModelSource, device: torch.device) -> Any:
    """The task's model with the directory's weights, on ``device``, in eval mode; a head the
    files lack is a ``ConfigError`` (it would answer at random), not a fresh initialisation.
    An encoder-decoder's feature extraction runs its encoder alone. Encoders run on the real
    tokens of a batch only, with the CPU kernels and the partial last layer
    (``bertforge.speed``): the same outputs at real tokens, no work on the padding of
    mixed-length batches. In fp32: the pipeline's precision is applied to it after
    (``pipelines.numerics``)."""
    model = load_model(source, spec.head, device=device)
    apply_speed_options(model, unpad=True)
    return model.encoder if spec.name == "feature-extraction" and source.family.seq2seq else model


def _run_settings(model_dir: Path, spec: TaskSpec, cls: type[Pipeline]) -> dict[str, Any]:
    """The pipeline options the fine-tuning run that wrote ``model_dir`` recorded for this task
    (its config.yaml); none when the run trained another task or there is no config.yaml."""
    path = model_dir / "config.yaml"
    if not path.is_file():
        return {}
    from bertforge.config import FinetuneConfig, load_config

    run = load_config(FinetuneConfig, path)
    return cls.run_settings(run) if get_task(run.task).name == spec.name else {}


@checked
def load_pipeline(model_dir: str | Path, task: str | None = None, *, device: str = "auto",
                  precision: str = "auto", max_length: int | None = None,
                  truncation: str | None = None, backend: Any = None,
                  **options: Any) -> Pipeline:
    """The pipeline of ``model_dir`` for ``task`` (None: the task the model was fine-tuned for;
    any name or alias of the task registry).

    ``precision``: auto, fp32, bf16, int8 or fp16; the model loads in fp32 and
    ``pipelines.numerics`` applies the choice (``auto``: by the CPU's units and the quality
    guard), kept with its reason as ``precision_choice``. ``max_length``: tokens per input
    (default: the run's data.max_seq_length for QA, else the model's positions within the
    tokenizer's limit). ``truncation``: "error", "truncate" or,
    for feature-extraction and text-classification, "chunk" (overlapping windows, their results
    pooled: ``chunking``) (default: "truncate" for summarization, else "error"; QA windows
    instead). ``backend``: a
    callable with the PyTorch model's call signature and outputs (e.g. onnxruntime-backed) used
    instead of the PyTorch model; one with a ``device`` has chosen it (``device`` is then not
    read) and one with a ``source`` has read config.json (as ``OnnxModel``). ``options``: the
    task's own (QA: doc_stride, max_query_length, n_best_size, max_answer_length,
    null_score_diff_threshold, max_windows, align_to_words; fill-mask: top_k;
    feature-extraction: pooling, normalize, chunk_overlap, max_windows; text-classification:
    chunk_overlap, chunk_pool, max_windows). User mistakes raise ``ConfigError``.
    """
    model_dir = model_directory(model_dir)
    source = getattr(backend, "source", None) or open_model(model_dir)
    config = source.config
    spec = get_task(task if task is not None else infer_task(config, str(model_dir)),
                    served=True)
    _check_fit(spec, source)
    cls = spec.pipeline.load()
    options = _check_options(cls, spec, options)
    truncation = _check_truncation(cls, spec, truncation or cls.default_truncation, options)
    if precision not in INFERENCE_PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(INFERENCE_PRECISIONS)}, got "
                          f"{precision!r}")
    if backend is not None and precision not in ("auto", "fp32"):
        raise ConfigError(f"precision {precision}: an ONNX backend runs its export as it is "
                          f"(model.onnx in fp32, model.int8.onnx in int8); load the PyTorch "
                          f"model for {precision}")
    try:
        tokenizer = load_tokenizer(model_dir, source.family)
    except DataError as exc:
        raise ConfigError(in_context(f"model {model_dir}", exc, str(model_dir))) from None
    settings = _run_settings(model_dir, spec, cls)
    limit = _input_limit(model_dir, config, max_length, settings.pop("max_length", None),
                         spec.max_length if cls.windowed else tokenizer.model_max_length)
    # A backend runs where its runtime put it (its ``device``; onnxruntime may have dropped
    # CUDA): report that device, and keep the inputs on the CPU when it is the CPU.
    placed = getattr(backend, "device", None)
    target = resolve_device(device) if placed is None else torch.device(placed)
    model = backend if backend is not None else _load_model(spec, source, target)
    extra: dict[str, Any] = {**settings, **options}
    pipe = cls(task=spec.name, model=model, tokenizer=tokenizer, model_dir=model_dir,
               config=config, device=target, precision=build_precision("fp32", target),
               max_length=limit, truncation=truncation,
               backend="pytorch" if backend is None else type(backend).__name__, **extra)
    # onnxruntime computes in the exported fp32 (or int8): torch's numerics have no say
    if backend is None:
        pipe.precision_choice = settle_precision(pipe, precision)
    return pipe


def _check_options(cls: type[Pipeline], spec: TaskSpec,
                   options: dict[str, Any]) -> dict[str, Any]:
    """The options as the pipeline's fields take them (numpy's numbers as Python's);
    ``ConfigError`` for an option the task's pipeline does not have, ``ArgumentTypeError``
    (a TypeError) for one of the wrong type, by the pipeline's own field annotations."""
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        allowed = ", ".join(cls.options) or "none"
        raise ConfigError(f"option {unknown[0]} does not apply to {spec.name} (its options: "
                          f"{allowed})")
    hints = typing.get_type_hints(cls)
    return {name: check_argument("load_pipeline", name, hints.get(name, Any), value)
            for name, value in options.items()}


def _check_truncation(cls: type[Pipeline], spec: TaskSpec, truncation: str,
                      options: dict[str, Any]) -> str:
    """``truncation`` when the task's pipeline takes it; ``ConfigError`` otherwise, and for a
    chunk option (``chunking.CHUNK_OPTIONS``) given without ``truncation="chunk"``."""
    def chunking() -> str:  # only on the error paths: it imports every pipeline's module
        return ", ".join(n for n in task_names(served=True) if get_task(n).pipeline.load().chunks)

    if truncation not in TRUNCATION:
        raise ConfigError(f"truncation must be error or truncate, or chunk ({chunking()}), got "
                          f"{truncation!r}")
    if truncation == "chunk" and not cls.chunks:
        why = " (it splits long contexts into windows of its own)" if cls.windowed else ""
        raise ConfigError(f"truncation=chunk does not apply to {spec.name}{why}; it applies to "
                          f"{chunking()}")
    given = [name for name in CHUNK_OPTIONS if name in options] if cls.chunks else []
    if given and truncation != "chunk":
        raise ConfigError(f"option {given[0]} applies with truncation=chunk, not {truncation}")
    return truncation


def _input_limit(model_dir: Path, config: Any, asked: int | None, run_length: int | None,
                 default: int) -> int:
    """Tokens per input: ``asked`` (``max_length=``), else the fine-tuning run's, else
    ``default``; never past the model's positions, nor past the ``max_seq_length`` a
    sentence-transformers directory was saved with (what its transformer was trained on and
    sentence-transformers cuts to), which ``asked`` may lower and not raise."""
    positions = config.max_position_embeddings
    if asked is not None and not 3 <= asked <= positions:
        raise ConfigError(f"max_length={asked} must be between 3 and the model's "
                          f"{positions} positions")
    saved = saved_max_seq_length(model_dir)
    if saved is not None and asked is not None and asked > saved:
        raise ConfigError(f"max_length={asked} is over the {saved} tokens this model was made "
                          f"for ({model_dir / SENTENCE_BERT_CONFIG}'s max_seq_length); pass "
                          f"{saved} or less")
    if asked is None and run_length is None and default > positions:
        setting_changed(f"{model_dir}: max_length", default, positions,
                        f"the model has {positions} positions", default=True)
    limit = min(asked or run_length or default, positions)
    return limit if saved is None else min(limit, saved)


def _device_name(device: Any) -> str:
    """transformers' device forms as ours: -1 is the CPU, N is cuda:N, a torch.device its
    name."""
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise ConfigError(f"device must be a name (auto, cpu, cuda, cuda:N), a GPU number or -1, "
                          f"got {device!r}")
    if isinstance(device, int):
        return "cpu" if device < 0 else f"cuda:{device}"
    return str(device)


@checked
def pipeline(task: str | None = None, model: str | Path | None = None, *,
             device: Any = "auto", **options: Any) -> Pipeline:
    """A pipeline called as transformers' ``pipeline(task, model)``: ``task`` a bertforge or
    transformers task name or alias (None: the task the model was fine-tuned for), ``model`` a
    model directory. It answers a string, a dict of fields or a list of them: one input gives
    one result dict, a list a list (``Pipeline.__call__``). ``device``: auto, cpu, cuda[:N], a
    GPU number or -1; ``options`` are ``load_pipeline``'s (precision, max_length, truncation and
    the task's own, e.g. top_k or align_to_words). User mistakes raise ``ConfigError``."""
    if model is None:
        hint = (f"; to load {task!r}, pass it as model=" if task is not None
                and Path(task).exists() else "")
        raise ConfigError(f"pipeline() needs model=: a model directory; bertforge has no default "
                          f"model for a task{hint}")
    return load_pipeline(model, task, device=_device_name(device), **options)
