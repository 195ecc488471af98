"""`bertforge demo` end to end with a handful of steps: every stage runs and its products load."""

from __future__ import annotations

from pathlib import Path

from bertforge.demo import run_demo


def test_demo_runs_every_stage(tmp_path: Path) -> None:
    summary = run_demo(tmp_path, steps=20)  # two metrics lines (log_every 10)
    assert summary["steps"] == 20
    assert 0.1 < summary["corpus_mb"] < 5          # "a few MB at most"
    assert Path(summary["checkpoint"], "model.safetensors").is_file()
    assert Path(summary["checkpoint"], "vocab.txt").is_file()
    assert summary["transformers"].startswith("transformers ")
    diff = float(summary["transformers"].rsplit("=", 1)[1])
    assert diff < 1e-4                               # the checkpoint means the same in transformers
    assert summary["loss_last"] < summary["loss_first"]
