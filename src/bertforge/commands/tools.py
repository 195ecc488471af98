"""The helper commands: ``convert`` (NVIDIA checkpoints -> Hugging Face), ``plan`` (batch and
learning rate for a GPU setup) and ``demo`` (the whole journey on a sample)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bertforge.commands.base import Command
from bertforge.core.schema import REQUIRED, check_fields, opt, save_config

CONVERT_CONFIG_NAME = "convert-config.yaml"


@dataclass
class ConvertConfig:
    """``bertforge convert``."""

    checkpoint: str = opt(REQUIRED, "NVIDIA .pt checkpoint.")
    model_config: str = opt(REQUIRED, "Their bert_config.json, or a preset name (formerly "
                            "--config, which now takes a YAML file of these settings).",
                            aliases=("config",))
    output: str = opt(REQUIRED, "Output model directory.")
    vocab: Optional[str] = opt(None, "vocab.txt to ship with the model.")
    trust_pickle: bool = opt(False, "Allow full pickle loading (only for checkpoints you trust).")

    def __post_init__(self) -> None:
        check_fields(self)


def run_convert(cfg: ConvertConfig) -> int:
    from bertforge.models.convert import convert_nvidia_checkpoint

    out = convert_nvidia_checkpoint(Path(cfg.checkpoint), cfg.model_config, Path(cfg.output),
                                    vocab=Path(cfg.vocab) if cfg.vocab else None,
                                    trust_pickle=cfg.trust_pickle)
    save_config(cfg, Path(out) / CONVERT_CONFIG_NAME)
    print(f"wrote Hugging Face model directory {out}")
    return 0


@dataclass
class PlanConfig:
    """``bertforge plan``."""

    model: str = opt("bert-large-uncased", "Preset name or config.json.")
    max_seq_length: int = opt(128, "Sequence length.", minimum=1, aliases=("seq_len",))
    gpus: int = opt(8, "Total GPUs (all nodes).", minimum=1)
    gpu_memory: float = opt(80.0, "GiB per GPU.")
    global_batch_size: int = opt(65536, "Target global batch.", minimum=1)
    precision: str = opt("bf16", "Training precision.", choices=("bf16", "fp16", "fp32"))

    def __post_init__(self) -> None:
        check_fields(self)


def run_plan(cfg: PlanConfig) -> int:
    from bertforge.train.plan import plan_batch

    print(plan_batch(model=cfg.model, seq_len=cfg.max_seq_length, gpus=cfg.gpus,
                     gpu_memory_gib=cfg.gpu_memory, global_batch_size=cfg.global_batch_size,
                     precision=cfg.precision).summary())
    return 0


@dataclass
class DemoConfig:
    """``bertforge demo``."""

    workdir: str = opt("build/demo", "Where the demo writes its files.")
    steps: int = opt(300, "BERT pretraining steps.", minimum=1)
    bart_steps: int = opt(300, "BART denoising pretraining steps.", minimum=1)

    def __post_init__(self) -> None:
        check_fields(self)


def run_demo(cfg: DemoConfig) -> int:
    from bertforge.demo import run_demo as demo

    demo(Path(cfg.workdir), steps=cfg.steps, bart_steps=cfg.bart_steps)
    return 0


CONVERT = Command("convert", "Convert an NVIDIA DeepLearningExamples BERT checkpoint to Hugging "
                  "Face format.", ConvertConfig, run_convert,
                  saves=f"OUTPUT/{CONVERT_CONFIG_NAME}")
PLAN = Command("plan", "Propose micro-batch size and accumulation for a GPU setup.", PlanConfig,
               run_plan)
DEMO = Command("demo", "Run the end-to-end demo on the bundled sample corpus.", DemoConfig,
               run_demo)
