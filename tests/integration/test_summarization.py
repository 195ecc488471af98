"""Summarization end to end: a tiny BART fine-tuned with `task: summarization` learns a lead task
(the summary is the article's first sentence), writes predictions, eval_results.json and its
generation settings; `generate`, `predict` and `evaluate summarization` agree with the run, and
transformers loads the fine-tuned directory and generates the same tokens from the saved
generation_config.json."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.config import FinetuneConfig, load_config
from bertforge.errors import ConfigError
from bertforge.commands.train import finetune

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"


def lead_rows(sentences: list[str], n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        picked = rng.sample(sentences, 3)
        rows.append({"id": f"{seed}-{i}", "article": " ".join(picked), "summary": picked[0]})
    return rows


@pytest.fixture(scope="module")
def lead(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh tiny BART with a BPE tokenizer of the corpus, and lead-sentence data: articles of
    three corpus sentences in random order, the first one as the summary (dev articles are
    combinations not seen in training)."""
    from bertforge.tokenization.bpe import BpeTokenizer
    from bertforge.data.segment import split_sentences
    from bertforge.models.bart import BartConfig, BartForConditionalGeneration
    from bertforge.tokenization.training import train_bpe

    root = tmp_path_factory.mktemp("lead")
    train_bpe([CORPUS], vocab_size=400, output=root / "bpe", min_frequency=1, progress=False)
    tok = BpeTokenizer.from_pretrained(root / "bpe")
    config = BartConfig(vocab_size=tok.vocab_size, d_model=64, encoder_layers=2,
                        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
                        dropout=0.0, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
                        eos_token_id=tok.eos_id, decoder_start_token_id=tok.eos_id,
                        forced_bos_token_id=tok.bos_id, forced_eos_token_id=tok.eos_id)
    torch.manual_seed(0)
    BartForConditionalGeneration(config).save_pretrained(root / "base", tokenizer=tok)
    text = CORPUS.read_text(encoding="utf-8")
    sentences = [s for line in text.splitlines() for s in split_sentences(line)
                 if 3 <= len(s.split()) <= 14]
    for name, n, seed in (("train", 256, 0), ("dev", 24, 1)):
        rows = lead_rows(sentences, n, seed)
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "base": root / "base", "train": root / "train.jsonl",
            "dev": root / "dev.jsonl"}


def run_config(lead: dict[str, Path], out: Path, *extra: str) -> FinetuneConfig:
    return load_config(FinetuneConfig, None, [
        "--task=summarization", f"--model={lead['base']}", f"--data.train={lead['train']}",
        f"--data.validation={lead['dev']}", f"--output_dir={out}", "--resume=none",
        "--train.max_steps=700", "--train.global_batch_size=16", "--train.micro_batch_size=16",
        "--train.log_every=50", "--optim.lr=3e-3", "--optim.warmup=0.05", "--precision=fp32",
        "--tensorboard=false", "--checkpoint.every=10000", "--eval.max_length=48",
        "--eval.batch_size=8", *extra])


def test_lead_task_is_learned_and_every_command_agrees(tmp_path, lead, capsys):
    out = tmp_path / "run"
    untrained = finetune(run_config(lead, tmp_path / "untrained", "--train.max_steps=1"))
    result = finetune(run_config(lead, out, "--train.label_smoothing=0.05"))
    scores = result.validation
    assert scores["rouge1"] > 60 and scores["rouge1"] > untrained.validation["rouge1"] + 40
    assert json.loads((out / "eval_results.json").read_text()) == pytest.approx(scores)
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    dev = [json.loads(x) for x in lead["dev"].read_text().splitlines()]
    assert [r["id"] for r in rows] == [d["id"] for d in dev]
    saved = json.loads((out / "generation_config.json").read_text())
    assert saved["max_length"] == 48 and saved["forced_bos_token_id"] == 0
    assert json.loads((out / "config.json").read_text())["finetuning_task"] == "summarization"

    # `evaluate summarization` on the run's predictions gives the run's scores.
    capsys.readouterr()  # drop the runs' summaries
    assert main(["evaluate", "summarization", "--predictions", str(out / "predictions.jsonl"),
                 "--references", str(lead["dev"])]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rouge1"] == pytest.approx(scores["rouge1"]) and printed["count"] == len(dev)

    # `generate` with the saved settings reproduces the run's predictions.
    assert main(["generate", "--model", str(out), "--input", str(lead["dev"]),
                 "--output", str(tmp_path / "gen.jsonl"), "--batch-size", "5",
                 "--device", "cpu"]) == 0
    generated = [json.loads(x) for x in (tmp_path / "gen.jsonl").read_text().splitlines()]
    assert generated == rows

    # `predict` summarizes with the run's task and settings.
    assert main(["predict", "--model", str(out), "--data", str(lead["dev"]),
                 "--output", str(tmp_path / "pred.jsonl")]) == 0
    assert [json.loads(x) for x in (tmp_path / "pred.jsonl").read_text().splitlines()] == rows
    # ... and its generation flags override the run's.
    assert main(["predict", "--model", str(out), "--data", str(lead["dev"]), "--output",
                 str(tmp_path / "short.jsonl"), "--max-length", "4", "--early-stopping",
                 "true"]) == 0
    short = [json.loads(x) for x in (tmp_path / "short.jsonl").read_text().splitlines()]
    assert all(len(r["summary"].split()) <= 4 for r in short) and short != rows

    # transformers loads the directory whole and, with the saved generation_config.json,
    # generates the same tokens as bertforge.
    transformers = pytest.importorskip("transformers")
    from bertforge.tokenization.bpe import BpeTokenizer
    from bertforge.models.generation import generate
    from bertforge.models.bart import BartForConditionalGeneration

    hf, info = transformers.BartForConditionalGeneration.from_pretrained(
        out, output_loading_info=True)
    assert not any(info.values())
    ours = BartForConditionalGeneration.from_pretrained(out)
    tok = BpeTokenizer.from_pretrained(out)
    ids = torch.tensor(tok.encode_truncated([dev[0]["article"]], 128))
    with torch.no_grad():
        theirs = hf.eval().generate(input_ids=ids, attention_mask=torch.ones_like(ids))
    mine = generate(ours, ids, torch.ones_like(ids), ours.generation_config)
    assert theirs.tolist() == mine.tolist()


def test_a_bert_model_cannot_summarize_and_a_bart_model_cannot_do_squad(tmp_path, lead, tiny):
    from bertforge.models import BertConfig, BertForMaskedLM

    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig.from_preset("bert-tiny", vocab_size=99)).save_pretrained(bert)
    with pytest.raises(ConfigError, match="is a BERT model but task summarization needs an encoder-decoder model"):
        finetune(run_config(lead, tmp_path / "a", f"--model={bert}"))
    with pytest.raises(ConfigError, match="is a BART model but task squad needs an encoder-only model"):
        finetune(run_config(lead, tmp_path / "b", "--task=squad"))


def test_generate_without_any_length_limit_is_an_error(tmp_path, lead, capsys):
    """The base model has no generation_config.json: no silent 20-token limit, an error that
    says what to pass; with --max-length it generates."""
    args = ["generate", "--model", str(lead["base"]), "--input", str(lead["dev"]),
            "--output", str(tmp_path / "out.jsonl"), "--device", "cpu"]
    assert main(args) == 2
    assert "no generation_config.json and no maximum length" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
    assert main(args + ["--max-length", "6", "--num-beams", "2"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 24 and all(isinstance(r["summary"], str) for r in rows)
