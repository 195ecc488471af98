"""Damaged checkpoints are found before they are used, never loaded silently.

Each case damages a copy of a real run's checkpoint the way a bad disk, an interrupted copy or a
hostile user would: bytes flipped inside tensor data, a file deleted, NaN written into weights or
optimizer state (with the checksums forged to match). ``resume: auto`` moves a checkpoint that
fails verification aside and falls back to the previous one, with a warning, and still ends on
the very weights of an undisturbed run; an explicit path or ``init_from`` is an error naming the
file. Non-finite values that pass the checksums are refused when loaded.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.cli import main
from bertforge.errors import CheckpointError
from bertforge.core.io import CHECKSUMS_NAME, write_checksums
from bertforge.train.checkpoint import COMPLETE
from bertforge.train.guards import verify_checkpoint
from bertforge.commands.train import pretrain


def flip_tensor_bytes(path: Path) -> None:
    """Overwrite bytes in the middle of a file's tensor data (a safetensors header stays valid,
    so only a checksum can tell)."""
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0] if path.suffix == ".safetensors" else 64
    middle = (start + len(data)) // 2
    data[middle:middle + 16] = bytes(255 - b for b in data[middle:middle + 16])
    path.write_bytes(bytes(data))


def forge_checksums(ckpt: Path) -> None:
    """Re-record every file's checksum, as a user who edited a checkpoint by hand might."""
    names = [p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*")
             if p.is_file() and p.name not in (CHECKSUMS_NAME, COMPLETE)]
    write_checksums(ckpt, names)


DAMAGE = {
    "flipped weights": lambda c: flip_tensor_bytes(c / "model.safetensors"),
    "flipped optimizer state": lambda c: flip_tensor_bytes(c / "training_state/optimizer.pt"),
    "missing RNG state": lambda c: (c / "training_state/rng_rank0.pt").unlink(),
    "missing schedule": lambda c: (c / "training_state/scheduler.pt").unlink(),
    "checksums naming a file outside": lambda c: (c / CHECKSUMS_NAME).write_text(
        (c / CHECKSUMS_NAME).read_text() + f"{'0' * 64}  ../../outside.bin\n"),
    "checksums naming a file twice": lambda c: (c / CHECKSUMS_NAME).write_text(
        (c / CHECKSUMS_NAME).read_text() + f"{'0' * 64}  model.safetensors\n"),
}
FOUND = {
    "flipped weights": "model.safetensors does not match its checksum",
    "flipped optimizer state": "training_state/optimizer.pt does not match its checksum",
    "missing RNG state": "training_state/rng_rank0.pt is missing",
    "missing schedule": "training_state/scheduler.pt is missing",
    "checksums naming a file outside": "names '../../outside.bin', which leads outside",
    "checksums naming a file twice": "model.safetensors is listed again",
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_auto_resume_falls_back_past_a_damaged_checkpoint(kind: str, stopped_at_4: Path,
                                                           finished, tiny_config, caplog) -> None:
    DAMAGE[kind](stopped_at_4 / "checkpoint-4")
    with caplog.at_level(logging.WARNING):
        result = pretrain(tiny_config(stopped_at_4, *finished.extra))
    warning = caplog.text
    assert "resume=auto cannot use checkpoint-4" in warning and FOUND[kind] in warning
    assert "falling back to checkpoint-2" in warning
    # Kept for inspection under a name that is never resumed from, not deleted.
    assert (stopped_at_4 / "checkpoint-4.unusable").is_dir()
    assert result.step == finished.steps
    # Resuming from step 2 lands exactly where the undisturbed run did.
    assert ((finished.ckpt(finished.steps, stopped_at_4) / "model.safetensors").read_bytes()
            == (finished.ckpt(finished.steps) / "model.safetensors").read_bytes())


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_explicit_resume_of_a_damaged_checkpoint_is_one_error_line(
        kind: str, stopped_at_4: Path, finished, tmp_path: Path, capsys) -> None:
    damaged = stopped_at_4 / "checkpoint-4"
    DAMAGE[kind](damaged)
    code = main(["pretrain", *finished.args(tmp_path / "new", f"--resume={damaged}")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: resume: {damaged} is damaged: ") and FOUND[kind] in err, err
    assert f"the previous complete checkpoint next to it is {stopped_at_4 / 'checkpoint-2'}" in err


def test_a_checkpoint_without_checksums_still_needs_every_file(stopped_at_4: Path) -> None:
    # A format-1 checkpoint (before checksums), or one whose checksum file was deleted: the files
    # a resume needs are still checked by name, from meta.json.
    ckpt = stopped_at_4 / "checkpoint-4"
    (ckpt / CHECKSUMS_NAME).unlink()
    verify_checkpoint(ckpt)
    (ckpt / "training_state" / "scheduler.pt").unlink()
    with pytest.raises(CheckpointError, match=r"training_state/scheduler\.pt is missing"):
        verify_checkpoint(ckpt)


def poison_weights(ckpt: Path) -> None:
    weights = load_file(ckpt / "model.safetensors")
    name = next(k for k in weights if k.endswith("attention.self.query.weight"))
    weights[name][0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})


def poison_optimizer(ckpt: Path) -> None:
    path = ckpt / "training_state" / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    state["state"][0]["exp_avg"].view(-1)[0] = float("nan")
    torch.save(state, path)


@pytest.mark.parametrize("poison, file, count", [
    (poison_weights, "model.safetensors", "3 non-finite values in 1 tensor"),
    (poison_optimizer, "training_state/optimizer.pt", "1 non-finite values in 1 tensor"),
])
def test_nonfinite_values_that_pass_the_checksums_are_refused(
        poison, file: str, count: str, stopped_at_4: Path, finished, tiny_config) -> None:
    ckpt = stopped_at_4 / "checkpoint-4"
    poison(ckpt)
    forge_checksums(ckpt)
    verify_checkpoint(ckpt)  # the bytes are what the checksums say: only the values are wrong
    with pytest.raises(CheckpointError) as caught:
        pretrain(tiny_config(stopped_at_4, *finished.extra))
    message = str(caught.value)
    assert message.startswith(f"{ckpt / file} holds {count}")
    assert f"resume={stopped_at_4 / 'checkpoint-2'}" in message
    assert not finished.ckpt(finished.steps, stopped_at_4).exists()


def test_init_from_a_damaged_or_nonfinite_checkpoint_is_refused(finished, tmp_path: Path,
                                                                tiny_config) -> None:
    source = tmp_path / "source"
    shutil.copytree(finished.ckpt(finished.steps), source)
    flip_tensor_bytes(source / "model.safetensors")
    cfg = tiny_config(tmp_path / "phase2", f"--init_from={source}")
    with pytest.raises(CheckpointError, match=rf"{source} is damaged: model\.safetensors does "
                                              "not match its checksum"):
        pretrain(cfg)
    shutil.rmtree(source)
    shutil.copytree(finished.ckpt(finished.steps), source)
    poison_weights(source)
    (source / CHECKSUMS_NAME).unlink()  # e.g. a Hugging Face model directory: nothing to verify
    with pytest.raises(CheckpointError, match=r"model\.safetensors holds 3 non-finite values"):
        pretrain(cfg)
    assert not list((tmp_path / "phase2").glob("checkpoint-*"))


def test_checksums_cover_every_file_and_read_with_sha256sum_format(finished) -> None:
    ckpt = finished.ckpt(finished.steps)
    lines = (ckpt / CHECKSUMS_NAME).read_text().splitlines()
    listed = {line.split("  ", 1)[1] for line in lines}
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*")
               if p.is_file() and p.name not in (CHECKSUMS_NAME, COMPLETE)}
    assert listed == on_disk and "training_state/rng_rank0.pt" in listed
    meta = json.loads((ckpt / "training_state" / "meta.json").read_text())
    assert meta["format_version"] == 2 and "scheduler.pt" in meta["files"]
