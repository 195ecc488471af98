"""The training commands: ``pretrain`` and ``finetune``. Their configs are
``bertforge.config.PretrainConfig`` and ``FinetuneConfig`` (the runner saves the resolved one as
``output_dir/config.yaml``); ``--config`` also takes the names of the shipped recipes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List, Optional

from bertforge.commands.base import Command
from bertforge.config import FinetuneConfig, PretrainConfig
from bertforge.core.numbers import ascii_int
from bertforge.core.schema import opt
from bertforge.tasks.registry import get_task, task_help


def seed_list(text: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3] (the ``--seeds`` flag)."""
    parsed = [ascii_int(s, negative=True) for s in text.split(",") if s.strip()]
    if None in parsed:
        raise argparse.ArgumentTypeError("expected comma-separated whole numbers written with "
                                         f"the digits 0-9, got {text}")
    seeds = [s for s in parsed if s is not None]
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"expected seeds >= 0, got {text}")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:  # two runs into one seed-N folder, and a median that counts one run twice
        raise argparse.ArgumentTypeError(f"seed {repeated[0]} is given twice in {text}; give "
                                         "each seed once")
    return seeds


@dataclass
class PretrainOptions:
    """How ``bertforge pretrain`` runs (not part of the run's config)."""

    benchmark: bool = opt(False, "Warm up, time benchmark.steps steps, report sequences/s, MFU "
                          "and memory; no checkpoints.")


@dataclass
class FinetuneOptions:
    """How ``bertforge finetune`` runs (not part of the run's config)."""

    seeds: Optional[List[int]] = opt(None, "Run once per seed (output_dir/seed-N) and report "
                                     "each and the median.", parse=seed_list,
                                     metavar="S1,S2,...")
    benchmark: bool = opt(False, "Time benchmark.steps training steps; report sequences/s and "
                          "MFU.")


def run_pretrain(cfg: PretrainConfig, options: PretrainOptions) -> int:
    from bertforge.tasks.pretrain import benchmark_pretraining, pretrain

    benchmark_pretraining(cfg) if options.benchmark else pretrain(cfg)
    return 0


def run_finetune(cfg: FinetuneConfig, options: FinetuneOptions) -> int:
    get_task(cfg.task, command="finetune")  # a wrong name: the closest one, before any work
    from bertforge.tasks.finetune import benchmark_finetuning, finetune, finetune_seeds

    if options.benchmark:
        benchmark_finetuning(cfg)
    elif options.seeds:
        finetune_seeds(cfg, options.seeds)
    else:
        finetune(cfg)
    return 0


def finetune_key_help() -> dict[str, str]:
    """``--task``'s help: the tasks finetune trains, from their records."""
    tasks = task_help("finetune").replace("\n", "\n  ")
    return {"task": f"A task's name or one of its aliases:\n  {tasks}"}


PRETRAIN = Command("pretrain", "Pretrain BERT (MLM + NSP) or BART (denoising) on prepared data.",
                   PretrainConfig, run_pretrain, options=PretrainOptions, flat=False,
                   recipes=("pretrain", "debug"), saves="output_dir/config.yaml")
FINETUNE = Command("finetune", "Fine-tune and evaluate on SQuAD, GLUE, your own classification "
                   "data, SWAG, token classification or summarization (BART).", FinetuneConfig,
                   run_finetune, options=FinetuneOptions, flat=False, recipes=("finetune",),
                   saves="output_dir/config.yaml", key_help=finetune_key_help)
