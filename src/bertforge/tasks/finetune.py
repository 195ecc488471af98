"""``bertforge finetune``: build the configured task from the task registry and run it on the
one runner; ``--seeds`` runs it once per seed; ``--benchmark`` times its training steps.

The task classes (``tasks/squad.py``, ``classify.py``, ...) share ``bertforge.tasks.finetuning``;
``bertforge.tasks.registry`` says which class a task name means.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Sequence

from bertforge.core.arguments import checked
from bertforge.config import FinetuneConfig, save_config
from bertforge.core.io import write_json_atomic
from bertforge.errors import ConfigError
from bertforge.models.loading import open_model
from bertforge.tasks.finetuning import FinetuneTask, format_metrics
from bertforge.tasks.registry import check_model_fits_task, get_task
from bertforge.train.distributed import DistInfo
from bertforge.train.run import RunResult, benchmark_task, distributed_run, run_task


def build_task(cfg: FinetuneConfig, info: DistInfo, labelled: bool = True) -> FinetuneTask:
    """The task object for ``cfg.task`` (``labelled=False``: predict, do not score). The model's
    config.json is read here, once, and handed to the task."""
    spec = get_task(cfg.task, command="finetune")
    if not cfg.model:
        raise ConfigError("model is not set: give --model=DIR (a Hugging Face BERT or BART "
                          "directory, or a bertforge checkpoint)")
    source = open_model(cfg.model)  # a preset or config.json is refused by the task
    check_model_fits_task(spec, source.family, str(cfg.model), given=cfg.task)
    return spec.trainer.load()(cfg, info, spec, source, labelled)


@checked
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
    of every numeric metric in ``output_dir/seeds.json`` (the task's primary metric first)."""
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


__all__ = ["benchmark_finetuning", "build_task", "finetune", "finetune_seeds"]
