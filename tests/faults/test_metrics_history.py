"""metrics.jsonl survives kills and damage: a resumed run killed before its first log line keeps
the history it resumed with, and a damaged line (a write cut short by a full disk or a kill) is
dropped with a warning instead of blocking every later run in the directory."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bertforge.train.loop as loop
from bertforge.commands.train import pretrain


def steps_of(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()
            if "loss" in json.loads(line)]


@pytest.mark.slow
def test_sigkill_right_after_a_resume_keeps_the_history(tiny_config, tiny_args, stop_after,
                                                        child_env, tmp_path: Path,
                                                        monkeypatch) -> None:
    out, long_run = tmp_path / "run", ("--train.max_steps=100000", "--checkpoint.every=2")
    with monkeypatch.context() as m:  # a long run preempted after step 4
        m.setattr(loop, "PreemptionFlag", stop_after(4))
        assert pretrain(tiny_config(out, *long_run)).step == 4
    metrics = out / "metrics.jsonl"
    assert steps_of(metrics) == [1, 2, 3, 4]
    # The resumed run logs rarely, so the kill lands after it set up the metrics file but before
    # any new line: exactly when the old code had truncated it and buffered the kept lines.
    cmd = [sys.executable, "-m", "bertforge.cli", "pretrain",
           *tiny_args(out, *long_run, "--train.log_every=100000")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=child_env, cwd=tmp_path)
    try:
        first = proc.stdout.readline()  # "resumed from ...": printed once the log is set up
        time.sleep(0.5)  # a few training steps, no metrics line
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first.startswith("resumed from"), first
    assert steps_of(metrics) == [1, 2, 3, 4]


def test_a_damaged_last_line_is_dropped_with_a_warning(stopped_at_4: Path, finished,
                                                       tiny_config, caplog) -> None:
    metrics = stopped_at_4 / "metrics.jsonl"
    kept = metrics.read_text()
    metrics.write_text(kept + '{"step": 7, "loss": 3.1, "ml')  # cut mid-line by a full disk
    with caplog.at_level(logging.WARNING):
        assert pretrain(tiny_config(stopped_at_4, *finished.extra)).step == finished.steps
    line_no = len(kept.splitlines()) + 1
    assert f"metrics.jsonl:{line_no}: not a complete metrics record" in caplog.text
    assert steps_of(metrics) == list(range(1, finished.steps + 1))


def test_a_damaged_file_never_blocks_a_fresh_run(tmp_path: Path, tiny_config, finished,
                                                 caplog) -> None:
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(finished.out / "metrics.jsonl", out / "metrics.jsonl")
    with (out / "metrics.jsonl").open("a") as f:
        f.write("\x00\x00garbage\n[1, 2]\n")
    with caplog.at_level(logging.WARNING):
        result = pretrain(tiny_config(out, "--train.max_steps=2"))
    assert result.step == 2 and "not a complete metrics record" in caplog.text
    assert steps_of(out / "metrics.jsonl") == [1, 2]  # a fresh start keeps no old lines
    assert (out / "loss_curve.png").is_file()
