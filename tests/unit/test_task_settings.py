"""A task's own settings (``embedding.*``) come from its record in ``bertforge.tasks.settings``:
the fine-tuning config is composed from the records with every key, flag and saved file as
before, and a new record is a new section without an edit of config.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bertforge import config as config_module
from bertforge.cli import resolve
from bertforge.config import FinetuneConfig, load_config, save_config
from bertforge.core.schema import config_keys, opt, run_defining_keys
from bertforge.errors import ConfigError
from bertforge.tasks.embedding_settings import EmbeddingConfig
from bertforge.tasks.registry import TASKS, get_task
from bertforge.tasks import settings as settings_module
from bertforge.tasks.settings import TASK_SETTINGS, TaskSettings, check_task_settings

# The embedding keys as they were when the section lived in config.py (order included: it is the
# order of the saved config.yaml and of --help).
EMBEDDING_KEYS = ["loss", "scale", "symmetric", "cache_chunk", "matryoshka_dims", "pooling",
                  "normalize", "query_prompt", "passage_prompt", "no_duplicates", "gather"]


def test_each_record_names_finetune_tasks_and_a_section_of_the_config() -> None:
    fields = {f.name: f for f in dataclasses.fields(FinetuneConfig)}
    for record in TASK_SETTINGS:
        for name in record.tasks:  # canonical names of tasks finetune trains
            assert get_task(name, command="finetune").name == name
        assert fields[record.key].default_factory is record.settings.load()
    assert [f.name for f in dataclasses.fields(FinetuneConfig)][-len(TASK_SETTINGS):] == [
        r.key for r in TASK_SETTINGS]  # after eval, in the records' order
    by_task = {t.name: t.settings for t in TASKS}
    assert by_task["sentence-similarity"] is by_task["text-ranking"] is TASK_SETTINGS[0]
    assert by_task["question-answering"] is None


def test_the_embedding_keys_flags_and_saved_file_are_unchanged(tmp_path: Path) -> None:
    keys = config_keys(FinetuneConfig)
    assert [k for k in keys if k.startswith("embedding")] == [
        "embedding", *(f"embedding.{k}" for k in EMBEDDING_KEYS)]
    assert {f"embedding.{k}" for k in EMBEDDING_KEYS} <= set(run_defining_keys(FinetuneConfig))
    _, cfg, _ = resolve(["finetune", "--task=embedding", "--embedding.pooling=cls",
                         "--embedding.matryoshka_dims=[16,8]", "--embedding.query_prompt=q: "])
    assert isinstance(cfg.embedding, EmbeddingConfig)
    assert (cfg.embedding.pooling, cfg.embedding.matryoshka_dims,
            cfg.embedding.query_prompt) == ("cls", [16, 8], "q: ")
    saved = save_config(cfg, tmp_path / "config.yaml")
    data = OmegaConf.to_container(OmegaConf.load(saved))
    sections = ["data", "eval", *(s.key for s in TASK_SETTINGS)]  # the records' order
    assert list(data)[-len(sections):] == sections
    assert list(data["embedding"]) == EMBEDDING_KEYS and data["embedding"]["pooling"] == "cls"
    assert load_config(FinetuneConfig, saved) == cfg
    # checked for the tasks that read the section, before their data is read; a run of
    # another task ignores it
    wrong = load_config(FinetuneConfig, None, ["--embedding.pooling=max"])
    check_task_settings(wrong, "question-answering")
    with pytest.raises(ConfigError, match=r"embedding.pooling must be one of mean, cls, last"):
        check_task_settings(wrong, "sentence-similarity")
    with pytest.raises(ConfigError, match=r"embedding.matryoshka_dims must list distinct"):
        check_task_settings(load_config(FinetuneConfig, None, [
            "--embedding.matryoshka_dims=[8,8]"]), "text-ranking")
    with pytest.raises(ConfigError, match=r"Did you mean 'embedding.pooling'\?"):
        load_config(FinetuneConfig, None, ["--embedding.poolin=cls"])


@dataclass
class ToySettings:
    size: int = opt(2, "How big.", run_defining=True, minimum=1)
    even: bool = opt(False, "Only even sizes.", run_defining=True)

    def check(self) -> None:
        if self.even and self.size % 2:
            raise ConfigError(f"toy.size must be even with toy.even, got {self.size}")


class _Loaded:
    """A stand-in for a Ref to ``ToySettings`` (which lives in this test module)."""

    def load(self) -> type:
        return ToySettings


def test_a_new_record_is_a_new_section(monkeypatch, tmp_path: Path) -> None:
    toy = TaskSettings("toy", _Loaded(), "Toy training", tasks=("text-classification",))
    monkeypatch.setattr(config_module, "TASK_SETTINGS", (*TASK_SETTINGS, toy))

    @dataclass
    @config_module._task_settings
    class Composed(config_module.RunConfig):
        task: str = opt("classification", "The task.")

    cfg = load_config(Composed, None, ["--toy.size=5", "--embedding.scale=10"])
    assert (cfg.toy.size, cfg.embedding.scale) == (5, 10.0)
    assert "toy.size" in run_defining_keys(Composed)
    assert "size: 5" in save_config(cfg, tmp_path / "c.yaml").read_text()
    monkeypatch.setattr(settings_module, "TASK_SETTINGS", (*TASK_SETTINGS, toy))
    with pytest.raises(ConfigError, match="toy.size must be >= 1"):
        check_task_settings(load_config(Composed, None, ["--toy.size=0"]), "text-classification")
    with pytest.raises(ConfigError, match="toy.size must be even"):
        check_task_settings(load_config(Composed, None, ["--toy.size=3", "--toy.even=true"]),
                            "text-classification")
    check_task_settings(load_config(Composed, None, ["--toy.size=0"]), "question-answering")


def test_importing_the_config_imports_no_torch() -> None:
    code = "import sys, bertforge.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "False"
