"""Hostile inputs to the commands that use a model after training (fine-tuning, predict,
generate, serve, export) end in one ``error:`` line, before any work, and lose nothing: NaN
weights, lengths the model cannot hold, generation settings that would only fail after training,
an output path that is a directory, bytes that are not UTF-8 on stdin, two commands writing into
one output directory, metrics that are undefined, and files published past the umask."""

from __future__ import annotations

import io
import json
import logging
import math
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.cli import main
from bertforge.core.io import LOCK_NAME, finite_json, output_lock
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import InputError, load_pipeline
from bertforge.models import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertforge.tokenization import BertTokenizer
from cli_output import one_error_line

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
MRPC, STSB = ASSETS / "finetune" / "mrpc.tsv", ASSETS / "finetune" / "stsb.tsv"
XSUM = ASSETS / "summarization" / "xsum.jsonl"
MISSING = "/nonexistent/bertforge-test-data.tsv"  # a check that reads data first fails on this


def strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity, as every other JSON parser does."""
    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def exit_code(argv: list[str]) -> int:
    """``main``'s status, also for the flags argparse refuses itself (it exits)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def models(tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A pretrained tiny BERT, a sentence-pair classifier made from it, and a copy of the
    classifier whose weights hold a NaN."""
    root = tmp_path_factory.mktemp("inference_faults")
    tok = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    classifier = config.replace(num_labels=2, id2label={0: "0", 1: "1"},
                                finetuning_task="glue/mrpc")
    torch.manual_seed(0)
    out = {"bert": BertForPreTraining(config).save_pretrained(root / "bert", tokenizer=tok),
           "classify": BertForSequenceClassification(classifier).save_pretrained(
               root / "classify", tokenizer=tok)}
    nan = root / "nan"
    BertForSequenceClassification(classifier).save_pretrained(nan, tokenizer=tok)
    weights = load_file(nan / "model.safetensors")
    name = next(k for k in weights if k.endswith("attention.self.query.weight"))
    weights[name][0, 0] = float("nan")
    save_file(weights, nan / "model.safetensors", metadata={"format": "pt"})
    out["nan"] = nan
    return out


# --- every model load verifies the weights ------------------------------------------------------


@pytest.mark.parametrize("command", ["predict-mode", "predict-file", "serve", "export"])
def test_nan_weights_are_refused_by_every_command(command: str, models, tmp_path: Path,
                                                  capsys, monkeypatch) -> None:
    nan = str(models["nan"])
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    argv = {"predict-mode": ["predict", "classify", "--model", nan, "--text", "a b"],
            "predict-file": ["predict", "--model", nan, "--data", str(MRPC),
                             "--output", str(tmp_path / "p.jsonl")],
            "serve": ["serve", "--model", nan, "--port", "0"],
            "export": ["export", "onnx", "--model", nan, "--output", str(tmp_path / "onnx")]}
    assert main(argv[command]) == 2
    err = one_error_line(capsys)
    assert "1 NaN/inf" in err or "non-finite" in err or "NaN" in err, err
    assert "attention.self.query.weight" in err, err
    assert not (tmp_path / "p.jsonl").exists() and not (tmp_path / "onnx").exists()


def test_nan_weights_are_refused_by_generate(tiny_bart: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bart"
    bad.mkdir()
    for f in tiny_bart.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = load_file(bad / "model.safetensors")
    name = next(k for k in weights if "fc1.weight" in k)
    weights[name][0, 0] = float("inf")
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "in.txt").write_text("a text to summarise\n")
    assert main(["generate", "--model", str(bad), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "fc1.weight" in one_error_line(capsys)
    assert not (tmp_path / "out.jsonl").exists()


# --- every command validates its whole configuration before any work ---------------------------


def summarize_args(model: Path, out: Path, *more: str) -> list[str]:
    return ["finetune", "--task=summarization", f"--model={model}", f"--data.train={MISSING}",
            f"--output_dir={out}", "--train.max_steps=2", *more]


@pytest.mark.parametrize("setting, message", [
    ("--data.max_target_length=100", "data.max_target_length=100 exceeds the model's 64 "
                                     "positions; lower it"),
    ("--data.max_seq_length=65", "data.max_seq_length=65 exceeds the model's 64 positions"),
    ("--eval.max_length=100", "generation setting eval.max_length=100 is invalid: outputs of "
                              "100 tokens (decoder start included) exceed the 64 positions"),
    ("--eval.min_length=80", "generation setting eval.min_length=80 is invalid"),
    ("--eval.num_beams=0", "generation setting eval.num_beams=0 is invalid: must be >= 1"),
])
def test_summarization_lengths_and_generation_fail_before_data_is_read(
        setting: str, message: str, tiny_bart: Path, tmp_path: Path, capsys) -> None:
    # The training file does not exist: an error about it would mean the data came first.
    assert main(summarize_args(tiny_bart, tmp_path / "run", setting)) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_saved_generation_length_beyond_the_positions_is_capped(tiny_bart: Path,
                                                                  tmp_path: Path) -> None:
    from bertforge.models.generation.texts import settings_for
    from bertforge.models.bart import BartConfig
    from bertforge.models.generation import GenerationConfig

    config = BartConfig.load(tiny_bart)
    saved = GenerationConfig.load(tiny_bart).replace(max_length=500)
    assert settings_for(config, saved, {}, source="m").length_limits()[1] == 64
    with pytest.raises(ConfigError, match="generation setting max_new_tokens=100 is invalid"):
        settings_for(config, saved, {"max_new_tokens": 100}, source="m")


@pytest.mark.parametrize("argv, message", [
    (["finetune", "--task=glue", "--data.task_name=mrpc", "--data.max_seq_length=3"],
     "data.max_seq_length must be >= 4, got 3"),
    (["finetune", "--task=summarization", "--data.max_target_length=1"],
     "data.max_target_length must be >= 3, got 1"),
    (["finetune", "--task=squad", "--eval.null_score_diff_threshold=nan"],
     "eval.null_score_diff_threshold must be a finite number, got nan"),
    (["finetune", "--task=glue", "--data.task_name=mrpc", "--seeds", "1,2,1"],
     "seed 1 is given twice in 1,2,1; give each seed once"),
    (["predict", "classify", "--model", "m", "--max-seq-length", "2", "--text", "x"],
     "must be a whole number >= 4, got 2"),
    (["generate", "--model", "m", "--input", "i", "--output", "o", "--max-source-length", "1"],
     "must be a whole number >= 4, got 1"),
])
def test_lengths_too_short_for_any_input_are_config_errors(argv: list[str], message: str,
                                                           tmp_path: Path, capsys) -> None:
    code = exit_code([*argv, f"--output_dir={tmp_path / 'run'}"] if argv[0] == "finetune"
                     else argv)
    assert code == 2
    assert message in capsys.readouterr().err


def test_an_output_path_that_is_a_directory_fails_before_the_work(models, tiny_bart: Path,
                                                                  tmp_path: Path,
                                                                  capsys) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    # The NaN model would fail at its load: the output is checked first.
    assert main(["predict", "--model", str(models["nan"]), "--data", str(MRPC),
                 "--output", str(folder)]) == 2
    assert one_error_line(capsys) == (f"error: --output {folder} is a directory; give the file "
                                      f"to write, e.g. {folder / 'predictions.jsonl'}")
    (tmp_path / "in.txt").write_text("some text\n")
    assert main(["generate", "--model", str(tiny_bart), "--input", str(tmp_path / "in.txt"),
                 "--output", str(folder)]) == 2
    assert f"--output {folder} is a directory" in one_error_line(capsys)
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["generate", "--model", str(tiny_bart), "--input", str(tmp_path / "in.txt"),
                 "--output", str(blocked / "out.jsonl")]) == 2
    assert f"--output {blocked / 'out.jsonl'}: its folder {blocked} is a file" in (
        one_error_line(capsys))


def test_a_non_utf8_text_file_for_generate_names_the_line(tiny_bart: Path, tmp_path: Path,
                                                          capsys) -> None:
    (tmp_path / "in.txt").write_bytes(b"fine\ncaf\xe9\n")
    assert main(["generate", "--model", str(tiny_bart), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "o.jsonl")]) == 2
    assert one_error_line(capsys).startswith(f"error: --input {tmp_path / 'in.txt'}:2 is not "
                                             "UTF-8 text")


# --- stdin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("errors", ["surrogateescape", "strict"])
def test_non_utf8_bytes_on_stdin_are_one_error_line(errors: str, models, capsys,
                                                    monkeypatch) -> None:
    raw = io.BytesIO(b"a fine line\ncaf\xff au lait\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8", errors=errors))
    assert main(["predict", "classify", "--model", str(models["classify"])]) == 2
    assert one_error_line(capsys) == ("error: stdin line 2: text: is not valid UTF-8 text: "
                                      "character 4 is byte 0xff, which is not UTF-8; send UTF-8 "
                                      "text")


def test_blank_stdin_lines_are_counted_in_a_note(models, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\n\n   \ntwo\n"))
    assert main(["predict", "classify", "--model", str(models["classify"]), "--json"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["one", "two"]
    assert "note: skipped 2 blank stdin lines (line 2, 3)" in err


def test_a_lone_surrogate_is_an_input_error_of_every_text_field(models) -> None:
    pipeline = load_pipeline(models["classify"], device="cpu")
    for item, field in (({"text": "ok \ud800"}, "text"),
                        ({"text": "ok", "text_pair": "\udcff"}, "text_pair")):
        with pytest.raises(InputError, match="is not valid UTF-8 text") as caught:
            pipeline.parse(item)
        assert caught.value.field == field


def test_a_generation_length_beyond_the_positions_is_an_input_error(tiny_bart: Path) -> None:
    pipeline = load_pipeline(tiny_bart, device="cpu")
    with pytest.raises(InputError, match="exceed the 64 positions") as caught:
        pipeline.parse({"text": "a text", "max_length": 100000})
    assert caught.value.field == "max_length"
    pipeline.parse({"text": "a text", "max_length": 64})


# --- metrics are JSON -------------------------------------------------------------------------


def test_an_undefined_metric_is_written_as_null_with_a_warning(models, tmp_path: Path,
                                                               caplog) -> None:
    constant = tmp_path / "stsb.tsv"  # every label 2.5: Pearson's r is undefined
    rows = STSB.read_text(encoding="utf-8").splitlines()
    header, body = rows[0], [r.rsplit("\t", 1)[0] + "\t2.500" for r in rows[1:]]
    constant.write_text("\n".join([header, *body]) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        assert main(["finetune", "--task=glue", "--data.task_name=stsb",
                     f"--model={models['bert']}", f"--data.train={constant}",
                     f"--data.validation={constant}", f"--output_dir={out}",
                     "--train.max_steps=2", "--train.global_batch_size=4",
                     "--train.micro_batch_size=4", "--train.eval_every=1",
                     "--tensorboard=false"]) == 0
    results = strict_json((out / "eval_results.json").read_text())
    assert results["pearson"] is None and results["spearmanr"] is None
    for line in (out / "metrics.jsonl").read_text().splitlines():
        strict_json(line)
    assert any("eval_results.json: pearson=nan" in r.getMessage() and "written as null" in
               r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_finite_json_replaces_every_non_finite_number(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        out = finite_json({"a": [1.0, math.inf], "b": {"c": -math.inf, "d": math.nan},
                           "e": "nan", "f": 2}, "f.json")
    assert out == {"a": [1.0, None], "b": {"c": None, "d": None}, "e": "nan", "f": 2}
    (record,) = caplog.records
    assert record.getMessage() == ("f.json: a[1]=inf and 2 more is undefined (not a finite "
                                   "number) and is written as null")


# --- one writer per output directory; files follow the umask ----------------------------------


def _hold(directory: str, ready, release) -> None:
    with output_lock(directory, "output_dir", "bertforge finetune"):
        ready.set()
        release.wait(60)


def test_two_commands_cannot_write_into_one_output_dir(models, tmp_path: Path,
                                                       capsys) -> None:
    out = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(out), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        assert main(["finetune", "--task=glue", "--data.task_name=mrpc",
                     f"--model={models['bert']}", f"--data.train={MRPC}",
                     f"--output_dir={out}", "--train.max_steps=1"]) == 2
        err = one_error_line(capsys)
        assert err.startswith(f"error: output_dir {out} is in use by another bertforge command "
                              f"(pid {holder.pid} on ")
        assert "`bertforge finetune`, since" in err and err.endswith(
            "wait for it to finish, or choose another output_dir")
    finally:
        release.set()
        holder.join(30)
    assert not (out / LOCK_NAME).exists()  # removed on release


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(out), ready, release))
    holder.start()
    assert ready.wait(30)
    with pytest.raises(ConfigError, match="in use by another bertforge command"):
        with output_lock(out, "output_dir", "test"):
            pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(30)
    assert (out / LOCK_NAME).exists()  # left by the killed process, but not locked
    with output_lock(out, "output_dir", "test"):
        assert strict_json((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (out / LOCK_NAME).exists()


def test_prepare_takes_the_lock_of_its_output(tiny, tmp_path: Path, capsys) -> None:
    out = tmp_path / "data"
    with output_lock(out, "--output", "another"):
        assert main(["prepare", "--input", str(ROOT / "tests" / "assets" / "tiny_corpus.txt"),
                     "--vocab", str(tiny.vocab), "--output", str(out), "--workers", "1"]) == 2
    assert f"--output {out} is in use by another bertforge command" in one_error_line(capsys)


def test_export_takes_a_lock_beside_its_output(models, tmp_path: Path, capsys) -> None:
    out = tmp_path / "onnx"
    with output_lock(out, "--output", "another", beside=True):
        assert main(["export", "onnx", "--model", str(models["classify"]), "--output",
                     str(out)]) == 2
    assert f"--output {out} is in use by another bertforge command" in one_error_line(capsys)
    assert not out.exists() and not list(tmp_path.glob(".*lock"))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_published_weights_follow_the_umask(umask: int, mode: int, tmp_path: Path) -> None:
    config = BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                        intermediate_size=16, max_position_embeddings=16)
    old = os.umask(umask)
    try:
        out = BertForPreTraining(config).save_pretrained(tmp_path / "m")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == mode and set(modes.values()) == {mode}, modes
