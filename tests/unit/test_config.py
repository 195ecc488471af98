"""Run configuration: defaults < YAML file < --key=value overrides, typed and validated, with
messages that name the key, the source and a fix; every shipped recipe loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bertforge.config import PretrainConfig, describe, load_config, save_config, to_dict
from bertforge.errors import ConfigError
from bertforge.recipes import RECIPES_DIR

# Pretraining recipes (the fine-tuning ones are loaded in test_recipes.py).
RECIPES = sorted(p for p in RECIPES_DIR.rglob("*.yaml") if p.parent.name != "finetune")


def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of all settable keys of a config dataclass, in declaration order."""
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            out += leaf_keys(f.default_factory, f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_defaults_then_file_then_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "model: bert-tiny\noptim:\n  lr: 1.0e-2\n  warmup: 0.1\n"
                           "train:\n  max_steps: 50\n")
    cfg = load_config(PretrainConfig, path, ["--optim.lr=5e-4", "train.micro_batch_size=8",
                                             "--train.global_batch_size=64"])
    assert cfg.model == "bert-tiny"                 # file over default
    assert cfg.optim.warmup == 0.1 and cfg.train.max_steps == 50
    assert cfg.optim.lr == 5e-4                     # command line over file
    assert cfg.train.micro_batch_size == 8 and cfg.train.global_batch_size == 64
    assert cfg.optim.weight_decay == 0.01           # untouched default
    assert isinstance(cfg.optim.lr, float) and isinstance(cfg.train.max_steps, int)
    # The later of two overrides of one key wins.
    assert load_config(PretrainConfig, path, ["--train.max_steps=7",
                                              "--train.max_steps=9"]).train.max_steps == 9


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(PretrainConfig, None, ["--model=bert-mini", "--optim.betas=[0.8,0.95]",
                                             "--init_from=/some/model", "--data.max_predictions=7"])
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(PretrainConfig, tmp_path / "config.yaml")
    assert again == cfg and to_dict(again)["optim"]["betas"] == [0.8, 0.95]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(RECIPES_DIR)))
def test_every_recipe_loads(recipe: Path) -> None:
    given = ["--model=m", "--data.path=d"] if recipe.stem == "continue-mlm" else []
    cfg = load_config(PretrainConfig, recipe, given)
    assert cfg.train.global_batch_size % cfg.train.micro_batch_size == 0
    assert cfg.data.path and cfg.output_dir


def test_recipes_exist() -> None:
    names = {p.name for p in RECIPES}
    assert {"tiny-cpu.yaml", "bert-base-phase1.yaml", "bert-large-phase2.yaml"} <= names


@pytest.mark.parametrize("override, message", [
    ("--train.max_step=5", r"unknown config key 'train\.max_step' in the command line\. "
                           r"Did you mean 'train\.max_steps'\?"),
    ("--trian.max_steps=5", r"unknown config key 'trian'.*Did you mean 'train'\?"),
    ("--train.max_steps=abc", r"bad value for 'train\.max_steps' in the command line: .*'abc'"),
    ("--optim.lr=fast", r"bad value for 'optim\.lr' in the command line"),
    ("--data.whole_word_masking=maybe", r"bad value for 'data\.whole_word_masking'"),
    ("--train=3", r"bad value in the command line: .*train.* are sections: set their keys"),
    ("--train.max_steps", r"override '--train\.max_steps' must look like --section\.key=value"),
])
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(PretrainConfig, None, [override])


@pytest.mark.parametrize("overrides, message", [
    (["--train.global_batch_size=10", "--train.micro_batch_size=4"],
     r"train\.global_batch_size \(10\) must be a multiple of train\.micro_batch_size \(4\)"),
    (["--precision=fp8"], r"precision must be one of auto, fp32, bf16, fp16, got 'fp8'"),
    (["--optim.name=sgd"], r"optim\.name must be one of lamb, adamw, decoupled_adamw, stableadamw, "
     r"decoupled_stableadamw, muon, got 'sgd'"),
    (["--optim.warmup=1.5"], r"optim\.warmup must be a finite number in \[0, 1\), got 1\.5"),
    (["--optim.betas=[0.9]"], r"optim\.betas needs two numbers"),
    (["--train.max_steps=0"], r"train\.max_steps must be >= 1, got 0"),
    (["--data.masked_lm_prob=1.5"], r"data\.masked_lm_prob must be a finite number in \(0, 1\), got 1\.5"),
    (["--data.num_workers=-1"], r"data\.num_workers must be >= 0, got -1"),
    (["--checkpoint.every=0"], r"checkpoint\.every must be >= 1, got 0"),
    (["--train.attention_backend=flash", "--precision=fp32"],
     r"train\.attention_backend=flash needs bf16 or fp16 activations .* precision=fp32"),
    (["--train.attention_backend=torch-flash", "--precision=fp32"],
     r"train\.attention_backend=torch-flash needs bf16 or fp16 activations .* precision=fp32"),
    (["--train.attention_backend=fast"], r"train\.attention_backend must be one of auto, flash, "
     r"torch-flash, nested, padded, got 'fast'"),
    (["--train.fsdp_reduce_dtype=fp16"], r"train\.fsdp_reduce_dtype must be one of fp32, bf16"),
])
def test_invalid_values_are_rejected(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(PretrainConfig, None, overrides)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found: .*missing\.yaml"):
        load_config(PretrainConfig, tmp_path / "missing.yaml")
    bad_key = write(tmp_path, "train:\n  micro_batch: 4\n")
    with pytest.raises(ConfigError, match=rf"unknown config key 'train\.micro_batch' in "
                                          rf"{bad_key}\. Did you mean 'train\.micro_batch_size'"):
        load_config(PretrainConfig, bad_key)
    broken = write(tmp_path, "train: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"cannot parse config file {broken}"):
        load_config(PretrainConfig, broken)
    # A value error in the file is reported after merging, like any other.
    typed = write(tmp_path, "train:\n  max_steps: many\n")
    with pytest.raises(ConfigError, match=rf"bad value for 'train\.max_steps' in {typed}"):
        load_config(PretrainConfig, typed)


def test_help_lists_every_key_with_default_and_text() -> None:
    text = "\n".join(describe(PretrainConfig))
    for key in ("--model='bert-base-uncased'", "--train.max_steps=1000",
                "--optim.betas=[0.9, 0.999]", "--data.num_workers=2", "--benchmark.steps=20"):
        assert key in text
    assert "Optimizer steps to run" in text
    listed = [line.split("=")[0].strip() for line in describe(PretrainConfig)]
    assert listed == [f"--{key}" for key in leaf_keys(PretrainConfig)]  # each key once, in order
