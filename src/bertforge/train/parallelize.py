"""Speed options applied to a built model from outside (torchtitan's ``parallelize(model, cfg)``).

The models know nothing of them: a module that can recompute its layers has a
``gradient_checkpointing`` flag, an encoder that can run on its real tokens an ``unpad`` flag, an
attention module a ``varlen_backend`` name, and every family lists its repeated blocks
(``transformer_layers()``). This module sets those, in torchtitan's order:

    activation checkpointing -> unpadding and attention kernel -> regional compile
    -> (the runner, after this) FSDP2 sharding or DDP (``bertforge.train.distributed``)

Compiling before sharding keeps FSDP's hooks outside the compiled graphs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.ops.attention import BACKENDS, resolve_backend


def apply_speed_options(model: nn.Module, *, unpad: bool, attention_backend: str = "auto",
                        gradient_checkpointing: bool = False, compile: bool = False) -> None:
    """Set every speed option on ``model`` in place (``train.unpad``, ``train.attention_backend``,
    ``train.gradient_checkpointing``, ``train.compile``); see docs/performance.md."""
    set_gradient_checkpointing(model, gradient_checkpointing)
    set_unpadding(model, unpad, attention_backend)
    if compile:
        compile_layers(model)


def check_attention_backend(backend: str, device: torch.device, dtype: torch.dtype) -> None:
    """ConfigError naming ``train.attention_backend`` when ``device`` has no kernel of that
    backend for ``dtype`` (called before the model is built)."""
    try:
        resolve_backend(backend, device, dtype)
    except ValueError as exc:
        raise ConfigError(f"train.attention_backend={backend}: {exc}") from None


def set_gradient_checkpointing(model: nn.Module, enabled: bool = True) -> None:
    """Recompute layer activations in backward instead of storing them (training only): every
    stack of ``model`` that supports it (a module with a ``gradient_checkpointing`` flag)."""
    for module in model.modules():
        if hasattr(module, "gradient_checkpointing"):
            module.gradient_checkpointing = enabled


def set_unpadding(model: nn.Module, enabled: bool = True, backend: str = "auto") -> None:
    """Run the encoders of ``model`` on their real tokens only (``bertforge.ops.unpad``): every
    module with an ``unpad`` flag, and ``backend`` (``bertforge.ops.attention.BACKENDS``) for
    the attention kernels of unpadded tokens (modules with a ``varlen_backend``)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {', '.join(BACKENDS)}")
    for module in model.modules():
        if hasattr(module, "unpad"):
            module.unpad = enabled
        if hasattr(module, "varlen_backend"):
            module.varlen_backend = backend


def compiles(setting: bool | None, device: torch.device) -> bool:
    """Whether ``train.compile`` = ``setting`` compiles on ``device``: None (the default) means
    on for GPUs, off for CPUs (docs/performance.md, "torch.compile")."""
    return bool(setting) if setting is not None else device.type == "cuda"


def compile_layers(model: nn.Module, **options: Any) -> None:
    """``torch.compile`` each of ``model.transformer_layers()`` in place (regional compilation):
    one graph serves every layer of a stack, so compiling costs seconds, not minutes, and the
    weights keep their names. Compiled with dynamic shapes from the start: sizes that vary
    between batches (unpadded token counts, batch widths) are symbols, and sizes fixed by the
    weights (hidden, heads) are specialised by the first trace, so the first batch compiles once
    and no later shape recompiles (torch's default, static first, would compile twice).
    ``options`` go to ``torch.compile``."""
    for block in model.transformer_layers():
        block.compile(**{"dynamic": True, **options})


__all__ = ["apply_speed_options", "check_attention_backend", "compile_layers", "compiles",
           "set_gradient_checkpointing", "set_unpadding"]
