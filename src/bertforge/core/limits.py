"""The allowed values of user-facing settings, in one torch-free place.

The config layer checks user input against these once, when a run is configured, and names the
config key (``ConfigError``); library classes (``Lamb``, the schedules, the loader, masking) check
their own arguments against the same objects and name their own parameter (``ValueError``). One
definition, two callers, so the two can never disagree.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("bertforge.settings")

# bertforge.optim.build_optimizer; decoupled_adamw and the stableadamws are composer's /
# ModernBERT's names, muon is Muon + AdamW (bertforge.optim.muon).
OPTIMIZERS = ("lamb", "adamw", "decoupled_adamw", "stableadamw", "decoupled_stableadamw",
              "muon")
# bertforge.ops.attention.BACKENDS, and those of them that are one fused flash kernel (no fp32)
POOLINGS = ("mean", "cls", "last")
"""How a text vector is made from token vectors (``bertforge.ops.pooling``): the mean of the real
tokens, the first token ([CLS]/<s>) or the last real token."""
ATTENTION_BACKENDS = ("auto", "flash", "torch-flash", "nested", "padded")
FUSED_ATTENTION_BACKENDS = ("flash", "torch-flash")
SCHEDULES = ("poly", "linear", "constant", "wsd")  # bertforge.optim.build
DECAY_SHAPES = ("linear", "1-sqrt")  # the decay phase of "wsd"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "int8", "fp16")
"""Inference adds int8: linear layers dynamically quantized (``bertforge.ops.linear``), CPU only."""
INPUT_FORMATS = ("auto", "sentences", "paragraphs", "jsonl", "wiki")  # bertforge.data.corpus
OBJECTIVES = ("nsp", "sop", "none", "denoise")  # bertforge.data.instances
MIN_SEQUENCE_TOKENS = 4
"""The shortest input length setting: the special tokens of a text pair's template
(``[CLS] A [SEP] B [SEP]``, ``<s> A </s></s> B </s>`` less one) plus a token of text."""
MIN_TARGET_TOKENS = 3
"""The shortest summary length setting: ``<s>``, one token, ``</s>``."""


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval of finite numbers; ``None`` leaves a side unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):  # inf, -inf and nan are never a setting
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}" if self.low is not None else "finite"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        low = "-inf" if self.low is None else f"{self.low:g}"
        return f"in {left}{low}, {self.high:g}{right}"

    def check(self, value: Any, name: str, error: type[Exception] = ValueError) -> None:
        """Raise ``error`` naming ``name`` unless ``value`` is a finite number in the range."""
        if value not in self:
            raise error(f"{name} must be a finite number {self}, got {value!r}")


# Optimizer. No BERT recipe goes near lr 1 (NVIDIA's LAMB: 6e-3 at batch 64k); the bound stops an
# overflow (1e39 is past float32) or a typo (1e30) from reaching the weights.
LEARNING_RATE = Range(0.0, 10.0, low_open=True)
BETA = Range(0.0, 1.0, high_open=True)
EPS = Range(0.0, 1.0, low_open=True)
WEIGHT_DECAY = Range(0.0, 1.0)
MAX_GRAD_NORM = Range(0.0)  # 0 turns clipping off
WARMUP = Range(0.0, 1.0, high_open=True)  # a fraction of the steps
POWER = Range(0.0, 100.0, low_open=True)
DECAY = Range(0.0, 1.0)  # wsd: fraction of the steps spent decaying (warmup + decay <= 1)
MIN_LR_RATIO = Range(0.0, 1.0)  # wsd: the last step's lr as a fraction of the peak

# Data.
MASKED_LM_PROB = Range(0.0, 1.0, low_open=True, high_open=True)
FRACTION = Range(0.0, 1.0, high_open=True)  # e.g. the validation fraction of `prepare`

# Distributed: seconds a collective may wait for the other ranks.
DIST_TIMEOUT_S = Range(0.0, 24 * 3600.0, low_open=True)


def check_choice(value: Any, name: str, choices: tuple[str, ...],
                 error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise error(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def check_phases(warmup: float, decay: float, names: tuple[str, str],
                 error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming both settings unless the warm-up and decay fractions of a
    warm-up-stable-decay schedule fit in the run together (a rounding's worth of slack, so
    0.7 + 0.3 is not refused for its last bit)."""
    if warmup + decay > 1.0 + 1e-12:
        raise error(f"{names[0]} + {names[1]} must be at most 1 (warm-up and decay cannot "
                    f"overlap), got {warmup!r} + {decay!r}")


_SAID: set[tuple[str, str, str]] = set()
_SAID_LOCK = threading.Lock()


def setting_changed(key: str, old: Any, new: Any, why: str, *, default: bool = False,
                    level: int = logging.WARNING) -> None:
    """Say, once per process, that the setting ``key`` is used as ``new`` instead of ``old``
    (``default``: ``old`` is the setting's default; a default or a saved value capped, rounded
    or replaced), and ``why``: a setting never changes without a word, and a word said once is
    not repeated per batch or request. ``level``: ``logging.INFO`` for a change that is the
    expected reading of a common value, not a sign that something is wrong."""
    said = (key, repr(old), repr(new))
    with _SAID_LOCK:
        if said in _SAID:
            return
        _SAID.add(said)
    log.log(level, "%s: using %r instead of %s%r (%s)", key, new, "the default " * default, old,
            why)


def length_within(value: int | None, name: str, default: int, positions: int,
                  error: type[Exception] = ValueError) -> int:
    """A length setting against a model's ``positions``: ``value``, else ``default`` capped at
    them (said once, :func:`setting_changed`); an explicit value beyond them raises ``error``
    naming ``name`` (checked before any data is read, so the run does not fail at the first
    long input)."""
    if value is None:
        if default > positions:
            setting_changed(name, default, positions, f"the model has {positions} positions",
                            default=True)
        return min(default, positions)
    if value > positions:
        raise error(f"{name}={value} exceeds the model's {positions} positions; lower it")
    return value


__all__ = ["ATTENTION_BACKENDS", "BETA", "DECAY", "DECAY_SHAPES", "DIST_TIMEOUT_S", "EPS",
           "FRACTION", "FUSED_ATTENTION_BACKENDS", "INFERENCE_PRECISIONS", "LEARNING_RATE",
           "MASKED_LM_PROB", "MAX_GRAD_NORM", "MIN_LR_RATIO", "MIN_SEQUENCE_TOKENS",
           "MIN_TARGET_TOKENS", "OPTIMIZERS", "POWER", "PRECISIONS", "Range", "SCHEDULES",
           "WARMUP", "WEIGHT_DECAY",
           "check_choice", "check_phases", "length_within", "setting_changed"]
