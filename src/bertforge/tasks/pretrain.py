"""``bertforge pretrain``: the task the prepared data asks for (the task registry maps the data's
objective to BERT's masked LM or BART's denoising), run on the one runner; ``--benchmark`` times
its training steps. The tasks themselves are ``tasks/mlm.py`` and ``tasks/denoise.py``."""

from __future__ import annotations

from typing import Any

from bertforge.core.arguments import checked
from bertforge.config import PretrainConfig
from bertforge.tasks.mlm import PretrainTask, pretraining_loss
from bertforge.tasks.registry import task_of_objective
from bertforge.train.data import read_prepared
from bertforge.train.distributed import DistInfo
from bertforge.train.run import RunResult, benchmark_task, distributed_run, run_task


def pretraining_task(cfg: PretrainConfig, info: DistInfo) -> Any:
    """BART denoising for data prepared with ``--objective denoise``, else BERT's MLM (+NSP);
    the data's manifest is read here, once for the run."""
    prepared = read_prepared(cfg)
    spec = task_of_objective(prepared.objective)
    return spec.trainer.load()(cfg, info, spec, prepared)


@checked
def pretrain(cfg: PretrainConfig) -> RunResult:
    """Run pretraining as ``cfg`` says; see docs/pretraining.md and docs/bart.md."""
    with distributed_run(cfg, "pretrain") as info:
        return run_task(pretraining_task(cfg, info), cfg, info)


def benchmark_pretraining(cfg: PretrainConfig) -> dict:
    """``bertforge pretrain --benchmark``: the benchmark.json report."""
    with distributed_run(cfg, "pretrain") as info:
        return benchmark_task(pretraining_task(cfg, info), cfg, info)


__all__ = ["PretrainTask", "benchmark_pretraining", "pretrain", "pretraining_loss",
           "pretraining_task"]
