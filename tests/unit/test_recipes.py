"""Recipes are found by name (with or without folder and .yaml) or by path; anything else is a
one-line ConfigError that lists the names."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.config import FinetuneConfig, load_config
from bertforge.data.finetuning import GLUE_TASKS as GLUE
from bertforge.errors import ConfigError
from bertforge.recipes import RECIPES_DIR, list_recipes, resolve_recipe

LARGE1 = RECIPES_DIR / "pretrain" / "bert-large-phase1.yaml"


def test_lists_every_shipped_recipe() -> None:
    assert list_recipes("debug", "pretrain") == [
        "debug/bart-tiny-cpu", "debug/modernbert-tiny-cpu", "debug/tiny-cpu",
        "pretrain/bart-base-phase1", "pretrain/bart-base-phase2", "pretrain/bart-large-phase1",
        "pretrain/bart-large-phase2", "pretrain/bert-base-phase1", "pretrain/bert-base-phase2",
        "pretrain/bert-large-phase1", "pretrain/bert-large-phase2", "pretrain/budget-cpu",
        "pretrain/continue-mlm", "pretrain/modernbert-base-context",
        "pretrain/modernbert-base-phase1", "pretrain/modernbert-large-context",
        "pretrain/modernbert-large-phase1"]
    finetune = list_recipes("finetune")
    assert {f"finetune/glue-{t}" for t in GLUE} | {
        "finetune/squad-v1.1-bert-large", "finetune/squad-v1.1-bert-base",
        "finetune/squad-v2.0-bert-large", "finetune/swag", "finetune/conll2003",
        "finetune/debug-cpu", "finetune/summarization-cnndm",
        "finetune/summarization-xsum", "finetune/embedding-squad", "finetune/embedding-stsb",
        "finetune/reranker-squad"} == set(finetune)
    assert sorted(list_recipes()) == sorted(list_recipes("debug", "pretrain") + finetune)


@pytest.mark.parametrize("name", list_recipes("finetune"))
def test_finetuning_recipes_load(name: str) -> None:
    cfg = load_config(FinetuneConfig, resolve_recipe(name), ["--model=DIR"])
    if cfg.task == "glue":  # each GLUE recipe is named after its task
        assert name == f"finetune/glue-{cfg.data.task_name}"


@pytest.mark.parametrize("name", list_recipes("debug", "pretrain"))
def test_pretraining_recipes_load_and_divide_their_batch(name: str) -> None:
    from bertforge.config import PretrainConfig
    from bertforge.models.registry import resolve_config

    given = (["--model=bert-base-uncased", "--data.path=d"]  # the recipe leaves these to you
             if name == "pretrain/continue-mlm" else [])
    cfg = load_config(PretrainConfig, resolve_recipe(name), given)
    assert cfg.train.global_batch_size % cfg.train.micro_batch_size == 0
    family, config = resolve_config(cfg.model)
    assert config.num_parameters() > 0  # the model named is a known preset
    assert family.seq2seq == ("bart" in name)


def test_summarization_recipes_carry_the_published_generation_settings() -> None:
    cnn = load_config(FinetuneConfig, resolve_recipe("summarization-cnndm"), ["--model=DIR"])
    assert cnn.eval.generation_overrides() == {
        "num_beams": 4, "length_penalty": 2.0, "max_length": 140, "min_length": 55,
        "no_repeat_ngram_size": 3, "early_stopping": True}
    xsum = load_config(FinetuneConfig, resolve_recipe("summarization-xsum"), ["--model=DIR"])
    assert xsum.eval.num_beams == 6 and xsum.train.label_smoothing == 0.1


def test_short_names_are_unique() -> None:
    # A short name is accepted without its folder, so two folders must not share one.
    short = [name.rsplit("/", 1)[-1] for name in list_recipes()]
    assert len(set(short)) == len(short)


@pytest.mark.parametrize("name", ["bert-large-phase1", "bert-large-phase1.yaml",
                                  "pretrain/bert-large-phase1", "pretrain/bert-large-phase1.yaml"])
def test_names_resolve_to_the_packaged_file(name: str) -> None:
    assert resolve_recipe(name) == LARGE1


def test_debug_recipe() -> None:
    assert resolve_recipe("tiny-cpu") == resolve_recipe("debug/tiny-cpu.yaml")
    assert resolve_recipe("tiny-cpu").is_file()


def test_an_existing_path_is_used_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "tiny-cpu.yaml"  # shadows the recipe of that name: the file wins
    mine.write_text("model: bert-mini\n")
    assert resolve_recipe(mine) == mine
    monkeypatch.chdir(tmp_path)
    assert resolve_recipe("tiny-cpu.yaml") == Path("tiny-cpu.yaml")


@pytest.mark.parametrize("given, meant", [
    ("tiny-cp", "debug/tiny-cpu"), ("glue-mrcp", "finetune/glue-mrpc"),
    ("configs/pretrain/bert-large-phase1.yaml", "pretrain/bert-large-phase1")])
def test_a_mistyped_name_gets_a_did_you_mean(given: str, meant: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_recipe(given)
    assert str(err.value) == (f"config file not found: {given} is neither an existing file nor "
                              f"a recipe name. Did you mean '{meant}'?")


@pytest.mark.parametrize("given", ["bert-huge", "pretrain", "xyz"])
def test_unknown_name_lists_the_recipes(given: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_recipe(given)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"config file not found: {given} is neither an existing file")
    assert all(name in message for name in list_recipes())
