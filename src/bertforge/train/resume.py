"""Which checkpoint a run resumes from, and whether it is intact enough to use.

:func:`verify_checkpoint` re-hashes every file against ``checksums.sha256`` and checks that every
part a resume needs is there (the list in ``training_state/meta.json``), so flipped bytes, a
truncated copy or a deleted file are found before anything is loaded. :func:`resolve_resume`
implements the ``resume`` setting; with ``auto`` it moves a checkpoint that fails verification
aside (``checkpoint-N.unusable``, never deleted) with a warning and falls back to the previous
one. :func:`verify_model_files` is the check ``init_from`` needs (weights, config, tokenizer).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from bertforge.errors import CheckpointError, ConfigError
from bertforge.core.io import CHECKSUMS_NAME, read_checksums, verify_checksums
from bertforge.train.checkpoint import (COMPLETE, TRAINING_STATE, CheckpointManager,
                                        checkpoint_step, load_json, required_files)

log = logging.getLogger(__name__)
UNUSABLE_SUFFIX = ".unusable"


def resolve_resume(resume: Optional[str | os.PathLike], output_dir: str | os.PathLike) -> Optional[Path]:
    """What to resume from, verified with :func:`verify_checkpoint`.

    ``"auto"`` -> the newest complete checkpoint in ``output_dir`` that verifies (None if there is
    none: a fresh start); a newer one that fails is moved aside as ``checkpoint-N.unusable`` with
    a warning naming what is wrong and which checkpoint is used instead. ``"none"`` -> None.
    Otherwise a checkpoint directory, which must be complete and verify. Writer only (rank 0):
    moving a checkpoint aside changes ``output_dir``.
    """
    if resume is None or str(resume).strip().lower() == "none":
        return None
    text = str(resume).strip()
    if not text:
        raise ConfigError("resume is empty; use auto, none or the path of a checkpoint directory")
    if text.lower() == "auto":
        return _newest_usable(CheckpointManager(output_dir, keep=0))
    path = Path(text).expanduser()
    _check_resume_path(path)
    try:
        verify_checkpoint(path)
    except CheckpointError as exc:
        older = previous_checkpoint(path)
        also = f"; the previous complete checkpoint next to it is {older}" if older else ""
        raise CheckpointError(f"resume: {exc}{also}") from None
    return path


def previous_checkpoint(path: Path) -> Optional[Path]:
    """The newest complete checkpoint beside ``path`` with a lower step, if any (None too when
    ``path`` is not a checkpoint, e.g. a Hugging Face model directory)."""
    try:
        step = checkpoint_step(path)
    except CheckpointError:
        return None
    older = [p for s, p in CheckpointManager(path.parent, keep=0).checkpoints() if s < step]
    return older[-1] if older else None


def _newest_usable(manager: CheckpointManager) -> Optional[Path]:
    """Newest checkpoint that verifies; the ones after it are moved aside, loudly."""
    for _, path in reversed(manager.checkpoints()):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as exc:
            aside = path.with_name(path.name + UNUSABLE_SUFFIX)
            n = 1
            while aside.exists():
                n += 1
                aside = path.with_name(f"{path.name}{UNUSABLE_SUFFIX}{n}")
            os.replace(path, aside)
            left = [p.name for _, p in manager.checkpoints()]
            log.warning("WARNING: resume=auto cannot use %s: %s. Moved it aside to %s (kept for "
                        "inspection, never resumed from); %s", path.name, exc, aside.name,
                        f"falling back to {left[-1]}" if left else
                        "no other checkpoint is left, so the run starts from scratch")
    return None


def _check_resume_path(path: Path) -> None:
    """CheckpointError for a ``resume`` path that is not a checkpoint directory at all."""
    hint = "pass a checkpoint-N directory of a previous run, resume=auto or resume=none"
    if not path.exists():
        raise CheckpointError(f"resume: {path} does not exist; {hint}")
    if not path.is_dir():
        raise CheckpointError(f"resume: {path} is a file, not a checkpoint directory; {hint}")
    if (path / COMPLETE).is_file():
        return
    newest = CheckpointManager(path, keep=0).latest()
    if newest is not None:
        raise CheckpointError(f"resume: {path} is a run directory, not a checkpoint; pass its "
                              f"newest checkpoint {newest}, or set output_dir={path} with "
                              "resume=auto")
    if not (path / TRAINING_STATE).exists() and (path / "config.json").is_file():
        raise CheckpointError(f"resume: {path} is a model directory without training state; "
                              f"to start a new run from its weights use init_from={path}")
    older = CheckpointManager(path.parent, keep=0).latest()
    also = f" (the newest complete one next to it is {older})" if older else ""
    raise CheckpointError(f"resume: {path} is not a complete checkpoint: it has no {COMPLETE} "
                          f"marker, so its save was interrupted{also}; pass a complete "
                          "checkpoint or resume=auto, which skips incomplete ones")


def verify_checkpoint(path: str | os.PathLike) -> None:
    """CheckpointError unless ``path`` is complete, intact and holds everything a resume reads.

    Checks the ``COMPLETE`` marker, every file listed in ``checksums.sha256`` (present, same
    SHA-256: this reads every byte once), and the files ``training_state/meta.json`` says must
    exist (optimizer, or every shard of a sharded one, schedule, config, each rank's RNG and data
    position, the loss scaler).
    Checkpoints from before checksums (format 1) get the file checks and a warning.
    """
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise CheckpointError(f"{path} has no {COMPLETE} marker: its save was interrupted")
    try:
        recorded = read_checksums(path)
    except (OSError, ValueError) as exc:
        recorded, problems = {}, [f"{CHECKSUMS_NAME} cannot be read ({exc})"]
    else:
        if recorded is None:
            log.warning("%s has no %s (written by an older bertforge): its files cannot be "
                        "verified", path, CHECKSUMS_NAME)
        problems = verify_checksums(path, recorded or {})
    ts = path / TRAINING_STATE
    if not problems:
        meta = load_json(ts / "meta.json") if (ts / "meta.json").is_file() else None
        problems = [f"{TRAINING_STATE}/{name} is missing" for name in required_files(meta)
                    if not (ts / name).is_file()]
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4
                                          else "")
        raise CheckpointError(f"{path} is damaged: {shown}")


def verify_model_files(path: str | os.PathLike) -> None:
    """CheckpointError if the model files of ``path`` (weights, config, tokenizer: everything
    outside ``training_state/``) fail their recorded checksums. For ``init_from``, which reads
    only those; a directory without ``checksums.sha256`` (e.g. from transformers) passes."""
    path = Path(path)
    try:
        recorded = read_checksums(path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}/{CHECKSUMS_NAME} cannot be read ({exc})") from None
    if recorded is None:
        return
    model_files = {n: d for n, d in recorded.items() if not n.startswith(TRAINING_STATE + "/")}
    problems = verify_checksums(path, model_files)
    if problems:
        raise CheckpointError(f"{path} is damaged: {'; '.join(problems)}")


__all__ = ["UNUSABLE_SUFFIX", "previous_checkpoint", "resolve_resume", "verify_checkpoint",
           "verify_model_files"]
