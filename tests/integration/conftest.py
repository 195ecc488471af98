"""The reference runs of the distributed tests (test_ddp.py, test_fsdp.py), made once per
session: one process with accumulation, and two DDP ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from ranks import STEPS, run_args, torchrun

from bertforge.commands.train import pretrain


@pytest.fixture(scope="session")
def single(tiny, tiny_config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, accumulation 2 (the reference)."""
    out = tmp_path_factory.mktemp("single")
    cfg = tiny_config(out, f"--model={tiny.model_nodrop}", f"--train.max_steps={STEPS}",
                      "--checkpoint.every=2")
    assert pretrain(cfg).step == STEPS
    return out


@pytest.fixture(scope="session")
def ddp(tiny, tiny_args, child_env, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks, accumulation 1."""
    out = tmp_path_factory.mktemp("ddp")
    torchrun(run_args(tiny, tiny_args, out), child_env, out)
    return out
