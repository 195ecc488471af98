"""The training commands: ``pretrain`` and ``finetune``, and their Python API
(``bertforge.finetune``/``pretrain``). Their configs are ``bertforge.config.PretrainConfig`` and
``FinetuneConfig`` (the runner saves the resolved one as ``output_dir/config.yaml``); ``--config``
also takes the names of the shipped recipes.

``finetune`` builds the configured task (``bertforge.tasks.registry.build_task``) and runs it on
the one runner; ``--seeds`` runs it once per seed; ``--benchmark`` times its training steps.
``pretrain`` runs the task the prepared data asks for (the registry maps the data's objective to
BERT's masked LM or BART's denoising). The runner and the tasks import torch: they are imported
inside the functions, so that ``bertforge --help`` does not pay for it."""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from bertforge.commands.base import Command
from bertforge.config import FinetuneConfig, PretrainConfig, save_config
from bertforge.core.arguments import checked
from bertforge.core.io import write_json_atomic
from bertforge.core.numbers import ascii_int
from bertforge.core.schema import opt
from bertforge.errors import ConfigError
from bertforge.tasks.registry import build_task, get_task, task_help, task_of_objective

if TYPE_CHECKING:
    from bertforge.train.distributed import DistInfo
    from bertforge.train.run import RunResult


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


def pretraining_task(cfg: PretrainConfig, info: DistInfo) -> Any:
    """BART denoising for data prepared with ``--objective denoise``, else BERT's MLM (+NSP);
    the data's manifest is read here, once for the run."""
    from bertforge.train.data import read_prepared

    prepared = read_prepared(cfg)
    spec = task_of_objective(prepared.objective)
    return spec.trainer.load()(cfg, info, spec, prepared)


@checked
def pretrain(cfg: PretrainConfig) -> RunResult:
    """Run pretraining as ``cfg`` says; see docs/pretraining.md and docs/bart.md."""
    from bertforge.train.run import distributed_run, run_task

    with distributed_run(cfg, "pretrain") as info:
        return run_task(pretraining_task(cfg, info), cfg, info)


def benchmark_pretraining(cfg: PretrainConfig) -> dict:
    """``bertforge pretrain --benchmark``: the benchmark.json report."""
    from bertforge.train.run import benchmark_task, distributed_run

    with distributed_run(cfg, "pretrain") as info:
        return benchmark_task(pretraining_task(cfg, info), cfg, info)


@checked
def finetune(cfg: FinetuneConfig) -> RunResult:
    """Fine-tune (or, without ``data.train``, only evaluate) as ``cfg`` says; docs/finetuning.md."""
    from bertforge.train.run import distributed_run, run_task

    with distributed_run(cfg, "finetune") as info:
        task = build_task(cfg, info)
        if task.train is None:
            return task.evaluate_only()
        return run_task(task, cfg, info)


def benchmark_finetuning(cfg: FinetuneConfig) -> dict:
    """``bertforge finetune --benchmark``: the benchmark.json report."""
    from bertforge.train.run import benchmark_task, distributed_run

    with distributed_run(cfg, "finetune") as info:
        task = build_task(cfg, info)
        if task.train is None:
            raise ConfigError("--benchmark times training steps: set data.train")
        return benchmark_task(task, cfg, info)


def finetune_seeds(cfg: FinetuneConfig, seeds: Sequence[int]) -> dict:
    """One run per seed (each in ``output_dir/seed-N``), then each run's metrics and the median
    of every numeric metric in ``output_dir/seeds.json`` (the task's primary metric first)."""
    from bertforge.tasks.finetuning import format_metrics

    root = Path(cfg.output_dir)
    runs: dict[str, dict] = {}
    for seed in seeds:
        one = dataclasses.replace(cfg, output_dir=str(root / f"seed-{seed}"),
                                  train=dataclasses.replace(cfg.train, seed=seed))
        result = finetune(one)
        if result.preempted:  # a stop request ends the command, not only this seed's run
            print(f"seeds: stopped during seed {seed} (its checkpoint is in {one.output_dir}); "
                  "no median is reported: run the same command to continue")
            return {"seeds": [int(s) for s in seeds], "runs": runs, "stopped_at_seed": int(seed)}
        runs[str(seed)] = dict(result.validation)
    names = [k for k in next(iter(runs.values()), {}) if all(  # undefined in a run: no median
        isinstance(r.get(k), (int, float)) and math.isfinite(r[k]) for r in runs.values())]
    primary = get_task(cfg.task).primary_metric
    names.sort(key=lambda k: k != primary)  # stable: the primary metric first, others in order
    median = {k: float(statistics.median(r[k] for r in runs.values())) for k in names}
    report = {"seeds": [int(s) for s in seeds], "primary_metric": primary, "runs": runs,
              "median": median}
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / "seeds.json", report, sort_keys=False)
    save_config(cfg, root / "config.yaml")
    print(f"seeds {', '.join(map(str, seeds))}: median {format_metrics(median)} "
          f"-> {root / 'seeds.json'}")
    return report


def run_pretrain(cfg: PretrainConfig, options: PretrainOptions) -> int:
    benchmark_pretraining(cfg) if options.benchmark else pretrain(cfg)
    return 0


def run_finetune(cfg: FinetuneConfig, options: FinetuneOptions) -> int:
    get_task(cfg.task, command="finetune")  # a wrong name: the closest one, before any work
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


__all__ = ["FINETUNE", "FinetuneOptions", "PRETRAIN", "PretrainOptions", "benchmark_finetuning",
           "benchmark_pretraining", "finetune", "finetune_seeds", "pretrain", "pretraining_task",
           "run_finetune", "run_pretrain", "seed_list"]
