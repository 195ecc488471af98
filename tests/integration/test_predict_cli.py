"""``bertforge predict MODE`` end to end: answers from options and from stdin (piped and on a
terminal), JSON Lines, the file mode still working and agreeing with the QA pipeline on long
contexts, and every user error as one ``error:`` line with exit status 2."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.config import FinetuneConfig, load_config, save_config
from bertforge.inference.pipelines import load_pipeline
from bertforge.models import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                              BertForSequenceClassification, BertForTokenClassification)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the capital of france is paris where eiffel tower in city river seine".split()
CONTEXT = ("the eiffel tower is in paris, the capital of france. the seine river runs "
           "through the city. ") * 4
QUESTIONS = ["where is the eiffel tower?", "what river runs through the city?", "which city?"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predict_cli")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *WORDS])))
    base = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    paths = {
        "qa": BertForQuestionAnswering(base.replace(finetuning_task="squad")),
        "classify": BertForSequenceClassification(base.replace(
            num_labels=2, id2label={0: "neg", 1: "pos"}, finetuning_task="classification")),
        "tag": BertForTokenClassification(base.replace(
            num_labels=2, id2label={0: "O", 1: "LOC"}, finetuning_task="token-classification")),
        "fill-mask": BertForMaskedLM(base),
    }
    paths = {k: m.save_pretrained(root / k, tokenizer=tok) for k, m in paths.items()}
    # The run's settings, as `bertforge finetune` leaves them beside the model: small windows,
    # so the long context is split into several.
    cfg = load_config(FinetuneConfig, None, ["--task=squad", "--data.max_seq_length=48",
                                             "--data.doc_stride=12", "--data.max_query_length=12",
                                             "--precision=fp32"])
    save_config(cfg, paths["qa"] / "config.yaml")
    return paths


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def predict(capsys, monkeypatch, *args: str, stdin: str = "", tty: bool = False):
    monkeypatch.setattr(sys, "stdin", (Terminal if tty else io.StringIO)(stdin))
    code = main(["predict", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_qa_answers_a_question_with_its_score_and_span(models, capsys, monkeypatch):
    code, out, _ = predict(capsys, monkeypatch, "qa", "--model", str(models["qa"]),
                           "--question", QUESTIONS[0], "--context", CONTEXT, "--json")
    assert code == 0
    (result,) = [json.loads(line) for line in out.splitlines()]
    assert CONTEXT[result["start"]:result["end"]] == result["answer"]
    code, out, _ = predict(capsys, monkeypatch, "qa", "--model", str(models["qa"]),
                           "--question", QUESTIONS[0], "--context", CONTEXT)
    assert out == (f"{result['answer']}  score {result['score']:.4f}, characters "
                   f"{result['start']}-{result['end']}\n")


def test_qa_from_stdin_matches_the_file_prediction_of_the_fine_tuning_task(
        models, capsys, monkeypatch, tmp_path):
    """Long contexts: the same windows (config.yaml) and post-processing as `predict --data`."""
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "context": CONTEXT}) + "\n"
                            for i, q in enumerate(QUESTIONS)))
    code, _, _ = predict(capsys, monkeypatch, "--model", str(models["qa"]), "--data", str(data),
                         "--output", str(tmp_path / "predictions.json"))
    assert code == 0
    expected = json.loads((tmp_path / "predictions.json").read_text())
    context_file = tmp_path / "context.txt"
    context_file.write_text(CONTEXT)
    code, out, err = predict(capsys, monkeypatch, "qa", "--model", str(models["qa"]),
                             "--context-file", str(context_file), "--json",
                             stdin="\n".join(QUESTIONS[:1] + [""] + QUESTIONS[1:]) + "\n")
    assert code == 0 and "question>" not in err  # no prompt when stdin is a pipe
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["question"] for r in rows] == QUESTIONS
    assert [r["answer"] for r in rows] == [expected[f"q{i}"] for i in range(len(QUESTIONS))]
    assert len(load_pipeline(models["qa"]).parse({"question": "q", "context": CONTEXT})
               .features) > 1


def test_qa_on_a_terminal_prompts_and_survives_a_bad_line(models, capsys, monkeypatch):
    code, out, err = predict(capsys, monkeypatch, "qa", "--model", str(models["qa"]),
                             "--context", "the tower is in paris.", tty=True,
                             stdin="where is it?\n" + "tower " * 10 + "\nwhich city?\n")
    assert code == 0
    assert err.count("question> ") == 4  # before each line and before end of input
    assert len(out.splitlines()) == 3  # a long question is cut to max_query_length, not refused


@pytest.mark.parametrize("mode, args, check", [
    ("classify", ["--text", "paris is a city", "--text", "the river"],
     lambda r: r["label"] in ("neg", "pos")),
    ("tag", ["--text", "Paris is in France."],
     lambda r: all("Paris is in France."[e["start"]:e["end"]] == e["word"]
                   for e in r["entities"])),
    ("fill-mask", ["--text", "paris is the [MASK].", "--top-k", "2"],
     lambda r: len(r["masks"][0]) == 2),
    ("embed", ["--text", "paris", "--pooling", "cls"],
     lambda r: len(r["embedding"]) == 32 and r["pooling"] == "cls"),
])
def test_text_modes_from_options_and_from_stdin(models, capsys, monkeypatch, mode, args, check):
    model = str(models["qa" if mode == "embed" else mode])
    code, out, _ = predict(capsys, monkeypatch, mode, "--model", model, "--json", *args)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(check(r) for r in rows)
    texts = [a for prev, a in zip(args, args[1:]) if prev == "--text"]
    options = [a for a in args if a not in texts and a != "--text"]
    code, piped, _ = predict(capsys, monkeypatch, mode, "--model", model, "--json", *options,
                             stdin="".join(t + "\n" for t in texts))
    assert code == 0 and piped == out
    code, human, _ = predict(capsys, monkeypatch, mode, "--model", model, *args)
    assert code == 0 and human.strip() and not human.startswith("{")


def test_summarize_mode(tiny_bart, capsys, monkeypatch):
    code, out, _ = predict(capsys, monkeypatch, "summarize", "--model", str(tiny_bart),
                           "--json", "--num-beams", "2", "--text", "word " * 100)
    assert code == 0
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert isinstance(row["summary"], str) and row["truncated"] is True


@pytest.mark.parametrize("args, stdin, words", [
    (["qa", "--question", "q"], "", "exactly one of --context TEXT and --context-file"),
    (["qa", "--question", "q", "--context", "c", "--context-file", "f"], "", "exactly one"),
    (["qa", "--question", "q", "--context-file", "/nonexistent/c.txt"], "", "does not exist"),
    (["qa", "--context", "c", "--text", "t"], "", "not --text"),
    (["classify", "--question", "q"], "", "belong to predict qa"),
    (["classify", "--data", "x.json"], "", "does not take --data"),
    (["classify", "--eval.batch_size=4"], "", "does not take --eval.batch_size=4"),
    (["--question", "q"], "", "--question needs a MODE"),
    ([], "", "predict needs a MODE"),
    # Refused after tokenizing only as much as the limit needs: "at least N tokens", N a lower
    # bound of the text's length, over the limit.
    (["classify", "--text", "paris " * 200], "", "input 1: text: at least 1"),
    (["classify"], "paris\n" + "paris " * 200 + "\n", "stdin line 2: text:"),
    (["fill-mask", "--text", "no mask"], "", "has no [MASK]"),
    (["tag"], "", None),
])
def test_user_errors_are_one_line_and_exit_2(models, capsys, monkeypatch, args, stdin, words):
    mode = args[0] if args and not args[0].startswith("-") else "classify"
    code, out, err = predict(capsys, monkeypatch, *args, "--model", str(models[mode]),
                             stdin=stdin)
    if words is None:  # empty stdin: nothing to answer, nothing wrong
        assert (code, out) == (0, "")
        return
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and words in err


def test_interactive_qa_in_a_real_process(models):
    """The installed entry point, stdin piped from another process."""
    proc = subprocess.run(
        [sys.executable, "-m", "bertforge.cli", "predict", "qa", "--model", str(models["qa"]),
         "--context", CONTEXT], input="where is the tower?\nwhich city?\n", text=True,
        capture_output=True, timeout=120, env={"OMP_NUM_THREADS": "1", "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("score" in line and "characters" in line for line in lines)


def test_file_predictions_run_in_the_asked_precision(models, capsys, monkeypatch, tmp_path,
                                                     caplog):
    """`predict --data` takes --precision as the other modes do: the run's saved fp32 is
    replaced by the command's choice, which the run logs."""
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": q, "context": CONTEXT}) + "\n"
                            for i, q in enumerate(QUESTIONS)))
    with caplog.at_level("INFO", "bertforge.precision"):
        code, _, _ = predict(capsys, monkeypatch, "--model", str(models["qa"]), "--data",
                             str(data), "--output", str(tmp_path / "p.json"), "--precision",
                             "int8")
    assert code == 0 and "precision int8 (int8: as asked" in caplog.text
    assert sorted(json.loads((tmp_path / "p.json").read_text())) == ["q0", "q1", "q2"]
