"""Two gloo DDP processes (torchrun, CPU) train like one process with 2 accumulation steps.

Global batch 8 both ways: one process runs micro-batches of 4 twice per step; two ranks run one
micro-batch of 4 each. The loader gives rank r the chunks one process would take on micro-step r,
so only the order of float additions differs (all-reduce vs accumulation): weights agree to
~1e-5 relative. The model has no dropout, whose masks would otherwise differ between layouts.
Checkpoints carry across world sizes in both directions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge.commands.train import pretrain
from ranks import STEPS, assert_lines_close, assert_weights_close, run_args, torchrun

def test_two_ranks_equal_one_process_with_accumulation(single: Path, ddp: Path,
                                                       run_metrics) -> None:
    for step in (2, STEPS):
        assert_weights_close(ddp / f"checkpoint-{step}", single / f"checkpoint-{step}")
    # Training moved the weights far more than the tolerance (the comparison means something).
    first, last = (load_file(single / f"checkpoint-{s}" / "model.safetensors") for s in (2, STEPS))
    assert max(float((first[k] - last[k]).abs().max()) for k in first) > 1e-3
    assert_lines_close(run_metrics(ddp), run_metrics(single))

    state = ddp / f"checkpoint-{STEPS}" / "training_state"
    assert json.loads((state / "meta.json").read_text())["world_size"] == 2
    reference = json.loads((single / f"checkpoint-{STEPS}" / "training_state" /
                            "data_rank0.json").read_text())
    for rank in (0, 1):  # every rank stands at the one global position of the single process
        assert json.loads((state / f"data_rank{rank}.json").read_text()) == reference
        assert (state / f"rng_rank{rank}.pt").is_file()
    val = [r for r in run_metrics(ddp) if "val_loss" in r]
    assert val and all(0 < r["val_loss"] < 20 for r in val)


def test_checkpoints_carry_across_world_sizes(tiny, tiny_args, tiny_config, single: Path,
                                              ddp: Path, child_env, run_metrics,
                                              tmp_path: Path) -> None:
    # 2 ranks -> 1 process: resume the DDP run's step-2 checkpoint alone.
    shrink = tmp_path / "shrink"
    cfg = tiny_config(shrink, f"--model={tiny.model_nodrop}", f"--train.max_steps={STEPS}",
                      f"--resume={ddp / 'checkpoint-2'}")
    assert pretrain(cfg).step == STEPS
    assert_weights_close(shrink / f"checkpoint-{STEPS}", single / f"checkpoint-{STEPS}")

    # 1 process -> 2 ranks: rank 1 has no saved state of its own and takes rank 0's position.
    grow = tmp_path / "grow"
    grow.mkdir()
    shutil.copytree(single / "checkpoint-2", grow / "checkpoint-2")
    torchrun(run_args(tiny, tiny_args, grow), child_env, grow)
    assert_weights_close(grow / f"checkpoint-{STEPS}", single / f"checkpoint-{STEPS}")
    assert_lines_close(run_metrics(grow), [r for r in run_metrics(single) if r["step"] > 2])


@pytest.mark.slow
def test_compiled_layers_under_ddp_train_like_one_eager_process(tiny, tiny_args, single: Path,
                                                                 child_env, run_metrics,
                                                                 tmp_path: Path) -> None:
    """train.compile=true (regional, inductor) with DDP and the unpadded encoder: the same
    weights as the eager single process, within a compiled kernel's rounding."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("inductor needs a C++ compiler on the CPU")
    torchrun(run_args(tiny, tiny_args, tmp_path, "--train.compile=true"), child_env, tmp_path)
    wa = load_file(tmp_path / f"checkpoint-{STEPS}" / "model.safetensors")
    wb = load_file(single / f"checkpoint-{STEPS}" / "model.safetensors")
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-4, atol=1e-5, msg=name)
    got = [r for r in run_metrics(tmp_path) if "loss" in r]
    want = [r for r in run_metrics(single) if "loss" in r]
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-4)
