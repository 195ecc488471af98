"""Non-finite values never reach a checkpoint, and a run that stops learning stops with an error.

Absurd optimizer settings are refused before anything runs. NaN gradients are injected into the
real loss (every micro-batch from some step on), and a NaN is written into the weights right
after a real optimizer step, to drive the loop's guards: a streak of skipped steps ends the run
with exit 1, keeping the last good checkpoint; a run where every step was skipped never reports
success; weights or optimizer state that are not finite are never saved.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import bertforge.tasks.mlm as pretrain_module
from bertforge.cli import main
from bertforge.optim import Lamb
from bertforge.train.guards import verify_checkpoint


@pytest.mark.parametrize("key, value", [
    ("lr", "inf"), ("lr", "1e400"), ("lr", "1e30"), ("lr", "1e39"), ("lr", "nan"), ("lr", "0"),
    ("eps", "inf"), ("weight_decay", "nan"), ("max_grad_norm", "inf"), ("warmup", "nan"),
    ("power", "inf"), ("betas", "[0.9,nan]"),
])
def test_absurd_optimizer_settings_are_refused_before_anything_runs(
        key: str, value: str, tiny_args, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["pretrain", *tiny_args(out, f"--optim.{key}={value}")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: optim.{key}") and "must be a finite number" in err
    assert not out.exists()


def poison_gradients(monkeypatch: pytest.MonkeyPatch, micro_batches: range) -> None:
    """Multiply the training loss by NaN on the given (0-based) training micro-batches."""
    real = pretrain_module.pretraining_loss
    seen = iter(range(10**6))

    def poisoned(model, batch):
        out = real(model, batch)
        if model.training and next(seen) in micro_batches:
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(pretrain_module, "pretraining_loss", poisoned)


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".tmp")))


def test_a_streak_of_skipped_steps_stops_the_run_keeping_the_last_checkpoint(
        tiny_args, tmp_path: Path, monkeypatch, capsys) -> None:
    poison_gradients(monkeypatch, range(4, 10**6))  # 2 micro-batches a step: steps 3, 4, ... fail
    out = tmp_path / "run"
    code = main(["pretrain", *tiny_args(out, "--train.max_steps=20", "--checkpoint.every=2",
                                        "--train.max_skipped_steps=3")])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert code == 1, captured.err
    assert err.startswith("error: training diverged at step 5: 3 consecutive steps had "
                          "non-finite gradients")
    assert err.endswith(f"The newest checkpoint, {out / 'checkpoint-4'}, is intact")
    assert "pretraining finished" not in captured.out
    # Step 4 was skipped, so checkpoint-4 holds step 2's (finite) weights; nothing after it.
    assert checkpoints(out) == ["checkpoint-2", "checkpoint-4"]
    verify_checkpoint(out / "checkpoint-4")
    assert ((out / "checkpoint-4" / "model.safetensors").read_bytes()
            == (out / "checkpoint-2" / "model.safetensors").read_bytes())


def test_a_run_that_skipped_every_step_never_reports_success(tiny_args, tmp_path: Path,
                                                             monkeypatch, capsys) -> None:
    poison_gradients(monkeypatch, range(0, 10**6))
    out = tmp_path / "run"
    code = main(["pretrain", *tiny_args(out, "--train.max_steps=4")])  # fewer than the limit
    captured = capsys.readouterr()
    assert code == 1 and "pretraining finished" not in captured.out
    assert "training diverged at step 4: all 4 steps of this run had non-finite gradients" \
        in captured.err
    assert checkpoints(out) == []


def test_a_few_skipped_steps_are_tolerated(tiny_args, tmp_path: Path, monkeypatch,
                                           capsys) -> None:
    # What fp16 loss-scale backoff does at the start of a run: a couple of skips, then learning.
    poison_gradients(monkeypatch, range(0, 4))
    code = main(["pretrain", *tiny_args(tmp_path / "run", "--train.max_skipped_steps=3")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "pretraining finished" in captured.out
    assert "skipped      2 steps with non-finite gradients" in captured.out


def test_nonfinite_weights_are_never_saved(tiny_args, tmp_path: Path, monkeypatch,
                                           capsys) -> None:
    real_step = Lamb.step
    calls = iter(range(10**6))

    def step_then_corrupt(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        if next(calls) == 2:  # after the third update: a weight goes bad (e.g. an overflow)
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[:5] = float("inf")
        return result

    monkeypatch.setattr(Lamb, "step", step_then_corrupt)
    out = tmp_path / "run"
    code = main(["pretrain", *tiny_args(out, "--checkpoint.every=2")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1
    assert err.startswith("error: at step 4 the weights or optimizer state hold ")
    assert "non-finite values" in err and "refusing to save them" in err
    assert err.endswith(f"The newest checkpoint, {out / 'checkpoint-2'}, is intact")
    assert checkpoints(out) == ["checkpoint-2"]
