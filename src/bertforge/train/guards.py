"""Checks that keep bad values out of a run and out of its checkpoints.

* :func:`count_nonfinite` / :func:`refuse_nonfinite`: NaN or inf in weights or optimizer state,
  refused when loading (a damaged or diverged checkpoint) and before saving (never publish one).
* :func:`check_vocab`: a checkpoint's vocabulary against the prepared data's, by content, not
  only by size (two vocabularies of 30522 tokens are rarely the same vocabulary).
* :func:`check_model_fits` / :func:`explain_oom`: a model too large for the machine fails with
  what was asked and what it needs instead of an allocator traceback or the OOM killer.
* :func:`load_for_training`: a run's starting model, loaded behind those checks.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from bertforge.errors import CheckpointError, ConfigError
from bertforge.models.checks import costliest_key, count_nonfinite, model_bytes, nonfinite_summary
from bertforge.models.loading import ModelSource, load_model
from bertforge.tokenization import read_vocab_tokens, vocab_hash
from bertforge.train.resume import previous_checkpoint

GIB = 2**30
# fp32 weights, gradients and the optimizer's two moments (LAMB and AdamW alike).
TRAINING_BYTES_PER_PARAMETER = 16


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[tuple[str, torch.Tensor]]:
    """``("state[i].exp_avg", tensor)`` for every tensor of the optimizer's state."""
    for i, state in enumerate(optimizer.state.values()):
        for key, value in state.items():
            if torch.is_tensor(value):
                yield f"state[{i}].{key}", value


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


__all__ = ["RESTART", "check_model_fits", "check_vocab", "count_nonfinite",
           "device_memory_bytes", "explain_oom", "load_for_training", "nonfinite_remedy",
           "nonfinite_summary", "optimizer_tensors", "refuse_nonfinite"]
