"""Typed run configuration: the pretraining and fine-tuning configs, and the generation options
that fine-tuning, ``generate``, ``predict summarize`` and the server share.

Every field carries its help text (``opt``); loading (defaults < YAML < ``--section.key=value``),
the did-you-mean errors, saving and the ``--help`` listing are ``bertforge.core.schema``'s, the
one loader of every command, re-exported here. The configs of the other commands live beside
their commands (``bertforge.commands``); the sections of the tasks with settings of their own
(``embedding.*``) beside their tasks, composed into ``FinetuneConfig`` from
``bertforge.tasks.settings``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, List, Optional, Union

from bertforge.core import limits
from bertforge.core.limits import (ATTENTION_BACKENDS, INFERENCE_PRECISIONS, MIN_SEQUENCE_TOKENS,
                                   MIN_TARGET_TOKENS, OPTIMIZERS, PRECISIONS, SCHEDULES,
                                   check_choice)
from bertforge.core.schema import (check_fields, describe, load_config, opt, refuse_blank_fields,
                                   run_defining_keys, save_config, to_dict)
from bertforge.errors import ConfigError
from bertforge.tasks.settings import TASK_SETTINGS

__all__ = ["FinetuneConfig", "GenerationOptions", "NoiseConfig", "PretrainConfig", "RunConfig",
           "describe", "load_config", "opt", "run_defining_keys", "save_config", "to_dict"]


@dataclass
class NoiseConfig:
    """BART denoising (data prepared with ``--objective denoise``); fairseq's option names."""

    mask: float = opt(0.3, "Fraction of words masked (text infilling with span-poisson).",
                      run_defining=True)
    mask_random: float = opt(0.1, "Fraction of masks that are a random token instead of <mask>.",
                             run_defining=True)
    poisson_lambda: float = opt(3.5, "Mean span length in words (span-poisson).",
                                run_defining=True)
    mask_length: str = opt("span-poisson", "span-poisson (text infilling), word or subword.",
                           run_defining=True)
    replace_length: int = opt(1, "A masked span becomes: 1 one <mask>, 0 nothing, -1 one <mask> "
                              "per token.", run_defining=True)
    permute_sentences: float = opt(1.0, "Fraction of sentences shuffled.", run_defining=True)
    rotate: float = opt(0.0, "Probability of rotating the document to a random start.",
                        run_defining=True)
    insert: float = opt(0.0, "Fraction of tokens inserted as <mask>/random tokens.",
                        run_defining=True)
    delete: float = opt(0.0, "Fraction of tokens deleted (token deletion).", run_defining=True)

    def __post_init__(self) -> None:
        from bertforge.data.noising import check_noise_spec

        try:
            check_noise_spec(self.spec())
        except ValueError as exc:  # "NoiseSpec.mask=..." -> "data.noise.mask=..."
            raise ConfigError(str(exc).replace("NoiseSpec.", "data.noise.", 1)) from None

    def spec(self) -> Any:
        """These settings as the ``bertforge.data.noising.NoiseSpec`` the noising functions take."""
        from bertforge.data.noising import NoiseSpec

        return NoiseSpec(**dataclasses.asdict(self))


@dataclass
class DataConfig:
    path: Optional[str] = opt(None, "Prepared data: a `bertforge prepare` output directory, or NVIDIA/Google "
                    "hdf5 files (a directory, a file or a glob).")
    masked_lm_prob: Optional[float] = opt(None, "Fraction of tokens to predict; default: the value "
                                          "recorded by `prepare` in the manifest (0.15).",
                                          run_defining=True)
    max_predictions: Optional[int] = opt(None, "Cap on predicted tokens per sequence; default: "
                                         "the manifest's value (20 at seq 128, 80 at seq 512).",
                                         run_defining=True)
    whole_word_masking: Optional[bool] = opt(None, "Mask whole words; default: the manifest's "
                                             "value.", run_defining=True)
    bin_by_length: bool = opt(True, "Draw every global batch from one length bin to cut padding.",
                              run_defining=True)
    num_workers: int = opt(2, "DataLoader worker processes that mask and collate (0 = in-process).")
    pack_sequences: bool = opt(False, "Pack a micro-batch's sequences into as few rows of "
                               "max_seq_length as fit (first fit decreasing), attention kept "
                               "within each sequence; fixed row width, less padding.")
    noise: NoiseConfig = opt(help="BART denoising noise (denoise data only).", factory=NoiseConfig)

    def __post_init__(self) -> None:
        if self.masked_lm_prob is not None:
            limits.MASKED_LM_PROB.check(self.masked_lm_prob, "data.masked_lm_prob", ConfigError)
        if self.max_predictions is not None and self.max_predictions < 1:
            raise ConfigError(f"data.max_predictions must be >= 1, got {self.max_predictions}")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")


@dataclass
class TrainConfig:
    max_steps: int = opt(1000, "Optimizer steps to run (the schedule ends here).",
                         run_defining=True)
    global_batch_size: int = opt(256, "Sequences per optimizer step, over all ranks and "
                                 "accumulation micro-steps.", run_defining=True)
    micro_batch_size: int = opt(32, "Sequences per forward/backward on one rank. Accumulation = "
                                "global_batch_size / (micro_batch_size x world size).")
    seed: int = opt(12345, "Seed for weight init, data order and masking.", run_defining=True)
    log_every: int = opt(10, "Steps between metric lines (the only host-device syncs).")
    eval_every: int = opt(0, "Steps between validation passes (0 = only at the end).")
    eval_batches: int = opt(20, "Validation micro-batches per pass (0 = no validation).")
    gradient_checkpointing: bool = opt(False, "Recompute activations in backward to save memory.")
    compile: Optional[bool] = opt(None, "torch.compile each transformer layer (regional); "
                                  "default: on for GPUs, off on CPUs.")
    unpad: bool = opt(True, "Run the encoder on the real tokens only, no work on padding "
                      "(same results; docs/performance.md).")
    attention_backend: str = opt("auto", "Attention kernel for unpadded tokens: auto, flash "
                                 "(flash-attn package), torch-flash (PyTorch's own varlen flash "
                                 "kernel, CUDA), nested (PyTorch SDPA on nested tensors) or "
                                 "padded (per-sequence padding; the fastest on CPU).")
    max_skipped_steps: int = opt(20, "Stop with an error after this many consecutive steps with "
                                 "non-finite gradients (fp16 loss-scale backoff skips a few).")
    dist_timeout_s: Optional[float] = opt(None, "Seconds a collective waits for the other ranks "
                                          "before every rank stops with an error; default 300 "
                                          "with gloo (CPU), 600 with NCCL (torch's default).")
    fsdp: bool = opt(False, "Shard weights, gradients and optimizer state over the ranks "
                     "(FSDP2, each transformer layer a unit) instead of replicating them (DDP); "
                     "for models whose training state does not fit one GPU. No effect in one "
                     "process. Runs resume across DDP and FSDP either way.")
    fsdp_reduce_dtype: str = opt("fp32", "With train.fsdp and bf16/fp16: the dtype gradients "
                                 "are reduce-scattered in. fp32 (default) keeps small gradients "
                                 "exact when summed over many ranks; bf16 halves that traffic. "
                                 "Weights are always all-gathered in the compute dtype.")

    def __post_init__(self) -> None:
        for name in ("max_steps", "global_batch_size", "micro_batch_size", "log_every",
                     "max_skipped_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "eval_batches"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        check_choice(self.attention_backend, "train.attention_backend", ATTENTION_BACKENDS,
                     ConfigError)
        check_choice(self.fsdp_reduce_dtype, "train.fsdp_reduce_dtype", ("fp32", "bf16"),
                     ConfigError)
        if self.dist_timeout_s is not None:
            limits.DIST_TIMEOUT_S.check(self.dist_timeout_s, "train.dist_timeout_s", ConfigError)
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"train.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"train.micro_batch_size ({self.micro_batch_size})")


@dataclass
class OptimConfig:
    name: str = opt("lamb", "Optimizer: lamb (NVIDIA's recipe), adamw, decoupled_adamw (weight "
                    "decay scaled by lr / peak lr, composer's), stableadamw (AdamW with per-tensor "
                    "update clipping), decoupled_stableadamw (ModernBERT's) or muon (Muon for the "
                    "transformer blocks' matrices, AdamW for the rest); see docs/optim.md.")
    lr: float = opt(6e-3, "Peak learning rate.")
    warmup: float = opt(0.2843, "Warm-up length as a fraction of train.max_steps.")
    schedule: str = opt("poly", "LR schedule after warm-up: poly (NVIDIA, power 0.5), linear, "
                        "constant, or wsd (warm-up, stable, decay over the last optim.decay).")
    power: float = opt(0.5, "Exponent of the poly schedule.")
    decay: float = opt(0.1, "wsd: fraction of train.max_steps spent decaying, at the end "
                       "(warmup + decay <= 1).")
    decay_shape: str = opt("1-sqrt", "wsd: shape of the decay, 1-sqrt (ModernBERT's) or linear.")
    min_lr_ratio: float = opt(0.0, "wsd: the last step's lr as a fraction of optim.lr.")
    weight_decay: float = opt(0.01, "Decoupled weight decay (not applied to biases and LayerNorm); "
                              "with decoupled_* optimizers not multiplied by the lr (use ~1e-5).")
    betas: List[float] = opt(help="Adam moment coefficients.", factory=lambda: [0.9, 0.999])
    eps: float = opt(1e-6, "Adam epsilon.")
    max_grad_norm: float = opt(1.0, "Global gradient-norm clip (0 = off).")

    def __post_init__(self) -> None:
        check_choice(self.name, "optim.name", OPTIMIZERS, ConfigError)
        check_choice(self.schedule, "optim.schedule", SCHEDULES, ConfigError)
        if len(self.betas) != 2:
            raise ConfigError(f"optim.betas needs two numbers, got {list(self.betas)}")
        for i, beta in enumerate(self.betas):
            limits.BETA.check(beta, f"optim.betas[{i}]", ConfigError)
        for name, allowed in (("lr", limits.LEARNING_RATE), ("warmup", limits.WARMUP),
                              ("power", limits.POWER), ("weight_decay", limits.WEIGHT_DECAY),
                              ("eps", limits.EPS), ("max_grad_norm", limits.MAX_GRAD_NORM),
                              ("decay", limits.DECAY), ("min_lr_ratio", limits.MIN_LR_RATIO)):
            allowed.check(getattr(self, name), f"optim.{name}", ConfigError)
        check_choice(self.decay_shape, "optim.decay_shape", limits.DECAY_SHAPES, ConfigError)
        if self.schedule == "wsd":
            limits.check_phases(self.warmup, self.decay, ("optim.warmup", "optim.decay"),
                                ConfigError)


@dataclass
class CheckpointConfig:
    every: int = opt(1000, "Steps between checkpoints (the last step is always saved).")
    keep: int = opt(3, "Newest checkpoints to keep (0 = keep all).")

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ConfigError(f"checkpoint.every must be >= 1, got {self.every}")
        if self.keep < 0:
            raise ConfigError(f"checkpoint.keep must be >= 0 (0 keeps all), got {self.keep}")


@dataclass
class BenchmarkConfig:
    warmup_steps: int = opt(5, "Steps run before timing starts (compilation, allocator warm-up).")
    steps: int = opt(20, "Timed steps.")

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.steps < 1:
            raise ConfigError(f"benchmark.warmup_steps must be >= 0 and benchmark.steps >= 1, "
                              f"got {self.warmup_steps} and {self.steps}")


@dataclass
class RunConfig:
    """The settings every training command shares; each task adds its own ``data`` section."""

    precisions: ClassVar[tuple[str, ...]] = PRECISIONS  # what ``precision`` may be

    model: str = opt("bert-base-uncased", "Preset name (bert-tiny ... bert-large-cased, bart-tiny, "
                     "bart-base, bart-large) or a config.json / model directory. vocab_size "
                     "follows the data's vocabulary.",
                     run_defining=True)
    output_dir: str = opt("runs/pretrain", "Where checkpoints, metrics and the resolved config go.")
    train: TrainConfig = opt(help="Steps and batch sizes.", factory=TrainConfig)
    optim: OptimConfig = opt(help="Optimizer and LR schedule.", factory=OptimConfig,
                             run_defining=True)
    precision: str = opt("auto", "fp32, bf16, fp16 (dynamic loss scaling) or auto "
                         "(bf16 where the device supports it, else fp32).", run_defining=True)
    checkpoint: CheckpointConfig = opt(help="Checkpointing.", factory=CheckpointConfig)
    resume: str = opt("auto", "auto (newest complete checkpoint in output_dir, if any), none, "
                      "or a checkpoint directory.")
    tensorboard: bool = opt(True, "Also write TensorBoard event files (if tensorboard is installed).")
    benchmark: BenchmarkConfig = opt(help="Settings of --benchmark mode.", factory=BenchmarkConfig)

    def __post_init__(self) -> None:
        refuse_blank_fields(self)
        check_choice(self.precision, "precision", self.precisions, ConfigError)
        backend = getattr(self.train, "attention_backend", None)
        if backend in limits.FUSED_ATTENTION_BACKENDS and self.precision == "fp32":
            raise ConfigError(f"train.attention_backend={backend} needs bf16 or fp16 activations "
                              "(flash kernels have no fp32 form), but precision=fp32; use "
                              "precision=bf16 (or auto on a GPU), or attention_backend=auto")
        if getattr(self.train, "fsdp", False) and self.optim.name == "muon":
            raise ConfigError("optim.name=muon orthogonalizes each matrix whole, and "
                              "train.fsdp=true shards matrices over the ranks; use "
                              "train.fsdp=false (DDP) with muon, or another optimizer with FSDP")


@dataclass
class PretrainConfig(RunConfig):
    data: DataConfig = opt(help="Training data.", factory=DataConfig)
    init_from: Optional[str] = opt(None, "Load weights only (e.g. phase-1 final -> phase 2); "
                                   "optimizer, schedule and data start fresh.")
    phase: int = opt(1, "Phase label stored in checkpoints and metrics (1: seq 128, 2: seq 512).",
                     run_defining=True)




@dataclass
class FinetuneDataConfig:
    train: Optional[str] = opt(None, "Training file (format by task: SQuAD JSON/JSONL, GLUE TSV or "
                               "CSV/TSV/JSONL, SWAG CSV, CoNLL/JSONL); unset = evaluate only.",
                               run_defining=True)
    validation: Optional[str] = opt(None, "Evaluation file, scored during/after training (MNLI: "
                                    "dev_matched).")
    validation_mismatched: Optional[str] = opt(None, "MNLI only: dev_mismatched, reported as "
                                               "accuracy_mm.")
    task_name: Optional[str] = opt(None, "GLUE task: cola sst2 mrpc stsb qqp mnli qnli rte wnli.",
                                   run_defining=True)
    max_seq_length: Optional[int] = opt(None, "Tokens per sequence (pair); default 384 for squad, "
                                        "1024 for summarization (the source article), 128 "
                                        "otherwise; at most the model's positions.",
                                        run_defining=True, minimum=MIN_SEQUENCE_TOKENS)
    max_target_length: Optional[int] = opt(None, "summarization: reference summaries are cut to "
                                           "this many tokens for training; default 256, at most "
                                           "the model's positions.", run_defining=True,
                                           minimum=MIN_TARGET_TOKENS)
    article_field: Optional[str] = opt(None, "summarization: the source column; default: "
                                       "detected (article, document, text, source, input).",
                                       run_defining=True)
    summary_field: Optional[str] = opt(None, "summarization: the reference column; default: "
                                       "detected (summary, highlights, target, abstract).",
                                       run_defining=True)
    doc_stride: int = opt(128, "squad: tokens between the starts of consecutive windows of a long "
                          "context.", run_defining=True, minimum=1)
    max_query_length: int = opt(64, "squad: questions are cut to this many tokens.",
                                run_defining=True, minimum=1)
    text_columns: Optional[List[str]] = opt(None, "classification: one or two text columns; "
                                            "default: detected from the header.",
                                            run_defining=True)
    label_column: Optional[str] = opt(None, "classification: the label column; default: detected.",
                                      run_defining=True)
    regression: bool = opt(False, "classification: the label is a number (one output, MSE loss).",
                           run_defining=True)
    max_train_examples: Optional[int] = opt(None, "Use only the first N training examples.",
                                            run_defining=True, minimum=1)
    max_eval_examples: Optional[int] = opt(None, "Evaluate on the first N examples only.",
                                           minimum=1)

    def __post_init__(self) -> None:
        check_fields(self, "data.")
        if self.text_columns is not None and not 1 <= len(self.text_columns) <= 2:
            raise ConfigError(f"data.text_columns takes one or two column names, got "
                              f"{list(self.text_columns)}")


@dataclass
class GenerationOptions:
    """How to generate (summaries), defined once for ``finetune`` (as ``eval.*``), ``generate``,
    ``predict summarize`` and the server's summarization requests. Unset (None): the model's
    generation_config.json. The ranges are ``GenerationConfig``'s, checked by building one."""

    key_prefix: ClassVar[str] = ""  # how the settings are named in errors (``eval.``)

    num_beams: Optional[int] = opt(None, "Beams of beam search (1 = greedy).")
    length_penalty: Optional[float] = opt(None, "Beam score = log-prob / length ** "
                                          "length_penalty.")
    max_length: Optional[int] = opt(None, "Longest output in tokens (the decoder start token "
                                    "included).")
    min_length: Optional[int] = opt(None, "Shortest output in tokens.")
    no_repeat_ngram_size: Optional[int] = opt(None, "Never repeat an n-gram of this size "
                                              "(0 = off).")
    early_stopping: Optional[Union[bool, str]] = opt(
        None, "Beam search stopping rule, transformers' meaning: true (stop once num_beams "
        "hypotheses are finished), false or never.", choices=("true", "false", "never"))

    def __post_init__(self) -> None:
        if isinstance(self.early_stopping, str) and self.early_stopping.lower() in ("true",
                                                                                    "false"):
            self.early_stopping = self.early_stopping.lower() == "true"
        given = self.generation_overrides()
        if given:
            check_generation_settings(given, self.key_prefix)

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(GenerationOptions))

    @classmethod
    def request_kinds(cls) -> dict[str, type | None]:
        """Per setting, the number type a request field must have (None: true/false/"never")."""
        hints = typing.get_type_hints(GenerationOptions)
        out: dict[str, type | None] = {}
        for name in cls.setting_names():
            types = [t for t in typing.get_args(hints[name]) if t is not type(None)]
            out[name] = types[0] if types in ([int], [float]) else None
        return out

    def generation_overrides(self) -> dict[str, Any]:
        """The generation settings given here (None = keep the model's)."""
        return {k: getattr(self, k) for k in self.setting_names() if getattr(self, k) is not None}


def check_generation_settings(given: dict[str, Any], prefix: str = "") -> None:
    """Validate generation overrides with ``GenerationConfig``'s own rules (one definition).

    Settings are checked together; a minimum length without a maximum is checked against no
    limit, since the model's own maximum applies later."""
    from bertforge.models.generation.config import GenerationConfig, named_as

    free = {} if "max_length" in given else {"max_length": None, "max_new_tokens": 1 << 30}
    try:
        GenerationConfig(**free, **given)
    except ConfigError as exc:
        raise named_as(exc, lambda name: prefix + name) from None


@dataclass
class EvalConfig(GenerationOptions):
    """Evaluation and prediction; the generation settings (``eval.num_beams`` ...) apply to
    summarization."""

    key_prefix: ClassVar[str] = "eval."

    batch_size: int = opt(64, "Sequences per evaluation forward pass on one rank.")
    n_best_size: int = opt(20, "squad: candidate start and end tokens kept per window.")
    max_answer_length: int = opt(30, "squad: longest answer in tokens.")
    null_score_diff_threshold: float = opt(0.0, "squad v2.0: answer \"\" when the no-answer score "
                                           "beats the best span by more than this.")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_size", "n_best_size", "max_answer_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"eval.{name} must be >= 1, got {getattr(self, name)}")
        if not math.isfinite(self.null_score_diff_threshold):
            raise ConfigError(f"eval.null_score_diff_threshold must be a finite number, got "
                              f"{self.null_score_diff_threshold}")


@dataclass
class FinetuneTrainConfig(TrainConfig):
    max_steps: Optional[int] = opt(None, "Optimizer steps; default: train.epochs passes over the "
                                   "training data.", run_defining=True)
    epochs: float = opt(2.0, "Passes over the training data (when max_steps is not set).",
                        run_defining=True)
    global_batch_size: int = opt(32, "Sequences (examples) per optimizer step, over all ranks "
                                 "and accumulation micro-steps.", run_defining=True)
    micro_batch_size: int = opt(32, "Sequences per forward/backward on one rank.")
    unpad: bool = opt(True, "Run the encoder on the real tokens only (no work on padding; "
                      "the same outputs at real tokens, so the same training up to float "
                      "rounding). Set false only for a kernel that needs fixed shapes.")
    eval_batches: int = opt(0, "Unused by fine-tuning: evaluation always covers the whole "
                            "validation file (see data.max_eval_examples).")
    label_smoothing: float = opt(0.0, "summarization: probability mass spread uniformly over the "
                                 "vocabulary in the loss (0.1 in BART's recipes).",
                                 run_defining=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.epochs > 0:
            raise ConfigError(f"train.epochs must be > 0, got {self.epochs}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing must be in [0, 1), got "
                              f"{self.label_smoothing}")


# How fine-tuning's schedule counts steps (bertforge.optim.build: COUNTINGS, and the
# schedules the Trainer's counting supports); literal here so config imports no torch.
SCHEDULE_COUNTINGS = ("transformers", "nvidia")
TRAINER_COUNTED_SCHEDULES = ("linear", "poly", "constant")


@dataclass
class FinetuneOptimConfig(OptimConfig):
    """Fine-tuning's defaults are transformers' ``Trainer``'s (``TrainingArguments``): AdamW with
    betas 0.9/0.999, eps 1e-8, no weight decay, clipping at 1.0, and its linear schedule with
    ``ceil(warmup * steps)`` warm-up steps. docs/finetuning.md explains each; the parity test
    tests/parity/test_finetune_trainer_parity.py checks them step by step."""

    name: str = opt("adamw", "Optimizer: adamw (the usual for fine-tuning) or lamb.")
    lr: float = opt(5e-5, "Peak learning rate.")
    warmup: float = opt(0.1, "Warm-up length as a fraction of the run's steps (rounded up to "
                        "whole steps with optim.schedule_counting=transformers).")
    schedule: str = opt("linear", "LR schedule after warm-up: linear (to 0), poly, constant.")
    weight_decay: float = opt(0.0, "Decoupled weight decay, not applied to biases and LayerNorm "
                              "(0, as transformers' Trainer; BERT's original recipe used 0.01).")
    eps: float = opt(1e-8, "Adam epsilon (1e-8, as transformers' Trainer and torch's AdamW).")
    schedule_counting: str = opt("transformers", "How the schedule counts steps: transformers "
                                 "(the Trainer's: ceil(warmup x steps) warm-up steps, the first "
                                 "step at lr 0) or nvidia (pretraining's: step k at progress "
                                 "k/steps, no rounding).")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.schedule_counting, "optim.schedule_counting", SCHEDULE_COUNTINGS,
                     ConfigError)
        if (self.schedule_counting == "transformers"
                and self.schedule not in TRAINER_COUNTED_SCHEDULES):
            raise ConfigError(f"optim.schedule={self.schedule} needs "
                              "optim.schedule_counting=nvidia (the Trainer's counting has "
                              f"{', '.join(TRAINER_COUNTED_SCHEDULES)})")


def _task_settings(cls: type) -> type:
    """Add each task's own settings section (``bertforge.tasks.settings``: ``embedding.*``) to
    ``cls``, after its other fields, before it becomes a dataclass; the settings modules are
    torch-free, so importing this module stays light."""
    for record in TASK_SETTINGS:
        section = record.settings.load()
        cls.__annotations__[record.key] = section
        setattr(cls, record.key, opt(help=f"{record.help} ({', '.join(record.tasks)}).",
                                     factory=section))
    return cls


@dataclass
@_task_settings
class FinetuneConfig(RunConfig):
    """``bertforge finetune``. The sections of tasks with settings of their own (``embedding``)
    come from ``bertforge.tasks.settings`` and follow ``eval``."""

    # Evaluation-only runs (no data.train) also take int8, and choose auto by the CPU's units
    # and the quality guard (bertforge.tasks.eval_precision); training refuses int8 below.
    precisions: ClassVar[tuple[str, ...]] = INFERENCE_PRECISIONS

    task: str = opt("classification", "The task, by its name or an alias (the task registry's; "
                    "`bertforge finetune --help` lists them).", run_defining=True)
    model: Optional[str] = opt(None, "Starting point: a Hugging Face BERT directory or a bertforge "
                               "checkpoint (with its tokenizer); heads it lacks start fresh.",
                               run_defining=True)
    output_dir: str = opt("runs/finetune", "Where checkpoints, metrics, predictions, "
                          "eval_results.json and the final model go.")
    precision: str = opt("auto", "Training: fp32, bf16, fp16 (dynamic loss scaling) or auto "
                         "(bf16 where the device supports it, else fp32). Evaluation only (no "
                         "data.train): also int8 (CPU: dynamically quantized linear layers), "
                         "and auto on a CPU is the fastest of bf16 and int8 its units run whose "
                         "outputs keep a cosine >= 0.999 to fp32's on the first evaluation "
                         "batch, else fp32.", run_defining=True)
    train: FinetuneTrainConfig = opt(help="Steps and batch sizes.", factory=FinetuneTrainConfig)
    optim: FinetuneOptimConfig = opt(help="Optimizer and LR schedule.",
                                     factory=FinetuneOptimConfig, run_defining=True)
    data: FinetuneDataConfig = opt(help="Task data.", factory=FinetuneDataConfig)
    eval: EvalConfig = opt(help="Evaluation and prediction.", factory=EvalConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.precision == "int8" and self.data.train:
            raise ConfigError("precision=int8 is for evaluation-only runs (no data.train): "
                              "int8 layers do not train; fine-tune with precision fp32, bf16, "
                              "fp16 or auto, then evaluate the result with precision=int8")
        # The task name is checked against the task registry (which this module may not read)
        # by `bertforge finetune` before anything runs, and by tasks.registry.build_task.
