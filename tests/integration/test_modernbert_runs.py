"""The ModernBERT family through the commands users run: a tokenizer trained with `vocab --type
modernbert`, MLM data at 30% from `prepare --objective none`, pretraining on the one runner
(bitwise resume, a checkpoint transformers loads with the same logits), continued pretraining of
a ModernBERT and of a BERT directory with the `continue-mlm` recipe, fine-tuning for every
encoder task, and the pipelines on the results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.config import FinetuneConfig, PretrainConfig, load_config
from bertforge.data.prepare import prepare
from bertforge.inference.pipelines import load_pipeline
from bertforge.recipes import resolve_recipe
from bertforge.commands.train import finetune
from bertforge.commands.train import pretrain
from bertforge.tokenization import ModernBpeTokenizer, load_tokenizer
from bertforge.tokenization.training import train_modern_bpe

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
CORPUS = ASSETS / "tiny_corpus.txt"
TINY = "debug/modernbert-tiny-cpu"
SMALL_RUN = ("--train.global_batch_size=8", "--train.micro_batch_size=4", "--train.log_every=1",
             "--train.eval_every=0", "--train.eval_batches=2", "--tensorboard=false")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLM data (30% masking, sequences of at most 64 tokens) with a ModernBERT tokenizer."""
    root = tmp_path_factory.mktemp("modern")
    train_modern_bpe([CORPUS], 600, root / "tok", progress=False)
    prepare([CORPUS], vocab=root / "tok", output=root / "data", max_seq_length=64,
            objective="none", masked_lm_prob=0.3, validation_fraction=0.2, workers=1,
            progress=False)
    return root / "data"


def tiny_run(data: Path, out: Path, *extra: str) -> PretrainConfig:
    return load_config(PretrainConfig, resolve_recipe(TINY),
                       [f"--data.path={data}", f"--output_dir={out}", *SMALL_RUN, *extra])


@pytest.fixture(scope="module")
def pretrained(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("modern-run")
    result = pretrain(tiny_run(data, out, "--train.max_steps=4", "--checkpoint.every=2",
                               "--checkpoint.keep=0"))
    assert result.step == 4
    return out


def weights(checkpoint: Path) -> bytes:
    return (checkpoint / "model.safetensors").read_bytes()


def test_pretraining_is_mlm_at_30_percent_and_resumes_bitwise(data, pretrained, tmp_path,
                                                              run_metrics) -> None:
    config = json.loads((pretrained / "checkpoint-4" / "config.json").read_text())
    assert config["model_type"] == "modernbert"
    assert config["architectures"] == ["ModernBertForMaskedLM"]
    tok = load_tokenizer(pretrained / "checkpoint-4")
    assert isinstance(tok, ModernBpeTokenizer)
    assert (config["pad_token_id"], config["cls_token_id"], config["sep_token_id"]) == (
        tok.pad_id, tok.cls_id, tok.sep_id)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    import shutil
    shutil.copytree(pretrained / "checkpoint-2", resumed / "checkpoint-2")
    result = pretrain(tiny_run(data, resumed, "--train.max_steps=4", "--checkpoint.every=2",
                               "--checkpoint.keep=0"))
    assert result.step == 4
    assert weights(resumed / "checkpoint-4") == weights(pretrained / "checkpoint-4")
    assert run_metrics(resumed) == [r for r in run_metrics(pretrained) if r["step"] > 2]


def test_transformers_loads_the_checkpoint_with_the_same_logits(pretrained) -> None:
    transformers = pytest.importorskip("transformers")
    from bertforge.models import ModernBertForMaskedLM

    path = pretrained / "checkpoint-4"
    ours = ModernBertForMaskedLM.from_pretrained(path).eval()
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(
        path, attn_implementation="eager").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = hf_tok(["the first text of a few words", "a second"], padding=True,
                   return_tensors="pt")
    assert batch["input_ids"].tolist() == load_tokenizer(path)(
        ["the first text of a few words", "a second"], padding=True)["input_ids"]
    with torch.no_grad():
        a = ours(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        b = theirs(**batch).logits
    real = batch["attention_mask"].bool()  # what a padding position "predicts" is nobody's
    assert (a[real] - b[real]).abs().max().item() < 1e-4


def test_continue_mlm_from_a_modernbert_directory(data, pretrained, tmp_path, capsys) -> None:
    out = tmp_path / "continued"
    assert main(["pretrain", "--config", "continue-mlm",
                 f"--model={pretrained / 'checkpoint-4'}", f"--data.path={data}",
                 f"--output_dir={out}", "--train.max_steps=2", *SMALL_RUN]) == 0
    assert json.loads((out / "checkpoint-2" / "config.json").read_text())[
        "model_type"] == "modernbert"
    assert weights(out / "checkpoint-2") != weights(pretrained / "checkpoint-4")
    assert main(["pretrain", "--config", "continue-mlm", f"--data.path={data}"]) == 2
    assert "config key 'model' must be set" in capsys.readouterr().err


def test_continue_mlm_from_a_bert_directory_with_its_own_vocabulary(tiny, tmp_path) -> None:
    from bertforge.models import BertConfig, BertForPreTraining
    from bertforge.tokenization import BertTokenizer

    bert = tmp_path / "bert"
    tok = BertTokenizer.from_file(tiny.vocab)
    BertForPreTraining(BertConfig(vocab_size=tok.vocab_size, hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
                       ).save_pretrained(bert, tokenizer=tok)
    prepare([CORPUS], vocab=bert, output=tmp_path / "data", max_seq_length=32,
            objective="none", workers=1, progress=False)
    out = tmp_path / "continued"
    assert main(["pretrain", "--config", "continue-mlm", f"--model={bert}",
                 f"--data.path={tmp_path / 'data'}", f"--output_dir={out}",
                 "--train.max_steps=2", *SMALL_RUN]) == 0
    config = json.loads((out / "checkpoint-2" / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForMaskedLM"]


TASKS = {
    "mrpc": ["--task=glue", "--data.task_name=mrpc", f"--data.train={ASSETS}/finetune/mrpc.tsv",
             f"--data.validation={ASSETS}/finetune/mrpc.tsv"],
    "squad": ["--task=squad", f"--data.train={ASSETS}/squad/v1_sample.json",
              f"--data.validation={ASSETS}/squad/v1_sample.json", "--data.max_seq_length=64",
              "--data.doc_stride=16", "--data.max_query_length=16"],
    "conll": ["--task=token-classification", f"--data.train={ASSETS}/finetune/conll.txt",
              f"--data.validation={ASSETS}/finetune/conll.txt"],
    "swag": ["--task=swag", f"--data.train={ASSETS}/finetune/swag_train.csv",
             f"--data.validation={ASSETS}/finetune/swag_train.csv"],
}


@pytest.mark.parametrize("task", sorted(TASKS))
def test_fine_tuning_every_encoder_task_and_its_pipeline(task, pretrained, tmp_path) -> None:
    out = tmp_path / task
    cfg = load_config(FinetuneConfig, None, [
        *TASKS[task], f"--model={pretrained / 'checkpoint-4'}", f"--output_dir={out}",
        "--train.max_steps=2", "--train.global_batch_size=4", "--train.micro_batch_size=2",
        "--precision=fp32", "--tensorboard=false"])
    result = finetune(cfg)
    assert result.validation and json.loads((out / "config.json").read_text())[
        "model_type"] == "modernbert"
    if task == "squad":
        answer = load_pipeline(out)({"question": "who?", "context": "Ada wrote the note."})
        assert set(answer) >= {"answer", "score", "start", "end"}
    elif task == "mrpc":
        (label,) = [load_pipeline(out)("a sentence about numbers")]
        assert label["label"] in ("0", "1")
    elif task == "conll":
        assert isinstance(load_pipeline(out)("Ada worked in London"), (list, dict))


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_train_as_one_process_with_accumulation(parallel, data, pretrained, tmp_path,
                                                          child_env, run_metrics) -> None:
    """DDP and FSDP2 on two gloo ranks (one micro-batch of 4 each) against the single-process
    run of the module (two micro-batches of 4): the same weights up to float-addition order."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from ranks import assert_lines_close, assert_weights_close, torchrun

    out = tmp_path / parallel
    torchrun(["--config", TINY, f"--data.path={data}", f"--output_dir={out}", *SMALL_RUN,
              "--train.micro_batch_size=4", "--train.max_steps=4", "--checkpoint.every=2",
              "--checkpoint.keep=0", *(["--train.fsdp=true"] if parallel == "fsdp" else [])],
             child_env, tmp_path)
    assert_weights_close(out / "checkpoint-4", pretrained / "checkpoint-4")
    assert_lines_close(run_metrics(out), run_metrics(pretrained))


@pytest.mark.parametrize("precision, least", [("bf16", 0.99), ("int8", 0.95)])
def test_modernbert_embeds_in_bf16_and_int8(pretrained, precision, least) -> None:
    """Both inference precisions run ModernBERT's layers (fused QKV, GLU feed-forward,
    windowed attention) and keep its vectors near fp32's (a barely trained model: loose
    bounds; docs/precision.md measures real ones)."""
    texts = ["the library reads a file and returns its lines.", "a short text."]
    model = pretrained / "checkpoint-4"
    want = torch.tensor([r["embedding"] for r in load_pipeline(
        model, "feature-extraction", precision="fp32")(texts)])
    pipe = load_pipeline(model, "feature-extraction", precision=precision)
    got = torch.tensor([r["embedding"] for r in pipe(texts)])
    assert pipe.precision.name == precision
    assert torch.nn.functional.cosine_similarity(got, want).min() > least
