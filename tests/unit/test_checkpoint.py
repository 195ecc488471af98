"""Checkpoint manager (atomicity, pruning, latest), resume resolution, training state, RNG."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bertforge.errors import CheckpointError, ConfigError
from bertforge.optim import Lamb, build_scheduler, param_groups
from bertforge.train.checkpoint import (
    COMPLETE,
    CheckpointManager,
    CheckpointWriteError,
    capture_rng_state,
    gather_to_rank0,
    load_training_state,
    restore_rng_state,
    save_training_state,
)
from bertforge.train.guards import resolve_resume


def write_dummy(step: int):
    """A checkpoint with placeholder files where a resume needs them (the manager and resume
    resolution only check presence and checksums; they never unpickle)."""
    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps({"step": step}))
        (tmp / "training_state").mkdir()
        files = ["optimizer.pt", "config.json"]
        for name in files:
            (tmp / "training_state" / name).write_bytes(b"placeholder")
        (tmp / "training_state" / "meta.json").write_text(json.dumps({"step": step,
                                                                      "files": files}))
    return write


def names(output_dir: Path) -> list[str]:
    return sorted(p.name for p in output_dir.iterdir())


def test_crash_in_write_fn_publishes_nothing(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3)
    first = mgr.save(10, write_dummy(10))
    assert first == tmp_path / "checkpoint-10" and (first / COMPLETE).is_file()

    def crashing(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"half a model")
        raise OSError("disk full")

    with pytest.raises(CheckpointWriteError, match="disk full writing checkpoint-20 .*checkpoint-10 "
                                                   "is intact"):
        mgr.save(20, crashing)
    assert names(tmp_path) == ["checkpoint-10"]          # no checkpoint-20, no .tmp leftovers
    assert mgr.latest() == first


def test_leftovers_of_a_killed_process_are_ignored_then_cleaned(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=0)
    mgr.save(10, write_dummy(10))
    killed = tmp_path / ".tmp-checkpoint-30-deadbeef"     # killed mid-write
    (killed / "training_state").mkdir(parents=True)
    (killed / "training_state" / "meta.json").write_text(json.dumps({"step": 30}))
    no_marker = tmp_path / "checkpoint-40"                # a directory without COMPLETE
    no_marker.mkdir()
    assert mgr.latest() == tmp_path / "checkpoint-10"
    assert resolve_resume("auto", tmp_path) == tmp_path / "checkpoint-10"
    assert killed.exists()                                # readers never delete
    mgr.save(50, write_dummy(50))
    assert not killed.exists()
    assert mgr.latest() == tmp_path / "checkpoint-50"
    assert [s for s, _ in mgr.checkpoints()] == [10, 50]


def test_keep_prunes_oldest_and_latest_sorts_numerically(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (998, 999, 1000, 1001):
        mgr.save(step, write_dummy(step))
    assert names(tmp_path) == ["checkpoint-1000", "checkpoint-1001"]
    mgr.keep = 3
    mgr.save(9999, write_dummy(9999))
    assert mgr.latest() == tmp_path / "checkpoint-9999"  # not "checkpoint-1001" (string order)
    # The checkpoint just written survives even when older runs left higher steps behind.
    mgr.keep = 2
    mgr.save(5, write_dummy(5))
    assert names(tmp_path) == ["checkpoint-5", "checkpoint-9999"]


def test_keep_zero_keeps_all_and_resave_replaces(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=0)
    for step in (1, 2, 3):
        mgr.save(step, write_dummy(step))
    mgr.save(3, write_dummy(333))
    assert names(tmp_path) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert json.loads((tmp_path / "checkpoint-3" / "config.json").read_text()) == {"step": 333}


def test_step_comes_from_meta_json_before_the_name(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=0)
    mgr.save(7, write_dummy(7))
    mgr.save(8, write_dummy(8))
    (tmp_path / "checkpoint-7" / "training_state" / "meta.json").write_text('{"step": 70}')
    assert mgr.latest() == tmp_path / "checkpoint-7"


def test_resolve_resume(tmp_path):
    run = tmp_path / "run"
    assert resolve_resume("none", run) is None
    assert resolve_resume("auto", run) is None            # fresh start
    mgr = CheckpointManager(run, keep=0)
    ckpt = mgr.save(100, write_dummy(100))
    assert resolve_resume("auto", run) == ckpt
    assert resolve_resume(str(ckpt), tmp_path / "elsewhere") == ckpt

    with pytest.raises(CheckpointError, match=r"resume: .*nope does not exist; pass a checkpoint"):
        resolve_resume(str(tmp_path / "nope"), run)
    (tmp_path / "file.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        resolve_resume(str(tmp_path / "file.pt"), run)
    with pytest.raises(CheckpointError, match=r"is a run directory, not a checkpoint; pass its "
                                              r"newest checkpoint .*checkpoint-100"):
        resolve_resume(str(run), run)
    half = run / "checkpoint-200"
    (half / "training_state").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"checkpoint-200 is not a complete checkpoint: it "
                                              r"has no COMPLETE marker.*newest complete one next "
                                              r"to it is .*checkpoint-100"):
        resolve_resume(str(half), run)
    model_dir = tmp_path / "hf-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"model directory without training state; .*init_from="):
        resolve_resume(str(model_dir), run)
    with pytest.raises(ConfigError, match="resume is empty"):
        resolve_resume("  ", run)


def tiny_setup(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 1))
    opt = Lamb(param_groups(model, 0.01), lr=0.05)
    sched = build_scheduler(opt, "poly", total_steps=10, warmup=0.3)
    return model, opt, sched


def train(model, opt, sched, steps: int) -> None:
    for _ in range(steps):
        # Data drawn from all three global generators, so resuming must restore each of them.
        x = torch.randn(4, 6) + float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)


def test_resume_from_checkpoint_equals_uninterrupted_training(tmp_path):
    random.seed(1)
    np.random.seed(1)
    model, opt, sched = tiny_setup()
    train(model, opt, sched, 10)
    expected = {k: v.clone() for k, v in model.state_dict().items()}

    random.seed(1)
    np.random.seed(1)
    model, opt, sched = tiny_setup()
    train(model, opt, sched, 4)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    def write(tmp: Path) -> None:
        save_file(model.state_dict(), str(tmp / "model.safetensors"))
        save_training_state(tmp, optimizer=opt, scheduler=sched, scaler=scaler, step=4, phase=1,
                            data_state={0: {"shard": 3, "offset": 17}},
                            rng_states={0: capture_rng_state()}, config={"optim": {"lr": 0.05}})

    CheckpointManager(tmp_path, keep=1).save(4, write)
    random.seed(999)                                       # as in a new process: other RNG
    np.random.seed(999)                                    # states and other initial weights
    model, opt, sched = tiny_setup(seed=5)

    ckpt = resolve_resume("auto", tmp_path)
    state = load_training_state(ckpt)
    model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    opt.load_state_dict(state.optimizer)
    sched.load_state_dict(state.scheduler)
    restore_rng_state(state.rng_states[0])
    assert (state.step, state.phase, state.data_state) == (4, 1, {0: {"shard": 3, "offset": 17}})
    assert state.scaler["scale"] == 1024.0 and state.config == {"optim": {"lr": 0.05}}
    assert sorted(p.name for p in (ckpt / "training_state").iterdir()) == [
        "config.json", "data_rank0.json", "meta.json", "optimizer.pt", "rng_rank0.pt",
        "scaler.pt", "scheduler.pt"]
    assert state.meta["world_size"] == 1 and state.meta["versions"]["torch"] == torch.__version__

    train(model, opt, sched, 6)
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_damaged_or_missing_training_state_raises(tmp_path):
    model, opt, sched = tiny_setup()
    save_training_state(tmp_path, optimizer=opt, scheduler=sched, scaler=None, step=1, phase=1,
                        data_state={}, rng_states={0: capture_rng_state()}, config={})
    assert not (tmp_path / "training_state" / "scaler.pt").exists()
    assert load_training_state(tmp_path).scaler is None
    (tmp_path / "training_state" / "optimizer.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: cannot be read .*damaged"):
        load_training_state(tmp_path)
    with pytest.raises(CheckpointError, match=r"no training_state/meta.json.*init_from"):
        load_training_state(tmp_path / "missing")
    with pytest.raises(TypeError, match=r"data_state must map rank \(int\) -> state"):
        save_training_state(tmp_path, optimizer=opt, scheduler=None, scaler=None, step=1, phase=1,
                            data_state={"shard": 1}, rng_states={}, config={})


def test_rng_capture_restore_reproduces_draws(tmp_path):
    state = capture_rng_state()
    first = (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3))
    torch.save(state, tmp_path / "rng.pt")
    random.random(), np.random.rand(5), torch.rand(7)      # move every generator on
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), source="rng.pt")
    again = (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3))
    assert first[:3] == again[:3] and torch.equal(first[3], again[3])
    with pytest.raises(CheckpointError, match=r"rng_rank0.pt: RNG state lacks numpy, torch"):
        restore_rng_state({"python": random.getstate()}, source="rng_rank0.pt")


def test_gather_without_distributed_is_rank_zero_only():
    assert gather_to_rank0({"a": 1}) == {0: {"a": 1}}
