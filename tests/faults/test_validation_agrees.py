"""User input is validated once, at the config/CLI boundary, from the constants of
``bertforge.core.limits``; library classes check their own arguments against the same constants. So the
config and the library accept exactly the same values (they used to disagree: lr > 0 in the config
but >= 0 in Lamb, masked_lm_prob < 1 in the config but <= 1 in the loader), and library errors are
``ValueError``s in the library's own parameter names, never config keys."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
from torch import nn

from bertforge.config import PretrainConfig, load_config
from bertforge.data.collate.mlm import masking_spec
from bertforge.data.prepare_config import PrepareConfig
from bertforge.errors import ConfigError
from bertforge.optim import DecoupledAdamW, Lamb, StableAdamW, build_optimizer, build_scheduler

NUMBERS = [-1.0, 0.0, 1e-12, 0.15, 0.5, 0.999, 1.0, 1.5, 10.0, 10.5, 1e30, 1e39,
           math.inf, -math.inf, math.nan]


def config_accepts(key: str, value: Any, *others: str) -> bool:
    text = value if isinstance(value, str) else repr(value)
    try:
        load_config(PretrainConfig, None, [*others, f"--{key}={text}"])
    except ConfigError:
        return False
    return True


def library_accepts(call: Callable[[], Any], name: str) -> bool:
    try:
        call()
    except ValueError as exc:
        message = str(exc)
        assert message.startswith(name) or f"{name}=" in message, message
        assert not any(k in message for k in ("optim.", "train.", "data.")), message
        return False
    return True


def params() -> list[nn.Parameter]:
    return [nn.Parameter(torch.ones(2, 2))]


def scheduler(**kw: Any) -> Any:
    opt = torch.optim.SGD(params(), lr=0.1)
    return build_scheduler(opt, **{"name": "poly", "total_steps": 10, "warmup": 0.1,
                                   "power": 0.5, **kw})


def masking(p: float) -> Any:
    return masking_spec(masked_lm_prob=p, max_predictions=20, whole_word_masking=False,
                        is_continuation=None, mask_id=4, vocab_size=100, special_ids=[0, 1, 2, 3],
                        pad_id=0)


LIBRARY = {
    "optim.lr": ("lr", lambda v: Lamb(params(), lr=v)),
    "optim.eps": ("eps", lambda v: Lamb(params(), eps=v)),
    "optim.weight_decay": ("weight_decay", lambda v: Lamb(params(), weight_decay=v)),
    "optim.max_grad_norm": ("max_grad_norm", lambda v: Lamb(params(), max_grad_norm=v)),
    "optim.warmup": ("warmup", lambda v: scheduler(warmup=v)),
    "optim.power": ("power", lambda v: scheduler(power=v)),
    "optim.decay": ("decay", lambda v: scheduler(name="wsd", warmup=0.0, decay=v)),
    "optim.min_lr_ratio": ("min_lr_ratio", lambda v: scheduler(name="wsd", min_lr_ratio=v)),
    "data.masked_lm_prob": ("masked_lm_prob", masking),
}


@pytest.mark.parametrize("key", list(LIBRARY))
def test_config_and_library_accept_the_same_numbers(key: str) -> None:
    name, call = LIBRARY[key]
    for value in NUMBERS:
        assert config_accepts(key, value) == library_accepts(lambda: call(value), name), value


def test_betas_agree() -> None:
    for beta in NUMBERS:
        assert (config_accepts("optim.betas", f"[0.9,{beta!r}]")
                == library_accepts(lambda: Lamb(params(), betas=(0.9, beta)), "betas[1]")), beta


@pytest.mark.parametrize("key, name, call", [
    ("optim.name", "name", lambda v: build_optimizer(nn.ModuleList([nn.Linear(2, 2)]), v,
                                                     lr=0.1, weight_decay=0.0)),
    ("optim.schedule", "schedule", lambda v: scheduler(name=v)),
    ("optim.decay_shape", "decay_shape", lambda v: scheduler(name="wsd", decay_shape=v)),
])
def test_config_and_library_accept_the_same_names(key: str, name: str, call) -> None:
    for value in ("lamb", "adamw", "poly", "linear", "constant", "sgd", "cosine", "LAMB",
                  "decoupled_adamw", "stableadamw", "decoupled_stableadamw", "stable_adamw", "muon",
                  "wsd", "WSD", "1-sqrt", "sqrt"):
        assert config_accepts(key, value) == library_accepts(lambda: call(value), name), value


def test_wsd_phases_agree() -> None:
    """warmup + decay <= 1 for "wsd", in the config (both keys named) and in the scheduler."""
    for warmup in (0.0, 0.1, 0.5, 0.7, 0.9, 0.999):
        for decay in (0.0, 0.1, 0.3, 0.5, 0.9, 1.0):
            config_ok = config_accepts("optim.decay", decay, "--optim.schedule=wsd",
                                       f"--optim.warmup={warmup!r}")
            library_ok = library_accepts(
                lambda: scheduler(name="wsd", warmup=warmup, decay=decay), "warmup + decay")
            assert config_ok == library_ok == (warmup + decay <= 1 + 1e-12), (warmup, decay)


@pytest.mark.parametrize("cls", [StableAdamW, DecoupledAdamW])
def test_adamw_variants_accept_what_the_config_accepts(cls) -> None:
    for key, name in (("optim.lr", "lr"), ("optim.eps", "eps"),
                      ("optim.weight_decay", "weight_decay")):
        for value in NUMBERS:
            assert config_accepts(key, value) == library_accepts(
                lambda: cls(params(), **{name: value}), name), (key, value)
    for beta in NUMBERS:
        assert (config_accepts("optim.betas", f"[{beta!r},0.98]")
                == library_accepts(lambda: cls(params(), betas=(beta, 0.98)), "betas[0]")), beta


def test_prepare_flags_agree_with_the_config_and_the_loader() -> None:
    defaults = dict(input=["corpus.txt"], vocab="vocab.txt", output="out", max_seq_length=128,
                    short_seq_prob=0.1, objective="nsp", input_format="auto", format="native",
                    workers=1, dupe_factor=1, validation_fraction=0.01, max_predictions=20,
                    docs_per_shard=1, chunk_bytes=1, length_bin_width=1)
    for value in NUMBERS:
        try:
            PrepareConfig(**defaults, masked_lm_prob=value)
            flag_ok = True
        except ConfigError as exc:
            assert str(exc).startswith("--masked-lm-prob: must be a finite number in (0, 1)")
            flag_ok = False
        assert flag_ok == config_accepts("data.masked_lm_prob", value), value
