"""The precision of evaluation-only fine-tuning runs and ``bertforge evaluate ... --precision P``
(issue 40): an evaluation-only run takes bf16 and int8 and says why it ran in what it ran in;
``auto`` is held to the quality guard on the run's own first evaluation batch; int8 is refused
for training; ``evaluate finetuned|sts --precision P`` reports P next to fp32, and its fp32
numbers are a plain evaluation-only run's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.commands.evaluate import difference
from bertforge.commands.train import finetune
from bertforge.config import FinetuneConfig, PretrainConfig, load_config
from bertforge.errors import ConfigError
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.ops.linear import Int8Linear
from bertforge.runtime import guard
from bertforge.tasks import finetuning
from bertforge.tasks.registry import build_task
from bertforge.tokenization import BertTokenizer
from bertforge.train.distributed import init_distributed

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
SQUAD, MRPC = ASSETS / "squad" / "v1_sample.json", ASSETS / "finetune" / "mrpc.tsv"
STSB, STORIES = ASSETS / "finetune" / "stsb.tsv", ASSETS / "summarization" / "xsum.jsonl"
TASKS = {"squad": ["--task=squad", "--data.max_seq_length=64", "--data.doc_stride=16",
                   "--data.max_query_length=16"],
         "mrpc": ["--task=glue", "--data.task_name=mrpc"],
         "stsb": ["--task=glue", "--data.task_name=stsb"]}
DATA = {"squad": SQUAD, "mrpc": MRPC, "stsb": STSB}
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"
METRICS = {"squad": ("exact_match", "f1"), "mrpc": ("accuracy", "f1"),
           "stsb": ("pearson", "spearmanr")}


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny BERT fine-tuned for a few steps on each task's sample (random weights before)."""
    root = tmp_path_factory.mktemp("eval_precision")
    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    base = BertForPreTraining(config).save_pretrained(root / "base", tokenizer=tokenizer)
    out = {}
    for name, task in TASKS.items():
        out[name] = root / name
        finetune(load_config(FinetuneConfig, None, [
            *task, f"--model={base}", f"--output_dir={out[name]}", f"--data.train={DATA[name]}",
            f"--data.validation={DATA[name]}", "--train.max_steps=3",
            "--train.global_batch_size=4", "--train.micro_batch_size=2", "--precision=fp32",
            "--tensorboard=false", "--eval.batch_size=3"]))
    return out


@pytest.fixture(scope="module")
def mrpc_dev(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 sentence pairs of the test corpus in MRPC's format, labels alternating."""
    lines = [t.strip() for t in CORPUS.read_text(encoding="utf-8").splitlines() if t.strip()]
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    rows += [f"{i % 2}\t{i}\t{i + 1}\t{lines[i % len(lines)]}\t{lines[(3 * i + 1) % len(lines)]}"
             for i in range(40)]
    path = tmp_path_factory.mktemp("mrpc_dev") / "dev.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def eval_only(model: Path, task: str, out: Path, *more: str) -> FinetuneConfig:
    return load_config(FinetuneConfig, None, [
        *TASKS[task], f"--model={model}", f"--data.validation={DATA[task]}",
        f"--output_dir={out}", "--eval.batch_size=3", *more])


def results(out: Path) -> dict:
    return json.loads((out / "eval_results.json").read_text())


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_an_evaluation_only_run_takes_bf16_and_int8(trained: dict[str, Path], tmp_path: Path,
                                                    task: str, precision: str, capsys) -> None:
    result = finetune(eval_only(trained[task], task, tmp_path, f"--precision={precision}"))
    saved = results(tmp_path)
    assert set(METRICS[task]) <= set(result.validation) and "precision" not in result.validation
    assert saved == {**result.validation, "precision": precision,
                     "precision_reason": saved["precision_reason"]}
    # explicit: run as asked, its probe agreement measured (the suite's CPU has no units)
    assert saved["precision_reason"].startswith(f"{precision}: as asked; probe cosine to fp32 ")
    cosine = float(saved["precision_reason"].rsplit(" ", 1)[1])
    assert 0.9 < cosine <= 1.0 + 1e-6
    assert f"precision    {precision} ({precision}: as asked" in capsys.readouterr().out


def test_int8_swaps_the_linear_layers_and_bf16_casts_them(trained: dict[str, Path],
                                                          tmp_path: Path) -> None:
    task = build_task(eval_only(trained["mrpc"], "mrpc", tmp_path), init_distributed())
    model, numerics = task.evaluation_model("int8")
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, Int8Linear))]
    assert numerics.name == "int8" and numerics.dtype is None
    assert layers and all(isinstance(m, Int8Linear) for m in layers)
    model, numerics = task.evaluation_model("bf16")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert numerics.dtype == torch.bfloat16
    assert {m.weight.dtype for m in linears} == {torch.bfloat16}
    assert not model.training and task.precision_choice.name == "bf16"


def test_auto_without_units_is_fp32_and_says_why(trained: dict[str, Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTFORGE_CPU_UNITS", "none")
    plain = finetune(eval_only(trained["squad"], "squad", tmp_path / "fp32",
                               "--precision=fp32"))
    auto = finetune(eval_only(trained["squad"], "squad", tmp_path / "auto"))
    saved = results(tmp_path / "auto")
    assert saved["precision"] == "fp32" and "no bf16 or int8 units" in saved["precision_reason"]
    assert saved["precision_reason"].startswith("auto: ")
    assert auto.validation == plain.validation


def test_auto_is_guarded_on_the_first_evaluation_batch(trained: dict[str, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTFORGE_CPU_UNITS", "avx512_bf16,avx512_vnni")
    probes = []
    choose = finetuning.choose_precision

    def spy(model, device, asked, probe, **kw):
        probes.append(probe)
        return choose(model, device, asked, probe, **kw)

    monkeypatch.setattr(finetuning, "choose_precision", spy)
    task = build_task(eval_only(trained["squad"], "squad", tmp_path), init_distributed())
    # the guard holds: the fastest unit's precision runs, with its probe agreement
    monkeypatch.setattr(guard, "GUARD_COSINE", -1.0)
    assert task.evaluate_at().choice.name == "bf16"
    assert "avx512_bf16" in task.precision_choice.reason
    # it fails for both: fp32, with both agreements in the reason
    monkeypatch.setattr(guard, "GUARD_COSINE", 1.5)
    done = task.evaluate_at()
    assert done.choice.name == "fp32"
    assert "bf16 reached" in done.choice.reason and "int8 reached" in done.choice.reason
    # the probe is the evaluation pass's first batch: the longest features, eval.batch_size
    features = task.features.evaluation.features
    first = np.argsort(-features.lengths, kind="stable")[:3]
    batch = features.collate(first)
    for probe in probes:
        assert set(probe.inputs) == {"input_ids", "attention_mask", "token_type_ids"}
        for key, value in probe.inputs.items():
            assert torch.equal(value, batch[key])
        assert torch.equal(probe.mask, batch["attention_mask"])


def test_summarization_evaluates_in_int8_with_its_articles_as_the_probe(
        tiny_bart: Path, tmp_path: Path) -> None:
    cfg = load_config(FinetuneConfig, None, [
        "--task=summarization", f"--model={tiny_bart}", f"--data.validation={STORIES}",
        f"--output_dir={tmp_path}", "--precision=int8", "--data.max_seq_length=48",
        "--eval.batch_size=4", "--data.max_eval_examples=4"])
    result = finetune(cfg)
    saved = results(tmp_path)
    assert "rouge1" in result.validation and saved["precision"] == "int8"
    assert "probe cosine to fp32" in saved["precision_reason"]
    task = build_task(cfg, init_distributed())
    probe = task.evaluation_probe()
    sources = task.features.evaluation.features
    longest = max(sources, key=len)
    assert probe.inputs["input_ids"].shape[0] == min(len(sources), 8)
    assert probe.inputs["input_ids"][0, :len(longest)].tolist() == longest[:128].tolist()


def test_int8_is_refused_for_training() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(FinetuneConfig, None, ["--task=glue", "--data.task_name=mrpc",
                                           f"--data.train={MRPC}", "--precision=int8"])
    assert "precision=int8 is for evaluation-only runs (no data.train)" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="precision must be one of auto, fp32, bf16, fp16"):
        load_config(PretrainConfig, None, ["--precision=int8"])
    assert load_config(FinetuneConfig, None, ["--precision=int8"]).precision == "int8"


@pytest.mark.parametrize("task", ["squad", "stsb"])
def test_evaluate_finetuned_reports_bf16_next_to_fp32(trained: dict[str, Path], tmp_path: Path,
                                                      task: str, capsys) -> None:
    plain = finetune(eval_only(trained[task], task, tmp_path / "plain",
                               "--precision=fp32")).validation
    report_file = tmp_path / "report.json"
    capsys.readouterr()
    assert main(["evaluate", "finetuned", "--model", str(trained[task]), "--data", str(DATA[task]),
                 "--precision", "bf16", "--output", str(report_file),
                 "--eval.batch_size=3"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert json.loads(report_file.read_text()) == report
    assert list(report) == ["fp32", "bf16", "difference", "seconds", "precision",
                            "precision_reason"]
    assert report["fp32"] == plain  # the task's settings come from the run's config.yaml
    assert set(report["bf16"]) == set(plain) and report["precision"] == "bf16"
    assert report["difference"] == {k: report["bf16"][k] - plain[k] for k in plain}
    assert set(report["seconds"]) == {"fp32", "bf16"} and min(report["seconds"].values()) > 0
    assert report["precision_reason"].startswith("bf16: as asked; probe cosine to fp32")
    assert f"{METRICS[task][0]}  " in err and "precision bf16 (bf16: as asked" in err


def test_evaluate_finetuned_at_fp32_prints_the_metrics_alone(trained: dict[str, Path],
                                                             tmp_path: Path, capsys) -> None:
    plain = finetune(eval_only(trained["mrpc"], "mrpc", tmp_path, "--precision=fp32"))
    capsys.readouterr()
    assert main(["evaluate", "finetuned", "--model", str(trained["mrpc"]),
                 "--data", str(MRPC)]) == 0
    assert json.loads(capsys.readouterr().out) == plain.validation


def test_evaluate_finetuned_takes_the_task_and_data_settings(
        trained: dict[str, Path], mrpc_dev: Path, tmp_path: Path, capsys) -> None:
    """A model without its run's config.yaml: --task and fine-tuning --data.* settings (a
    dotted key under evaluate's own --data is passed through to the run)."""
    import shutil

    model = Path(shutil.copytree(trained["mrpc"], tmp_path / "model"))
    (model / "config.yaml").unlink()
    plain = finetune(load_config(FinetuneConfig, None, [
        *TASKS["mrpc"], f"--model={model}", f"--data.validation={mrpc_dev}",
        f"--output_dir={tmp_path / 'plain'}", "--precision=fp32",
        "--data.max_eval_examples=25"]))
    capsys.readouterr()
    assert main(["evaluate", "finetuned", "--model", str(model), "--data", str(mrpc_dev),
                 "--task", "glue", "--data.task_name=mrpc", "--data.max_eval_examples=25",
                 "--precision", "int8"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["fp32"] == plain.validation and "on 25 examples" in err
    assert report["difference"] == pytest.approx(
        {k: report["int8"][k] - v for k, v in plain.validation.items()})


def test_difference_is_taken_of_numbers_nested_alike() -> None:
    got = difference({"a": 0.5, "n": 10, "s": "x", "first": {"b": 1.0}, "only": 1.0},
                     {"a": 0.25, "n": 8, "s": "y", "first": {"b": 0.5}})
    assert got == {"a": 0.25, "n": 2, "first": {"b": 0.5}}


@pytest.mark.parametrize("argv, message", [
    (["squad", "--data", "d.json", "--predictions", "p.json", "--precision", "bf16"],
     "--precision applies to a model (evaluate finetuned, retrieval or sts)"),
    (["sts", "--model", "m", "--data", "d.tsv", "--task", "squad"],
     "--task applies to evaluate finetuned, not sts"),
    (["squad", "--data", "d.json", "--predictions", "p.json", "--eval.batch_size=3"],
     "evaluate squad does not take --eval.batch_size=3"),
    (["finetuned", "--model", "m"], "evaluate finetuned needs --data"),
])
def test_evaluate_refuses_misplaced_options(argv: list[str], message: str, capsys) -> None:
    assert main(["evaluate", *argv]) != 0
    assert message in capsys.readouterr().err


def test_evaluate_finetuned_names_a_wrong_setting(trained: dict[str, Path], capsys) -> None:
    assert main(["evaluate", "finetuned", "--model", str(trained["mrpc"]), "--data", str(MRPC),
                 "--eval.batch_sise=3"]) != 0
    assert "eval.batch_size" in capsys.readouterr().err


@pytest.fixture(scope="module")
def encoder(tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bertforge.models import BertModel

    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(1)
    return BertModel(config).save_pretrained(tmp_path_factory.mktemp("encoder") / "m",
                                             tokenizer=tokenizer)


def test_evaluate_sts_reports_int8_next_to_fp32(encoder: Path, capsys) -> None:
    assert main(["evaluate", "sts", "--model", str(encoder), "--data", str(STSB)]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["evaluate", "sts", "--model", str(encoder), "--data", str(STSB),
                 "--precision", "int8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fp32"] == plain and report["precision"] == "int8"
    assert report["difference"]["spearman"] == pytest.approx(
        report["int8"]["spearman"] - plain["spearman"])
    assert "probe cosine to fp32" in report["precision_reason"]
