"""The GPU pretraining step, emulated on CPUs: bf16 autocast, compiled layers, unpadded and packed
batches, FSDP2 with bf16 all-gathers on two gloo ranks, stopped and resumed. Nothing here needs
a GPU, and all of it is what a GPU run combines, so a mistake in how the parts fit shows here
first.

Judged by an error budget, as low-precision results should be: at every step, the emulated run's
loss, MLM loss and gradient norm may differ from the eager fp32 one-process run (the session's
reference, ``single``) by at most 4x the largest difference plain bf16 autocast in one eager
process shows (the error bf16 itself brings), plus 1e-4 relative. The resumed run equals the
uninterrupted one exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ranks import STEPS, run_args, torchrun

from bertforge.commands.train import pretrain

pytestmark = pytest.mark.slow
GPU_STEP = ("--train.fsdp=true", "--precision=bf16", "--train.compile=true",
            "--train.unpad=true", "--data.pack_sequences=true")


def series(lines: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in lines if key in r}


@pytest.fixture(scope="module")
def bf16_eager(tiny, tiny_config, tmp_path_factory) -> Path:
    """One eager process in bf16 autocast: the error bf16 alone brings."""
    out = tmp_path_factory.mktemp("bf16-eager")
    cfg = tiny_config(out, f"--model={tiny.model_nodrop}", f"--train.max_steps={STEPS}",
                      "--checkpoint.every=2", "--precision=bf16")
    assert pretrain(cfg).step == STEPS
    return out


@pytest.fixture(scope="module")
def emulated(tiny, tiny_args, child_env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-step")
    torchrun(run_args(tiny, tiny_args, out, *GPU_STEP), child_env, out)
    return out


@pytest.mark.parametrize("key", ["loss", "mlm_loss", "grad_norm"])
def test_gpu_step_matches_fp32_within_the_bf16_budget(single: Path, bf16_eager: Path,
                                                      emulated: Path, run_metrics, key) -> None:
    fp32, plain, ours = (series(run_metrics(d), key) for d in (single, bf16_eager, emulated))
    assert sorted(ours) == sorted(fp32) == list(range(1, STEPS + 1))
    bf16_error = max(abs(plain[s] - fp32[s]) for s in fp32)
    assert bf16_error > 0  # bf16 did lose precision: the budget means something
    for step, want in fp32.items():
        budget = 4 * bf16_error + 1e-4 * abs(want)
        assert abs(ours[step] - want) <= budget, (step, ours[step], want, budget)


def test_gpu_step_resumes_exactly(tiny, tiny_args, child_env, emulated: Path, run_metrics,
                                  tmp_path: Path) -> None:
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(emulated / "checkpoint-2", resumed / "checkpoint-2")
    torchrun(run_args(tiny, tiny_args, resumed, *GPU_STEP), child_env, resumed)
    final = f"checkpoint-{STEPS}"
    assert ((resumed / final / "model.safetensors").read_bytes()
            == (emulated / final / "model.safetensors").read_bytes())
    assert run_metrics(resumed) == [r for r in run_metrics(emulated) if r["step"] > 2]
