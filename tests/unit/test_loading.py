"""from_pretrained / save_pretrained: round trips, vocabulary padding, head rules and error messages."""

from __future__ import annotations

import argparse
import json
import logging
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from bertforge.errors import CheckpointError, ConfigError
from bertforge.models import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=16)


def spread_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        model.word_embeddings().weight[TINY["vocab_size"]:] = 0
        if hasattr(model, "cls"):
            model.cls.predictions.bias[TINY["vocab_size"]:] = 0
    return model.eval()


@pytest.fixture
def pretraining_dir(tmp_path):
    model = spread_(BertForPreTraining(BertConfig(**TINY)))
    model.save_pretrained(tmp_path / "pt")
    return tmp_path / "pt", model


def states_equal(a: torch.nn.Module, b: torch.nn.Module, prefix_b: str = "") -> None:
    sb = b.state_dict()
    for key, value in a.state_dict().items():
        assert torch.equal(value, sb[prefix_b + key]), key


def test_round_trip_is_exact_and_file_holds_real_vocab_rows(pretraining_dir) -> None:
    path, model = pretraining_dir
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]  # no temp files
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_slice("bert.embeddings.word_embeddings.weight").get_shape() == [99, 32]
        assert f.get_slice("cls.predictions.bias").get_shape() == [99]
        assert "cls.predictions.decoder.weight" not in f.keys()
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["vocab_size"] == 99
    again = BertForPreTraining.from_pretrained(path)
    assert again.bert.embeddings.word_embeddings.weight.shape == (104, 32)
    assert again.cls.predictions.decoder.weight is again.bert.embeddings.word_embeddings.weight
    states_equal(model, again)
    model.save_pretrained(path)  # overwriting an existing directory works too
    states_equal(model, BertForPreTraining.from_pretrained(path))


def test_base_prefix_is_handled_both_ways(pretraining_dir, tmp_path, caplog) -> None:
    path, model = pretraining_dir
    caplog.set_level(logging.INFO, logger="bertforge.models.hub")
    base = BertModel.from_pretrained(path)  # 'bert.' stripped, MLM/NSP heads dropped
    states_equal(base, model, prefix_b="bert.")
    assert "weights of other heads" in caplog.text and "cls.seq_relationship.weight" in caplog.text
    base.save_pretrained(tmp_path / "base")
    caplog.clear()
    heads = BertForPreTraining.from_pretrained(tmp_path / "base")  # 'bert.' added, heads fresh
    states_equal(base, heads.bert)
    assert "newly initialised" in caplog.text and "cls.predictions.transform.dense.weight" in caplog.text


def test_fine_tuning_start_initialises_new_head(pretraining_dir, caplog) -> None:
    path, model = pretraining_dir
    caplog.set_level(logging.INFO, logger="bertforge.models.hub")
    clf = BertForSequenceClassification.from_pretrained(path, num_labels=3, hidden_dropout_prob=0.0)
    assert clf.classifier.weight.shape == (3, 32) and clf.config.hidden_dropout_prob == 0.0
    assert "classifier.weight" in caplog.text and "cls.predictions.bias" in caplog.text
    states_equal(model.bert, clf.bert)
    qa = BertForQuestionAnswering.from_pretrained(path)
    assert "bert.pooler.dense.weight" not in qa.state_dict()  # QA has no pooler, like transformers


def test_missing_weight_is_listed_with_shape(pretraining_dir) -> None:
    path, _ = pretraining_dir
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["bert.encoder.layer.1.attention.self.query.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as err:
        BertForPreTraining.from_pretrained(path)
    msg = str(err.value)
    assert "model.safetensors into BertForPreTraining" in msg and "missing from the checkpoint (1)" in msg
    assert "bert.encoder.layer.1.attention.self.query.weight (model expects [32, 32])" in msg


def test_partial_head_is_an_error_not_a_fresh_init(pretraining_dir) -> None:
    path, _ = pretraining_dir
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["cls.seq_relationship.bias"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"cls.seq_relationship.bias \(model expects \[2\]\)"):
        BertForPreTraining.from_pretrained(path)


def test_unexpected_weight_is_listed(pretraining_dir) -> None:
    path, _ = pretraining_dir
    tensors = load_file(str(path / "model.safetensors"))
    tensors["bert.encoder.layer.0.adapter.weight"] = torch.zeros(4, 32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"unexpected in the checkpoint \(1\):\n\s+bert.encoder.layer.0.adapter.weight \[4, 32\]"):
        BertForPreTraining.from_pretrained(path)


def test_wrong_shapes_show_both_sides(pretraining_dir) -> None:
    path, _ = pretraining_dir
    with pytest.raises(CheckpointError) as err:
        BertForPreTraining.from_pretrained(path, intermediate_size=40)
    msg = str(err.value)
    assert "wrong shape (6):" in msg  # per layer: intermediate weight+bias, output weight
    assert "bert.encoder.layer.0.intermediate.dense.weight: checkpoint [37, 32], model expects [40, 32]" in msg
    with pytest.raises(CheckpointError, match=r"word_embeddings.weight: checkpoint \[99, 32\], model expects \[200, 32\]"):
        BertModel.from_pretrained(path, vocab_size=200)
    clf_dir = path.parent / "clf"
    BertForSequenceClassification(BertConfig(**TINY), num_labels=3).save_pretrained(clf_dir)
    with pytest.raises(CheckpointError, match=r"(?s)classifier.weight: checkpoint \[3, 32\], model expects \[5, 32\]"
                                              r".*ignore_mismatched_heads=True"):
        BertForSequenceClassification.from_pretrained(clf_dir, num_labels=5)


def test_mismatched_head_can_start_fresh(tmp_path, caplog) -> None:
    three = spread_(BertForSequenceClassification(BertConfig(**TINY), num_labels=3))
    three.save_pretrained(tmp_path)
    caplog.set_level(logging.INFO, logger="bertforge.models.hub")
    five = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5, ignore_mismatched_heads=True)
    assert five.classifier.weight.shape == (5, 32) and five.classifier.bias.abs().sum() == 0
    assert "newly initialised: classifier.weight, classifier.bias" in caplog.text
    states_equal(three.bert, five.bert)
    with pytest.raises(CheckpointError, match="intermediate.dense.weight"):  # the body stays strict
        BertForSequenceClassification.from_pretrained(tmp_path, intermediate_size=40, ignore_mismatched_heads=True)


def test_pre_layernorm_round_trip_and_mismatch(tmp_path) -> None:
    model = spread_(BertModel(BertConfig(**TINY, pre_layernorm=True)))
    model.save_pretrained(tmp_path)
    assert "bertforge_only" in json.loads((tmp_path / "config.json").read_text())
    states_equal(model, BertModel.from_pretrained(tmp_path))
    with pytest.raises(CheckpointError, match="(?s)encoder.final_layer_norm.weight.*disagree on pre_layernorm"):
        BertModel.from_pretrained(tmp_path, pre_layernorm=False)


def test_legacy_pytorch_bin_names(pretraining_dir, tmp_path) -> None:
    """Old-style file: DDP prefix, TF LayerNorm names, position_ids buffer, bias only on the decoder."""
    _, model = pretraining_dir
    legacy = {}
    for key, value in model.hf_state_dict().items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        legacy["module." + key.replace("cls.predictions.bias", "cls.predictions.decoder.bias")] = value
    legacy["module.bert.embeddings.position_ids"] = torch.arange(16)[None]
    legacy["module.cls.predictions.decoder.weight"] = legacy["module.bert.embeddings.word_embeddings.weight"]
    out = tmp_path / "legacy"
    out.mkdir()
    torch.save(legacy, out / "pytorch_model.bin")
    model.config.to_json_file(out / "config.json")
    states_equal(model, BertForPreTraining.from_pretrained(out))


def test_sharded_safetensors(pretraining_dir, tmp_path) -> None:
    path, model = pretraining_dir
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    out = tmp_path / "sharded"
    out.mkdir()
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(out / shard), metadata={"format": "pt"})
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    (out / "config.json").write_text((path / "config.json").read_text())
    states_equal(model, BertForPreTraining.from_pretrained(out))


def test_unreadable_inputs_are_user_errors(pretraining_dir, tmp_path) -> None:
    path, model = pretraining_dir
    with pytest.raises(CheckpointError, match="is not a model directory.*from_preset"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights in .*expected model.safetensors or pytorch_model.bin \(found: config.json\)"):
        BertModel.from_pretrained(path)
    torch.save({"state": model.hf_state_dict(), "args": argparse.Namespace(lr=1)}, path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"was refused: it is a pickle.*argparse.Namespace.*safetensors"):
        BertModel.from_pretrained(path)
    (path / "pytorch_model.bin").unlink()
    (path / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="damaged or incomplete"):
        BertModel.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(ConfigError, match="without config.json"):
        BertModel.from_pretrained(path)
    with pytest.raises(CheckpointError, match=r"entry 'x' is a str, not a tensor"):
        model.load_hf_state_dict({"x": "y"})


class _Tokenizer:
    def __init__(self, lower: bool) -> None:
        self.do_lower_case = lower
        self.saved_to = None

    def save(self, directory) -> None:
        self.saved_to = directory
        (directory / "vocab.txt").write_text("[PAD]\n")


def test_tokenizer_is_saved_and_casing_checked(tmp_path) -> None:
    model = BertModel(BertConfig(**TINY))
    tok = _Tokenizer(lower=True)
    model.save_pretrained(tmp_path / "a", tokenizer=tok)
    assert tok.saved_to == tmp_path / "a" and (tmp_path / "a" / "vocab.txt").is_file()
    assert BertConfig.load(tmp_path / "a").do_lower_case is True  # recorded from the tokenizer
    cased = BertModel(BertConfig(**TINY, do_lower_case=False))
    with pytest.raises(CheckpointError, match="tokenizer has do_lower_case=True but the model config says False"):
        cased.save_pretrained(tmp_path / "b", tokenizer=_Tokenizer(lower=True))


def test_a_path_that_is_no_model_directory_says_what_it_is(pretraining_dir, tmp_path) -> None:
    from bertforge.errors import ConfigError
    from bertforge.models.loading import model_directory

    pretraining_dir = pretraining_dir[0]
    assert model_directory(pretraining_dir) == pretraining_dir
    cases = {tmp_path / "missing": "does not exist; give a model directory",
             tmp_path / "file.txt": "is a file, not a model directory",
             tmp_path / "empty": "is not a model directory (no config.json)"}
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"
    for step in (2, 10):  # the newest is step 10, not "checkpoint-2" by name
        shutil.copytree(pretraining_dir, run / f"checkpoint-{step}")
    (run / "checkpoint-12.tmp-1").mkdir()  # an interrupted save: not a checkpoint
    cases[run] = ("is a training run's folder, not a model directory; give one of its "
                  f"checkpoints, e.g. the newest: {run / 'checkpoint-10'}")
    for path, words in cases.items():
        with pytest.raises(ConfigError) as err:
            model_directory(path, "--model")
        assert str(err.value).startswith(f"--model {path} {words}"), str(err.value)
