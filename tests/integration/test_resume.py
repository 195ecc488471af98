"""A stopped and resumed run is the run that never stopped: bitwise weights, identical metrics
(losses, learning rates, validation), the same micro-batches with the same masks.

Stops come from the real preemption path: in-process, the loop's preemption flag is replaced by
one that fires after a chosen step (the ``stop_after`` fixture); in a child process, a real
SIGTERM.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import bertforge.train.loop as loop
import bertforge.tasks.mlm as pretrain_module
from bertforge.errors import CheckpointError, ConfigError
from bertforge.optim import schedule_lr
from bertforge.train.checkpoint import load_training_state
from bertforge.train.data import open_pretrain_data
from bertforge.train.distributed import DistInfo
from bertforge.commands.train import pretrain

ONE_PROCESS = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))

STEPS = 6       # 2k steps straight; the stopped run halts after k = 3
LR, WARMUP = 1e-2, 0.05  # the debug recipe's optimizer settings


def digest(batch: dict) -> str:
    """Identity of a micro-batch: tokens, masks, segment ids and labels."""
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode())
        h.update(batch[key].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.fixture
def train_batches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Digests of every micro-batch the training loss sees (validation batches are skipped)."""
    seen: list[str] = []
    real = pretrain_module.pretraining_loss

    def recording(model, batch):
        if model.training:
            seen.append(digest(batch))
        return real(model, batch)

    monkeypatch.setattr(pretrain_module, "pretraining_loss", recording)
    return seen


def weights_bytes(checkpoint: Path) -> bytes:
    return (checkpoint / "model.safetensors").read_bytes()


def optimizer_state(checkpoint: Path) -> list[torch.Tensor]:
    state = torch.load(checkpoint / "training_state" / "optimizer.pt", weights_only=True)
    return [v for s in state["state"].values() for v in s.values() if torch.is_tensor(v)]


@pytest.mark.parametrize("workers, optimizer", [(0, "lamb"), (2, "lamb"), (0, "muon")])
def test_stop_and_resume_equals_uninterrupted(workers: int, optimizer: str, tmp_path: Path,
                                              tiny_config, run_metrics, train_batches: list[str],
                                              stop_after, monkeypatch: pytest.MonkeyPatch) -> None:
    extra = (f"--data.num_workers={workers}", "--train.eval_every=2", f"--optim.name={optimizer}")
    straight = pretrain(tiny_config(tmp_path / "straight", *extra))
    straight_batches = list(train_batches)
    train_batches.clear()

    resumed_dir = tmp_path / "resumed"
    with monkeypatch.context() as m:
        m.setattr(loop, "PreemptionFlag", stop_after(3))
        first = pretrain(tiny_config(resumed_dir, *extra))
    assert first.preempted and first.step == 3
    assert first.final_checkpoint == resumed_dir / "checkpoint-3"
    assert not first.validation  # no end-of-run validation when stopped
    second = pretrain(tiny_config(resumed_dir, *extra))  # resume=auto (the recipe's default)
    assert not second.preempted and second.step == STEPS

    a, b = straight.final_checkpoint, second.final_checkpoint
    assert a.name == b.name == f"checkpoint-{STEPS}"
    assert weights_bytes(a) == weights_bytes(b)
    for x, y in zip(optimizer_state(a), optimizer_state(b), strict=True):
        assert torch.equal(x, y)
    saved = torch.load(b / "training_state" / "optimizer.pt", weights_only=True)["state"]
    assert any("momentum_buffer" in s for s in saved.values()) == (optimizer == "muon")

    # The same micro-batches (order and masks) and a data stream that really moved on: the
    # second epoch (steps 4-6) is not a replay of the first.
    assert len(straight_batches) == STEPS * 2  # 2 accumulation micro-steps per step
    assert train_batches == straight_batches
    assert straight_batches[6:] != straight_batches[:6]

    lines = run_metrics(straight.output_dir)
    assert run_metrics(resumed_dir) == lines
    train_lines = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train_lines] == list(range(1, STEPS + 1))
    assert [r["step"] for r in lines if "val_loss" in r] == [2, 4, 6]
    for r in train_lines:  # the rate each step ran with, across the resume
        assert r["lr"] == pytest.approx(schedule_lr(LR, r["step"], STEPS, WARMUP), rel=1e-12)
    assert second.validation == {k: v for k, v in lines[-1].items() if k != "step"}


def test_resume_from_a_checkpoint_path_into_a_new_directory(tmp_path: Path, tiny_config,
                                                            run_metrics) -> None:
    first = pretrain(tiny_config(tmp_path / "a", "--checkpoint.every=3"))
    ckpt = tmp_path / "a" / "checkpoint-3"
    meta = json.loads((ckpt / "training_state" / "meta.json").read_text())
    assert meta["step"] == 3 and (ckpt / "COMPLETE").is_file()
    assert (ckpt / "training_state" / "data_rank0.json").is_file()

    second = pretrain(tiny_config(tmp_path / "b", f"--resume={ckpt}"))
    assert second.step == STEPS
    assert weights_bytes(second.final_checkpoint) == weights_bytes(first.final_checkpoint)
    assert run_metrics(tmp_path / "b") == [r for r in run_metrics(tmp_path / "a") if r["step"] > 3]


def test_resume_refuses_run_defining_changes(tmp_path: Path, tiny_config) -> None:
    pretrain(tiny_config(tmp_path, "--train.max_steps=2"))
    # A restored schedule for 2 steps would run steps 3..4 at lr 0: refused, naming each key.
    with pytest.raises(ConfigError, match=r"train.max_steps: 2 in the checkpoint, 4 now.*"
                                          r"init_from="):
        pretrain(tiny_config(tmp_path, "--train.max_steps=4"))
    with pytest.raises(ConfigError, match=r"train.global_batch_size: 8 in the checkpoint, 16 now; "
                                          r"train.max_steps: 2 in the checkpoint, 4 now"):
        pretrain(tiny_config(tmp_path, "--train.max_steps=4", "--train.global_batch_size=16"))
    with pytest.raises(ConfigError, match=r"optim.lr: 0.01 in the checkpoint, 0.02 now"):
        pretrain(tiny_config(tmp_path, "--train.max_steps=2", "--optim.lr=0.02"))


def test_loader_refuses_a_foreign_global_batch(tmp_path: Path, tiny_config) -> None:
    """The loader's own guard, for callers that restore its state without the config check."""
    first = pretrain(tiny_config(tmp_path / "a", "--train.max_steps=2"))
    state = load_training_state(first.final_checkpoint)
    loader = open_pretrain_data(
        tiny_config(tmp_path / "b", "--train.global_batch_size=16"), ONE_PROCESS).train
    with pytest.raises(CheckpointError, match=r"global_batch_size=8, but this run uses 16.*keep "
                                              r"the global batch size"):
        loader.load_state_dict(state.data_state[0])


def test_fresh_run_refuses_a_directory_with_newer_checkpoints(tmp_path: Path, tiny_config) -> None:
    pretrain(tiny_config(tmp_path, "--train.max_steps=4", "--checkpoint.every=2"))
    with pytest.raises(ConfigError, match=r"already holds checkpoint-4, ahead of this run's start "
                                          r"\(step 0\).*new output_dir"):
        pretrain(tiny_config(tmp_path, "--train.max_steps=4", "--resume=none"))


def test_metrics_after_the_checkpoint_are_rewritten_on_resume(tmp_path: Path, tiny_config,
                                                              run_metrics) -> None:
    pretrain(tiny_config(tmp_path, "--train.max_steps=4", "--checkpoint.every=2",
                         "--train.log_every=1", "--train.eval_batches=0"))
    reference = run_metrics(tmp_path)
    # Simulate a crash after step 4's metrics but before its checkpoint: drop checkpoint-4.
    shutil.rmtree(tmp_path / "checkpoint-4")
    pretrain(tiny_config(tmp_path, "--train.max_steps=4", "--checkpoint.every=2",
                         "--train.log_every=1", "--train.eval_batches=0"))
    assert [r["step"] for r in run_metrics(tmp_path)] == [1, 2, 3, 4]
    assert run_metrics(tmp_path) == reference


def wait_for_first_metrics(proc: subprocess.Popen, metrics: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (metrics.is_file() and metrics.stat().st_size > 0):
        if proc.poll() is not None:
            pytest.fail(f"pretrain exited with {proc.returncode} before its first metrics line")
        if time.monotonic() > deadline:
            pytest.fail(f"no metrics line within {timeout} s")
        time.sleep(0.002)


def test_sigterm_checkpoints_exits_zero_and_resumes_bitwise(tmp_path: Path, tiny_args, tiny_config,
                                                            run_metrics, child_env) -> None:
    steps = 80  # long enough that SIGTERM, sent at the first metrics line, lands mid-run
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bertforge.cli", "pretrain",
           *tiny_args(out, f"--train.max_steps={steps}")]
    with open(tmp_path / "stdout", "w") as so, open(tmp_path / "stderr", "w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=child_env, cwd=tmp_path)
        try:
            wait_for_first_metrics(proc, out / "metrics.jsonl", timeout=120)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert rc == 0, stderr
    assert "stopped for preemption" in stdout and "Traceback" not in stderr

    stopped_at = run_metrics(out)[-1]["step"]
    assert 1 <= stopped_at < steps
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".tmp"))) \
        == [f"checkpoint-{stopped_at}"]
    ckpt = out / f"checkpoint-{stopped_at}"
    assert (ckpt / "COMPLETE").is_file() and (ckpt / "model.safetensors").is_file()
    assert json.loads((ckpt / "training_state" / "meta.json").read_text())["step"] == stopped_at

    resumed = pretrain(tiny_config(out, f"--train.max_steps={steps}"))
    straight = pretrain(tiny_config(tmp_path / "straight", f"--train.max_steps={steps}"))
    assert resumed.step == straight.step == steps
    assert weights_bytes(resumed.final_checkpoint) == weights_bytes(straight.final_checkpoint)
    assert run_metrics(out) == run_metrics(tmp_path / "straight")


def test_a_checkpoint_without_a_newer_key_resumes_as_its_default(tiny_config, tmp_path) -> None:
    """A key added to the config after a checkpoint was written (optim.decay, ...) meant its
    default then; only a value set otherwise now is a change."""
    from bertforge.core.schema import to_dict
    from bertforge.train.run import check_resume_compatible

    cfg = tiny_config(tmp_path)
    saved = to_dict(cfg)
    del saved["optim"]["decay"], saved["optim"]["min_lr_ratio"]  # an older bertforge's config
    check_resume_compatible(saved, cfg, tmp_path, "init_from")
    with pytest.raises(ConfigError, match=r"optim.min_lr_ratio: 0.0 in the checkpoint, 0.1 now"):
        check_resume_compatible(saved, tiny_config(tmp_path, "--optim.min_lr_ratio=0.1"),
                                tmp_path, "init_from")


def test_a_fine_tuning_checkpoint_from_before_schedule_counting_is_not_resumed_silently(
        tmp_path) -> None:
    """Fine-tuning now counts schedule steps as transformers' Trainer; a checkpoint written
    before that key existed ran NVIDIA's counting, so resuming it is refused by name."""
    from bertforge.config import FinetuneConfig, load_config
    from bertforge.core.schema import to_dict
    from bertforge.train.run import check_resume_compatible

    cfg = load_config(FinetuneConfig, None, ["--model=m"])
    saved = to_dict(cfg)
    del saved["optim"]["schedule_counting"]
    with pytest.raises(ConfigError, match=r"optim.schedule_counting: 'nvidia' in the checkpoint, "
                                          r"'transformers' now"):
        check_resume_compatible(saved, cfg, tmp_path, "model")
    check_resume_compatible(saved, load_config(FinetuneConfig, None, [
        "--model=m", "--optim.schedule_counting=nvidia"]), tmp_path, "model")
