"""Checks that keep bad values out of a run and out of its checkpoints.

* :func:`resolve_resume`: the ``resume`` setting; :func:`verify_checkpoint` re-hashes every file
  of a checkpoint against ``checksums.sha256`` and checks that every part a resume needs is
  there (the list in ``training_state/meta.json``), so flipped bytes, a truncated copy or a
  deleted file are found before anything is loaded. With ``auto`` a checkpoint that fails is
  moved aside (``checkpoint-N.unusable``, never deleted) with a warning, and the previous one is
  used. :func:`verify_model_files` is the check ``init_from`` needs (weights, config, tokenizer).
* :func:`count_nonfinite` / :func:`refuse_nonfinite`: NaN or inf in weights or optimizer state,
  refused when loading (a damaged or diverged checkpoint) and before saving (never publish one).
* :func:`check_vocab`: a checkpoint's vocabulary against the prepared data's, by content, not
  only by size (two vocabularies of 30522 tokens are rarely the same vocabulary).
* :func:`check_model_fits` / :func:`explain_oom`: a model too large for the machine fails with
  what was asked and what it needs instead of an allocator traceback or the OOM killer.
* :func:`load_for_training`: a run's starting model, loaded behind those checks.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import torch

from bertforge.core.io import CHECKSUMS_NAME, read_checksums, verify_checksums
from bertforge.errors import CheckpointError, ConfigError
from bertforge.models.checks import costliest_key, count_nonfinite, model_bytes, nonfinite_summary
from bertforge.models.loading import ModelSource, load_model
from bertforge.tokenization import read_vocab_tokens, vocab_hash
from bertforge.train.checkpoint import (COMPLETE, TRAINING_STATE, CheckpointManager,
                                        checkpoint_step, load_json, required_files)

log = logging.getLogger(__name__)

UNUSABLE_SUFFIX = ".unusable"


# ---------------------------------------------------------------------- which checkpoint to resume

def resolve_resume(resume: Optional[str | os.PathLike],
                   output_dir: str | os.PathLike) -> Optional[Path]:
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


# ---------------------------------------------------------------------- what a run loads and saves

GIB = 2**30
# fp32 weights, gradients and the optimizer's two moments (LAMB and AdamW alike).
TRAINING_BYTES_PER_PARAMETER = 16


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
    """``("state[i].exp_avg", tensor)`` for every tensor of the optimizer's state."""
    return [(f"state[{i}].{key}", value) for i, state in enumerate(optimizer.state.values())
            for key, value in state.items() if torch.is_tensor(value)]


def refuse_nonfinite(named: Iterable[tuple[str, torch.Tensor]], source: Path,
                     checkpoint: Path) -> None:
    """``CheckpointError`` naming ``source`` (a file of ``checkpoint``) when any tensor holds NaN
    or inf; it points at the previous complete checkpoint of the same run, if there is one."""
    problem = nonfinite_summary(named)
    if not problem:
        return
    raise CheckpointError(f"{source} holds {problem}; refusing to train from it: "
                          f"{nonfinite_remedy(checkpoint, RESTART)}")


RESTART = "start from another checkpoint, or from scratch with resume=none"
"""The advice for damaged weights of a pretraining run with no earlier checkpoint."""


def nonfinite_remedy(checkpoint: Path | None, fallback: str) -> str:
    """What to do instead of training from the non-finite weights of ``checkpoint``: resume
    from the previous complete checkpoint of its run when there is one, else ``fallback``."""
    older = previous_checkpoint(checkpoint) if checkpoint is not None else None
    if older is None:
        return fallback
    return f"resume from the previous complete checkpoint instead: resume={older}"


def load_for_training(source: ModelSource, head: str, device: torch.device, *, seed: int,
                      checkpoint: Path | None, fallback: str, new_heads: bool = False,
                      missing_head: str | None = None) -> torch.nn.Module:
    """The ``head`` model of ``source`` (``load_model``) on ``device`` in train mode, after
    checking the device can hold its training state; running out of memory while loading is a
    ConfigError, and non-finite weights point at ``nonfinite_remedy(checkpoint, fallback)``;
    ``missing_head``: what to do when the files lack the head (``load_model``)."""
    name = str(source.directory or source.name)
    check_model_fits(source.config, device, name, source.config_name)
    with explain_oom(source.config, device, name):
        model = load_model(source, head, device=device, new_heads=new_heads, seed=seed,
                           nonfinite_remedy=nonfinite_remedy(checkpoint, fallback),
                           missing_head=missing_head)
    return model.train()


def check_vocab(source: Path, data_tokens: tuple[str, ...] | None, data_path: str) -> bool:
    """ConfigError when the tokenizer saved in ``source`` differs from the data's vocabulary.

    Returns False (nothing compared) when either side has no vocabulary to compare: NVIDIA/Google
    hdf5 data, or a model directory without vocab.txt/tokenizer.json.
    """
    theirs = read_vocab_tokens(source)
    if data_tokens is None or theirs is None:
        return False
    if vocab_hash(theirs) == vocab_hash(data_tokens):
        return True
    first = next((i for i, (a, b) in enumerate(zip(theirs, data_tokens)) if a != b),
                 min(len(theirs), len(data_tokens)))
    raise ConfigError(
        f"{source} was trained with another vocabulary than the data at {data_path}: "
        f"{len(theirs)} vs {len(data_tokens)} tokens, first difference at id {first} "
        f"({_token_at(theirs, first)} in the checkpoint, {_token_at(data_tokens, first)} in the "
        "data; sha256 "
        f"{vocab_hash(theirs)[:12]} vs {vocab_hash(data_tokens)[:12]}). Prepare the data with the "
        f"checkpoint's vocabulary (--vocab {source}), or start from a checkpoint trained on this one")


def _token_at(tokens: Sequence[str], i: int) -> str:
    return repr(tokens[i]) if i < len(tokens) else "(none)"


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device`` (GPU memory, or the machine's RAM for the CPU), if known."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def _shape(config) -> str:
    return config.shape_summary()


def check_model_fits(config, device: torch.device, model: str,
                     config_name: str | None = None) -> None:
    """ConfigError when training ``config`` cannot fit in ``device``'s memory at all; the
    setting that costs the most is named, with ``config_name`` (where the config was read)."""
    params = config.num_parameters()
    need = model_bytes(config, TRAINING_BYTES_PER_PARAMETER)
    have = device_memory_bytes(device)
    if have is not None and need > have:
        key = costliest_key(config, TRAINING_BYTES_PER_PARAMETER)
        blame = (f" {key[0]}={key[1]:,} in {config_name or model} costs the most; check it."
                 if key else "")
        raise ConfigError(
            f"model {model} ({_shape(config)}) has {params:,} parameters; training it needs at "
            f"least {need / GIB:,.1f} GiB for weights, gradients and optimizer moments "
            f"({TRAINING_BYTES_PER_PARAMETER} bytes per parameter) but the {device.type} has "
            f"{have / GIB:,.1f} GiB.{blame} Choose a smaller model")


@contextmanager
def explain_oom(config, device: torch.device, model: str) -> Iterator[None]:
    """Turn an allocation failure while building or moving the model into a ConfigError that
    says what was asked and what it needs."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        text = str(exc).lower()
        if not isinstance(exc, MemoryError) and "memory" not in text and "alloc" not in text:
            raise
        params = config.num_parameters()
        raise ConfigError(
            f"not enough {device.type} memory for model {model} ({_shape(config)}): its "
            f"{params:,} parameters take {params * 4 / GIB:,.1f} GiB in fp32 and training needs "
            f"about {params * TRAINING_BYTES_PER_PARAMETER / GIB:,.1f} GiB plus activations. "
            "Choose a smaller model or a device with more memory") from None


__all__ = ["RESTART", "UNUSABLE_SUFFIX", "check_model_fits", "check_vocab", "count_nonfinite",
           "device_memory_bytes", "explain_oom", "load_for_training", "nonfinite_remedy",
           "nonfinite_summary", "optimizer_tensors", "previous_checkpoint", "refuse_nonfinite",
           "resolve_resume", "verify_checkpoint", "verify_model_files"]
