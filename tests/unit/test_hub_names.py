"""Model names from the Hugging Face Hub, without the network: a Hub cache laid out in the test
(as huggingface_hub writes it: ``models--ORG--NAME/refs``, ``blobs`` and ``snapshots`` of
symlinks), offline mode from tests/conftest.py, and a fake Hub where the online path is tested."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.models import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertforge.models import hub_names
from bertforge.models.hub_names import HubName, files_to_fetch, parse_hub_name
from bertforge.models.loading import load_model, model_directory, open_model
from bertforge.tokenization import BertTokenizer, load_tokenizer
from hub_cache import COMMIT, fill_cache

OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "film", "good", "bad", "##s"]


@pytest.fixture
def tiny_model(tmp_path: Path) -> tuple[Path, BertForPreTraining]:
    """A 2-layer, 32-wide BERT (random weights) with a WordPiece tokenizer, saved locally."""
    tokenizer = BertTokenizer(WORDS)
    config = BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    model.save_pretrained(tmp_path / "source", tokenizer=tokenizer)
    return tmp_path / "source", model


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache of the test's own (HF_HUB_CACHE), offline as the whole session."""
    folder = tmp_path / "hub-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def test_what_can_be_a_hub_name() -> None:
    assert parse_hub_name("bert-base-uncased") == HubName("bert-base-uncased")
    assert parse_hub_name("google-bert/bert-base-uncased") == HubName("google-bert/bert-base-uncased")
    assert parse_hub_name("org/name@v1.0") == HubName("org/name", "v1.0")
    assert parse_hub_name("Qwen/Qwen2.5-0.5B") == HubName("Qwen/Qwen2.5-0.5B")
    for path in ("runs/phase1/checkpoint-10", "./model", "/abs/model", "config.json",
                 "vocab.txt", "org/name@", "a--b", "a..b", "-x", "has space", "x" * 97):
        assert parse_hub_name(path) is None, path


def test_safetensors_are_fetched_rather_than_pickles_and_only_at_the_top_level() -> None:
    listed = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5",
              "vocab.txt", "tokenizer.json", "onnx/model.safetensors", "README.md",
              "generation_config.json", "model.fp16.safetensors"]
    assert sorted(files_to_fetch(listed)) == ["config.json", "generation_config.json",
                                              "model.safetensors", "tokenizer.json", "vocab.txt"]
    pickled = ["config.json", "pytorch_model-00001-of-00002.bin",
               "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json", "vocab.txt"]
    assert sorted(files_to_fetch(pickled)) == sorted(pickled)
    assert files_to_fetch(pickled, weights=False) == ["config.json", "vocab.txt"]


def test_from_pretrained_and_load_tokenizer_read_a_cached_hub_name(tiny_model, cache) -> None:
    source, model = tiny_model
    snapshot = fill_cache(cache, "org/tiny-bert", source)
    loaded = BertForPreTraining.from_pretrained("org/tiny-bert")
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    clf = BertForSequenceClassification.from_pretrained("org/tiny-bert", num_labels=3)
    assert clf.classifier.out_features == 3
    assert load_tokenizer("org/tiny-bert").vocab_size == len(WORDS)
    assert model_directory("org/tiny-bert") == snapshot


def test_a_revision_after_at_picks_that_snapshot(tiny_model, cache, tmp_path) -> None:
    source, _ = tiny_model
    fill_cache(cache, "org/tiny-bert", source)
    changed = tmp_path / "changed"
    BertForPreTraining(BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32)).save_pretrained(changed)
    fill_cache(cache, "org/tiny-bert", changed, commit=OTHER_COMMIT, refs=("v2",))
    assert open_model("org/tiny-bert").config.num_hidden_layers == 2
    assert open_model("org/tiny-bert@v2").config.num_hidden_layers == 1
    assert open_model(f"org/tiny-bert@{OTHER_COMMIT}").directory.name == OTHER_COMMIT


def test_presets_are_fresh_shapes_only_where_no_weights_are_needed(tiny_model, cache,
                                                                    caplog) -> None:
    """bert-tiny is a preset: pretraining's model keeps it; where weights are needed the
    same name is a Hub name (here: a cached repo called bert-tiny). The log says which."""
    source, model = tiny_model
    snapshot = fill_cache(cache, "bert-tiny", source)
    preset = open_model("bert-tiny")
    assert preset.directory is None and preset.config.hidden_size == 128
    with caplog.at_level(logging.INFO):
        load_model(preset, "base")
        open_model("bert-tiny", weights=True)
    assert "model bert-tiny: a fresh BERT model from the bertforge preset" in caplog.text
    assert f"model=bert-tiny: Hugging Face Hub model bert-tiny from the cache, {snapshot}" in (
        caplog.text)
    hub = open_model("bert-tiny", weights=True)
    assert hub.directory == snapshot and hub.config.hidden_size == 32
    loaded = load_model(hub, "pretraining")
    assert torch.equal(loaded.state_dict()["cls.predictions.bias"],
                       model.state_dict()["cls.predictions.bias"])


def test_an_existing_local_path_wins_over_a_hub_name(tiny_model, cache, tmp_path,
                                                     monkeypatch) -> None:
    source, _ = tiny_model
    fill_cache(cache, "org/tiny-bert", source)
    local = tmp_path / "work" / "org" / "tiny-bert"
    BertForPreTraining(BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)).save_pretrained(local)
    monkeypatch.chdir(tmp_path / "work")
    assert open_model("org/tiny-bert", weights=True).config.hidden_size == 16
    assert model_directory("org/tiny-bert") == Path("org/tiny-bert")
    assert BertForPreTraining.from_pretrained("org/tiny-bert").config.hidden_size == 16


def one_line_error(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_offline_without_the_model_in_the_cache_is_one_line_naming_what_to_do(cache) -> None:
    calls = {
        "--model org/missing": lambda: model_directory("org/missing"),
        "model=org/missing": lambda: open_model("org/missing", weights=True),
        "from_pretrained('org/missing')": lambda: BertForPreTraining.from_pretrained("org/missing"),
        "tokenizer org/missing": lambda: load_tokenizer("org/missing"),
    }
    for start, call in calls.items():
        message = one_line_error(call)
        assert message.startswith(f"{start} is not a local path"), message
        assert "org/missing" in message and str(cache) in message, message
        assert "hf download org/missing" in message, message
        assert "local model directory" in message and "HF_HUB_OFFLINE=1" in message, message


def test_a_preset_name_needing_weights_says_it_is_a_preset(cache) -> None:
    message = one_line_error(lambda: open_model("bert-base-uncased", weights=True))
    assert "hf download bert-base-uncased" in message
    assert "bert-base-uncased is also a bertforge preset" in message
    assert "not a model directory" in message
    typo = one_line_error(lambda: open_model("bert-base-uncasd"))
    assert "did you mean the preset 'bert-base-uncased'" in typo


def test_a_cached_config_without_weights_is_not_enough_offline(tiny_model, cache) -> None:
    source, _ = tiny_model
    snapshot = fill_cache(cache, "org/tiny-bert", source, skip=("model.safetensors",))
    message = one_line_error(lambda: model_directory("org/tiny-bert"))
    assert f"is cached in {snapshot} without weights" in message
    assert load_tokenizer("org/tiny-bert").vocab_size == len(WORDS)  # needs no weights


def test_the_test_session_never_reaches_the_hub() -> None:
    """tests/conftest.py: offline everywhere, so a lookup fails at once instead of waiting
    on the network."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import OfflineModeIsEnabled

    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE
    assert hub_names.hub_offline()
    with pytest.raises(OfflineModeIsEnabled):
        HfApi().model_info("google-bert/bert-base-uncased")


class FakeHub:
    """``HfApi.list_repo_files`` and ``snapshot_download`` over local folders (repo -> files)."""

    def __init__(self, repos: dict[str, Path], cache: Path) -> None:
        self.repos, self.cache, self.fetched = repos, cache, []

    def list_files(self, repo_id: str, revision: str | None = None, **_) -> list[str]:
        from huggingface_hub.utils import RepositoryNotFoundError

        if repo_id not in self.repos:
            error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
            Exception.__init__(error, f"404 Client Error: {repo_id}")
            raise error
        return sorted(p.name for p in self.repos[repo_id].iterdir()) + ["onnx/model.onnx"]

    def snapshot_download(self, repo_id: str, *, revision, cache_dir, allow_patterns) -> str:
        assert Path(cache_dir) == self.cache
        self.fetched = sorted(allow_patterns)
        skip = tuple(p.name for p in self.repos[repo_id].iterdir() if p.name not in allow_patterns)
        return str(fill_cache(self.cache, repo_id, self.repos[repo_id], skip=skip))


def test_online_a_missing_model_is_downloaded_once_then_read_from_the_cache(
        tiny_model, cache, tmp_path, monkeypatch) -> None:
    import huggingface_hub

    source, model = tiny_model
    torch.save(model.hf_state_dict(), source / "pytorch_model.bin")  # not fetched: safetensors are
    hub = FakeHub({"org/tiny-bert": source}, cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", hub.list_files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    loaded = BertForPreTraining.from_pretrained("org/tiny-bert")
    assert torch.equal(loaded.state_dict()["cls.predictions.bias"],
                       model.state_dict()["cls.predictions.bias"])
    assert hub.fetched == ["config.json", "model.safetensors", "special_tokens_map.json",
                           "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    hub.fetched = []
    assert open_model("org/tiny-bert", weights=True).directory.name == COMMIT
    assert hub.fetched == []  # cache first: no second download
    message = one_line_error(lambda: model_directory("org/nobody"))
    assert message == ("--model org/nobody is not a local path, and the Hugging Face Hub has no "
                       "model org/nobody (if it is private, log in with `hf auth login`)")
