"""End-to-end fine-tuning runs of a tiny BERT on the small samples in tests/assets, one per task:
the outputs other tools rely on (eval_results.json keys, predictions files, an HF directory that
transformers loads whole and computes the same logits with), predict == evaluation's
predictions, exact resume, --seeds, and the command's user errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertforge.train.loop
from bertforge.cli import main
from bertforge.config import FinetuneConfig, load_config
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.commands.train import finetune
from bertforge.tokenization import BertTokenizer

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
SQUAD_V1, SQUAD_V2 = ASSETS / "squad" / "v1_sample.json", ASSETS / "squad" / "v2_sample.json"
MRPC, REVIEWS = ASSETS / "finetune" / "mrpc.tsv", ASSETS / "finetune" / "reviews.csv"
STSB, SWAG = ASSETS / "finetune" / "stsb.tsv", ASSETS / "finetune" / "swag_train.csv"
CONLL = ASSETS / "finetune" / "conll.txt"

# task args, the metric keys eval_results.json must hold, the main predictions file, the
# transformers auto class that must load the result
CASES = {
    "squad-v1": (["--task=squad", f"--data.train={SQUAD_V1}", f"--data.validation={SQUAD_V1}",
                  "--data.max_seq_length=64", "--data.doc_stride=16", "--data.max_query_length=16"],
                 ["exact_match", "f1"], "predictions.json", "AutoModelForQuestionAnswering"),
    "squad-v2": (["--task=squad", f"--data.train={SQUAD_V2}", f"--data.validation={SQUAD_V2}",
                  "--data.max_seq_length=64", "--data.doc_stride=16", "--data.max_query_length=16"],
                 ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                  "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh",
                  "best_f1", "best_f1_thresh"], "predictions.json", "AutoModelForQuestionAnswering"),
    "mrpc": (["--task=glue", "--data.task_name=mrpc", f"--data.train={MRPC}",
              f"--data.validation={MRPC}"], ["accuracy", "f1"], "predictions.jsonl",
             "AutoModelForSequenceClassification"),
    "stsb": (["--task=glue", "--data.task_name=stsb", f"--data.train={STSB}",
              f"--data.validation={STSB}"], ["pearson", "spearmanr"], "predictions.jsonl",
             "AutoModelForSequenceClassification"),
    "reviews": (["--task=classification", f"--data.train={REVIEWS}",
                 f"--data.validation={REVIEWS}"], ["accuracy", "f1_macro"], "predictions.jsonl",
                "AutoModelForSequenceClassification"),
    "swag": (["--task=swag", f"--data.train={SWAG}", f"--data.validation={SWAG}"], ["accuracy"],
             "predictions.jsonl", "AutoModelForMultipleChoice"),
    "conll": (["--task=token-classification", f"--data.train={CONLL}",
               f"--data.validation={CONLL}"], ["precision", "recall", "f1", "accuracy"],
              "predictions.jsonl", "AutoModelForTokenClassification"),
}


@pytest.fixture(scope="session")
def tiny_bert(tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide pretrained-model directory (random weights) with its tokenizer."""
    directory = tmp_path_factory.mktemp("tiny_bert")
    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def args(model: Path, out: Path, case: str, *more: str) -> list[str]:
    return [*CASES[case][0], f"--model={model}", f"--output_dir={out}", "--train.max_steps=3",
            "--train.global_batch_size=4", "--train.micro_batch_size=2", "--train.log_every=1",
            "--precision=fp32", "--tensorboard=false", "--eval.batch_size=3", *more]


def run(model: Path, out: Path, case: str, *more: str):
    return finetune(load_config(FinetuneConfig, None, args(model, out, case, *more)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_task_writes_its_outputs_and_an_hf_model(case: str, tiny_bert: Path,
                                                       tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out = tmp_path / case
    result = run(tiny_bert, out, case)
    _, keys, predictions, auto = CASES[case]
    results = json.loads((out / "eval_results.json").read_text())
    assert list(results)[:len(keys)] == keys and results == pytest.approx(result.validation)
    assert (out / predictions).is_file() and (out / "checkpoint-3").is_dir()
    if case == "squad-v2":
        assert {"nbest_predictions.json", "null_odds.json"} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"]
    if case in ("mrpc", "reviews", "conll"):
        assert set(config["label2id"]) == set(config["id2label"].values())
    hf, info = getattr(transformers, auto).from_pretrained(out, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    # Same logits from transformers and from bertforge's reloaded model on a real batch.
    from bertforge.tasks.registry import build_task
    from bertforge.tasks.finetuning import unwrap
    from bertforge.train.distributed import init_distributed

    cfg = load_config(FinetuneConfig, None, args(out, tmp_path / "again", case))
    task = build_task(cfg, init_distributed())
    ours = unwrap(task.build_model(None)).eval()
    features = task.features.evaluation.features
    batch = features.collate(torch.arange(len(features)).numpy())
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        mine, theirs = ours(**inputs), hf.eval()(**inputs)
    name = "start_logits" if "squad" in case else "logits"
    torch.testing.assert_close(getattr(mine, name), getattr(theirs, name), atol=1e-5, rtol=1e-4)


def test_predict_equals_the_evaluation_predictions(tiny_bert: Path, tmp_path: Path) -> None:
    for case, data in (("squad-v2", SQUAD_V2), ("mrpc", MRPC), ("conll", CONLL)):
        out = tmp_path / case
        run(tiny_bert, out, case)
        name = CASES[case][2]
        target = tmp_path / f"{case}-{name}"
        assert main(["predict", "--model", str(out), "--data", str(data), "--output",
                     str(target)]) == 0
        assert target.read_text() == (out / name).read_text()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".predict")] == []


def test_evaluate_squad_command_matches_the_run(tiny_bert: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "v2"
    result = run(tiny_bert, out, "squad-v2")
    capsys.readouterr()
    assert main(["evaluate", "squad", "--data", str(SQUAD_V2), "--predictions",
                 str(out / "predictions.json"), "--na-probs", str(out / "null_odds.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    # The run scores its own thresholded predictions; the official threshold (1.0) on null odds
    # can only blank more answers, and the best-threshold search is the same walk.
    for key in ("total", "HasAns_total", "NoAns_total", "best_f1", "best_exact"):
        assert printed[key] == pytest.approx(result.validation[key])


def test_resume_after_preemption_equals_an_uninterrupted_run(
        tiny_bert: Path, tmp_path: Path, monkeypatch, stop_after) -> None:
    full = run(tiny_bert, tmp_path / "a", "mrpc", "--train.max_steps=6", "--checkpoint.every=2")
    monkeypatch.setattr(bertforge.train.loop, "PreemptionFlag", stop_after(3))
    first = run(tiny_bert, tmp_path / "b", "mrpc", "--train.max_steps=6", "--checkpoint.every=2")
    assert first.preempted and first.step == 3
    monkeypatch.undo()
    second = run(tiny_bert, tmp_path / "b", "mrpc", "--train.max_steps=6", "--checkpoint.every=2")
    assert second.step == 6 and second.validation == full.validation
    assert ((tmp_path / "b" / "model.safetensors").read_bytes()
            == (tmp_path / "a" / "model.safetensors").read_bytes())


@pytest.mark.parametrize("case", ["squad-v1", "mrpc", "swag", "conll"])
def test_unpadded_training_equals_padded(case: str, tiny_bert: Path, tmp_path: Path,
                                         monkeypatch) -> None:
    """train.unpad (the default) runs the encoder on real tokens only; without dropout, the
    trained weights and the scores equal a padded run's up to float rounding (SQuAD's span loss
    leaves padding out in both)."""
    import bertforge.models.bert as bert
    import bertforge.speed as rows  # the partial last layer's encoder pass (classifiers)

    model = tmp_path / "nodrop"
    shutil.copytree(tiny_bert, model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    layouts = []
    real = bert.batch_layout
    for module in (bert, rows):
        monkeypatch.setattr(module, "batch_layout", lambda *a, **k: layouts.append(
            type(out := real(*a, **k)).__name__) or out)
    unpadded = run(model, tmp_path / "unpadded", case)
    assert "TokenLayout" in layouts and "RowLayout" not in layouts  # it did run unpadded
    layouts.clear()
    padded = run(model, tmp_path / "padded", case, "--train.unpad=false")
    assert "TokenLayout" not in layouts
    assert unpadded.validation == pytest.approx(padded.validation, rel=1e-4, abs=1e-6)
    ours = load_file(tmp_path / "unpadded" / "model.safetensors")
    for name, tensor in load_file(tmp_path / "padded" / "model.safetensors").items():
        torch.testing.assert_close(ours[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def test_epochs_set_the_run_length(tiny_bert: Path, tmp_path: Path) -> None:
    # 3 examples, global batch 2: 2 steps per epoch (the last batch is completed from the
    # epoch's start), so 1.5 epochs are 3 steps.
    result = finetune(load_config(FinetuneConfig, None, [
        a for a in args(tiny_bert, tmp_path, "reviews") if not a.startswith("--train.max_steps")
    ] + ["--train.epochs=1.5", "--train.global_batch_size=2"]))
    assert result.step == 3


def test_seeds_report_each_run_and_the_median(tiny_bert: Path, tmp_path: Path) -> None:
    assert main(["finetune", *args(tiny_bert, tmp_path, "reviews"), "--seeds", "1,2,3"]) == 0
    report = json.loads((tmp_path / "seeds.json").read_text())
    accuracies = [report["runs"][s]["accuracy"] for s in ("1", "2", "3")]
    assert report["seeds"] == [1, 2, 3]
    assert report["median"]["accuracy"] == sorted(accuracies)[1]
    assert all((tmp_path / f"seed-{s}" / "eval_results.json").is_file() for s in (1, 2, 3))


def test_evaluate_only_without_training_data(tiny_bert: Path, tmp_path: Path) -> None:
    trained = tmp_path / "trained"
    run(tiny_bert, trained, "mrpc")
    result = finetune(load_config(FinetuneConfig, None, [
        "--task=glue", "--data.task_name=mrpc", f"--model={trained}",
        f"--data.validation={MRPC}", f"--output_dir={tmp_path / 'eval'}"]))
    assert result.validation == pytest.approx(
        json.loads((trained / "eval_results.json").read_text()))
    # In bf16 an evaluation-only model stores its linear weights in bf16 once (what autocast
    # would give each batch); the predictions stay those of fp32 here.
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    cfg = load_config(FinetuneConfig, None, [
        "--task=glue", "--data.task_name=mrpc", f"--model={trained}", "--precision=bf16",
        f"--data.validation={MRPC}", f"--output_dir={tmp_path / 'eval-bf16'}"])
    model, precision = build_task(cfg, init_distributed()).evaluation_model()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert precision.name == "bf16" and {m.weight.dtype for m in linears} == {torch.bfloat16}
    assert finetune(cfg).validation["accuracy"] == result.validation["accuracy"]


def test_multiple_choice_counts_examples_not_choices(tiny_bert: Path, tmp_path: Path) -> None:
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    task = build_task(load_config(FinetuneConfig, None, args(tiny_bert, tmp_path, "swag")),
                      init_distributed())
    batch = next(iter(task.train))
    assert batch["input_ids"].shape[:2] == (2, 4)  # (B, C, S)
    out = task.loss(task.build_model(None), batch)
    assert out.sequences == 2 and int(out.tokens) == int(batch["attention_mask"].sum())


@pytest.mark.parametrize("extra, message", [
    (["--task=glue", "--data.task_name=mrcp", f"--data.train={MRPC}"],
     "unknown GLUE task 'mrcp'"),
    (["--task=glue", f"--data.train={MRPC}"], "task=glue needs data.task_name"),
    (["--task=squad", f"--data.train={MRPC}"], "mrpc.tsv"),
    (["--task=classification", f"--data.validation={REVIEWS}"], "no data.train was given"),
    (["--task=swag"], "set data.train"),
    (["--task=classification", "--data.train=/nonexistent.csv"], "/nonexistent.csv"),
    (["--task=squad", f"--data.train={SQUAD_V1}", "--data.max_seq_length=80"],
     "exceeds the model's 64 positions"),
])
def test_user_errors_are_one_line(extra: list[str], message: str, tiny_bert: Path,
                                  tmp_path: Path, capsys) -> None:
    code = main(["finetune", f"--model={tiny_bert}", f"--output_dir={tmp_path / 'out'}",
                 "--train.max_steps=1", "--train.global_batch_size=2",
                 "--train.micro_batch_size=2", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_unseen_validation_label_names_file_and_line(tiny_bert: Path, tmp_path: Path,
                                                     capsys) -> None:
    val = tmp_path / "val.csv"
    val.write_text("text,label\nfine,pos\nodd,maybe\n")
    code = main(["finetune", *args(tiny_bert, tmp_path / "out", "reviews"),
                 f"--data.validation={val}"])
    err = capsys.readouterr().err
    assert code == 2 and f"{val}:3" in err and "'maybe'" in err, err


@pytest.mark.parametrize("model", ["bert-tiny", "config.json", "missing/dir"])
def test_a_model_without_weights_is_refused(model: str, tiny_bert: Path, tmp_path: Path,
                                            capsys) -> None:
    """Fine-tuning starts from weights: a preset or a bare config.json says so; a path that
    does not exist says that."""
    given = str(tiny_bert / model) if model != "bert-tiny" else model
    code = main(["finetune", *args(given, tmp_path / "out", "reviews")])
    err = capsys.readouterr().err
    words = "does not exist" if model == "missing/dir" else "not a model directory"
    assert code == 2 and words in err and "Traceback" not in err, err


def test_model_without_tokenizer_is_refused(tiny_bert: Path, tmp_path: Path, capsys) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((tiny_bert / name).read_bytes())
    code = main(["finetune", *args(bare, tmp_path / "out", "mrpc")])
    err = capsys.readouterr().err
    assert code == 2 and "tokenizer" in err, err


def test_help_lists_every_key(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = capsys.readouterr().out
    for key in ("--task", "--data.train", "--data.validation", "--data.task_name",
                "--data.max_seq_length", "--data.doc_stride", "--data.max_query_length",
                "--train.epochs", "--train.max_steps", "--train.global_batch_size",
                "--train.micro_batch_size", "--train.seed", "--optim.name", "--optim.lr",
                "--optim.warmup", "--precision", "--eval.n_best_size",
                "--eval.max_answer_length", "--eval.null_score_diff_threshold", "--seeds",
                "run-defining", "finetune/squad-v1.1-bert-large"):
        assert key in text, key


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tiny, tmp_path: Path, child_env) -> None:
    """torchrun with 2 ranks x 1 micro-batch == 1 process x 2 accumulation steps (no dropout),
    and evaluation split over the ranks gathers every window back in order."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    model = tmp_path / "nodrop"
    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(model, tokenizer=tokenizer)
    common = args(model, tmp_path / "one", "squad-v2", "--train.max_steps=4")
    single = finetune(load_config(FinetuneConfig, None, common))
    two = [a.replace(str(tmp_path / "one"), str(tmp_path / "two")) for a in common]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "bertforge.cli", "finetune", *two]
    proc = subprocess.run(cmd, env=child_env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    a = load_file(tmp_path / "one" / "model.safetensors")
    b = load_file(tmp_path / "two" / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
    ranked = json.loads((tmp_path / "two" / "eval_results.json").read_text())
    assert ranked["total"] == single.validation["total"]
    assert ranked["f1"] == pytest.approx(single.validation["f1"], abs=1e-6)


def test_a_run_reads_the_models_config_once(tiny_bert: Path, tmp_path: Path,
                                            monkeypatch) -> None:
    """One loader: a fine-tuning run parses the starting model's config.json once (it used to
    parse it five times in a SQuAD run: the task check, the sequence length, the task's own
    reading, the config, the weights)."""
    import bertforge.models.config_base as config_base

    real, parsed = config_base.read_config_file, []

    def counting(path):
        parsed.append(Path(path))
        return real(path)

    monkeypatch.setattr(config_base, "read_config_file", counting)
    import bertforge.models.registry as registry
    monkeypatch.setattr(registry, "read_config_file", counting)
    run(tiny_bert, tmp_path / "squad", "squad-v1")
    assert parsed.count(tiny_bert / "config.json") == 1, parsed
