"""Commands given a Hugging Face Hub name, offline, from a Hub cache laid out in the test:
finetune (a preset's name means the Hub model there), predict, pretrain's ``init_from``, and
the one-line error of a name that is not cached."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.tasks.stream import weights_source
from bertforge.tokenization import BertTokenizer
from bertforge.commands.train import pretrain
from hub_cache import COMMIT, fill_cache

REVIEWS = Path(__file__).resolve().parents[1] / "assets" / "finetune" / "reviews.csv"


@pytest.fixture
def hub(tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache holding a tiny BERT (the session's tiny vocabulary) as ``org/tiny-bert``
    and as ``bert-tiny`` (also a preset's name)."""
    source = tmp_path / "source"
    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(source, tokenizer=tokenizer)
    cache = tmp_path / "hub-cache"
    for repo in ("org/tiny-bert", "bert-tiny"):
        fill_cache(cache, repo, source)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # no local folder called org/ or bert-tiny
    return cache


def test_finetune_takes_a_preset_name_from_the_hub_and_says_so(hub, tmp_path, caplog) -> None:
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        code = main(["finetune", "--task=classification", f"--data.train={REVIEWS}",
                     f"--data.validation={REVIEWS}", "--model=bert-tiny", f"--output_dir={out}",
                     "--train.max_steps=1", "--train.global_batch_size=4",
                     "--train.micro_batch_size=4", "--precision=fp32", "--tensorboard=false"])
    assert code == 0
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32  # not the preset's 128
    assert "Hugging Face Hub model bert-tiny from the cache" in caplog.text


def test_predict_reads_a_hub_name(hub, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = main(["predict", "fill-mask", "--model", "org/tiny-bert", "--json", "--text",
                 "the [MASK] .", "--top-k", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out.splitlines()[0])["masks"][0]) == 2


def test_pretrain_init_from_a_hub_name(hub, tiny_config, tmp_path) -> None:
    cfg = tiny_config(tmp_path / "run", "--init_from=org/tiny-bert", "--train.max_steps=1")
    source = weights_source(cfg, None)
    assert source.directory == hub / "models--org--tiny-bert" / "snapshots" / COMMIT
    assert pretrain(cfg).final_checkpoint is not None


def test_pretrain_init_from_a_preset_name_takes_the_hub_model(hub, tiny_config, tmp_path) -> None:
    cfg = tiny_config(tmp_path / "run", "--init_from=bert-tiny")
    assert weights_source(cfg, None).directory == hub / "models--bert-tiny" / "snapshots" / COMMIT


def test_a_name_not_in_the_cache_offline_is_one_error_line(hub, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = main(["predict", "fill-mask", "--model", "org/absent", "--text", "the [MASK] ."])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "org/absent" in lines[0] and str(hub) in lines[0]
    assert "hf download org/absent" in lines[0]


def test_generate_reads_a_hub_name_as_its_directory(tiny_bart, tmp_path, monkeypatch) -> None:
    """The same summaries as from the directory itself: weights, tokenizer and
    generation_config.json all come from the snapshot."""
    cache = tmp_path / "hub-cache"
    fill_cache(cache, "org/tiny-bart", tiny_bart)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    texts = tmp_path / "in.txt"
    texts.write_text("the first text of a few words\nand a second one\n")
    outputs = {}
    for model in (str(tiny_bart), "org/tiny-bart"):
        out = tmp_path / f"{len(outputs)}.jsonl"
        assert main(["generate", "--model", model, "--input", str(texts), "--output",
                     str(out)]) == 0
        outputs[model] = out.read_text()
    assert outputs["org/tiny-bart"] == outputs[str(tiny_bart)]


def test_export_onnx_reads_a_hub_name(tiny, tmp_path, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    from bertforge.models import BertForSequenceClassification

    source = tmp_path / "classifier"
    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        num_labels=2)
    BertForSequenceClassification(config).save_pretrained(source, tokenizer=tokenizer)
    cache = tmp_path / "hub-cache"
    fill_cache(cache, "org/tiny-classifier", source)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    assert main(["export", "onnx", "--model", "org/tiny-classifier", "--output",
                 str(tmp_path / "onnx")]) == 0
    assert (tmp_path / "onnx" / "model.onnx").is_file()
    assert (tmp_path / "onnx" / "vocab.txt").read_text() == (source / "vocab.txt").read_text()
