"""`bertforge demo` end to end with a handful of steps: every stage runs and its products load."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.demo import run_demo


def test_demo_runs_every_stage(tmp_path: Path) -> None:
    summary = run_demo(tmp_path, steps=20, bart_steps=20)  # two metrics lines each (log_every 10)
    assert summary["steps"] == 20
    assert 0.1 < summary["corpus_mb"] < 5          # "a few MB at most"
    assert Path(summary["checkpoint"], "model.safetensors").is_file()
    assert Path(summary["checkpoint"], "vocab.txt").is_file()
    assert summary["transformers"].startswith("transformers ")
    diff = float(summary["transformers"].rsplit("=", 1)[1])
    assert diff < 1e-4                               # the checkpoint means the same in transformers
    assert summary["loss_last"] < summary["loss_first"]
    assert summary["qa"].startswith("exact match ")  # the fine-tuning stage ran and was scored
    assert (tmp_path / "qa-run" / "eval_results.json").is_file()
    assert Path(summary["qa_model"], "config.json").is_file()  # named in the summary
    assert Path(summary["bart_model"]) == tmp_path / "bart" / "run" / "checkpoint-20"
    bart = summary["bart"]  # "loss A -> B, validation loss C; transformers loaded it as ...: ... = D"
    first, last = (float(x) for x in bart.split(",")[0].removeprefix("loss ").split(" -> "))
    assert last < first
    assert "MBartForConditionalGeneration" in bart and float(bart.rsplit("=", 1)[1]) < 1e-4
    assert (tmp_path / "bart" / "run" / "checkpoint-20" / "vocab.json").is_file()


def test_sample_qa_is_squad_with_answers_at_their_offsets(tmp_path: Path) -> None:
    from bertforge.data.finetuning.squad import read_squad
    from bertforge.demo.qa_data import build_sample_qa

    train, dev, n_train, n_dev = build_sample_qa(tmp_path)
    a, b = read_squad(train), read_squad(dev)
    assert (len(a.examples), len(b.examples)) == (n_train, n_dev) and n_train > 5 * n_dev > 0
    for ex in a.examples + b.examples:
        (answer,) = ex.answers
        assert ex.context[answer.start:answer.start + len(answer.text)] == answer.text
    # Modules are split, so no docstring is in both files.
    assert not {ex.context for ex in a.examples} & {ex.context for ex in b.examples}


def test_a_demo_workdir_is_reused_and_a_foreign_folder_refused(tmp_path: Path) -> None:
    from bertforge.demo.run import MARKER, RUNS, claim_workdir
    from bertforge.errors import ConfigError

    work = tmp_path / "demo"
    assert claim_workdir(work) == [] and (work / MARKER).is_file()
    for run in RUNS:  # what a finished demo leaves: its runs, and data it keeps
        (work / run / "checkpoint-300").mkdir(parents=True)
    (work / "data").mkdir()
    (work / "data" / "manifest.json").write_text("{}")
    # A second demo trains afresh instead of stopping at "already holds checkpoint-300".
    assert claim_workdir(work) == [work / run for run in RUNS]
    assert not any((work / run).exists() for run in RUNS)
    assert (work / "data" / "manifest.json").is_file()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="is not empty and was not made by `bertforge demo`"):
        claim_workdir(foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"
