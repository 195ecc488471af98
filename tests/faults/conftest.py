"""Fixtures of the fault-injection suite: a finished tiny run to damage, and helpers to damage it.

Each test copies the module-scoped run before breaking it, so one 6-step run (checkpoints at
steps 2, 4 and 6, all kept) serves every case.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from bertforge.commands.train import pretrain

STEPS = 6


@dataclass(frozen=True)
class Run:
    out: Path                          # output_dir with checkpoint-2, -4, -6 and metrics.jsonl
    args: Callable[..., list[str]]     # `bertforge pretrain` arguments for a run into a directory
    steps: int = STEPS
    extra: tuple[str, ...] = (f"--train.max_steps={STEPS}", "--checkpoint.every=2",
                              "--checkpoint.keep=0")  # the overrides that made it

    def ckpt(self, step: int, root: Path | None = None) -> Path:
        return (root or self.out) / f"checkpoint-{step}"


@pytest.fixture(scope="session")
def finished(tiny_args, tiny_config, tmp_path_factory: pytest.TempPathFactory) -> Run:
    out = tmp_path_factory.mktemp("finished")
    extra = Run.extra
    assert pretrain(tiny_config(out, *extra)).step == STEPS
    return Run(out=out, args=lambda target, *more: tiny_args(target, *extra, *more))


@pytest.fixture
def stopped_at_4(finished: Run, tmp_path: Path) -> Path:
    """A copy of the finished run as if it had stopped after step 4: checkpoints 2 and 4, and
    the metrics lines of steps 1-4 (the resume keeps them and appends 5 and 6)."""
    out = tmp_path / "run"
    shutil.copytree(finished.out, out)
    shutil.rmtree(finished.ckpt(STEPS, out))
    return out
