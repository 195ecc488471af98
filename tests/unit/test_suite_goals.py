"""The benchmark suite's issue-23 goal rows, judged again from a committed CPU run's entries:
the same verdicts as that run wrote, and the MRPC accuracy row shows each seed's value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RUN = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-11-27-cpu-speed"
       / "summary.json")


@pytest.fixture(scope="module")
def suite_speed(benchmark_script):
    return benchmark_script("suite_speed")


def test_goals_judged_again_from_a_stored_run_keep_their_verdicts(suite_speed) -> None:
    stored = json.loads(RUN.read_text(encoding="utf-8"))
    entries = {e["name"]: e for e in stored["entries"]}
    again = suite_speed.speed_goals(entries, stored["device_kind"], "")
    before = {g["goal"]: g for g in stored["goals"]}
    assert again and all(g["goal"] in before for g in again)
    for goal in again:
        assert goal["status"] == before[goal["goal"]]["status"], goal["goal"]
    mrpc = next(g for g in again if g["goal"].startswith("Fine-tuning time per epoch")
                and "MRPC" in g["goal"])
    assert mrpc["status"] == "not met (faster, but lower held-out accuracy)"
    assert mrpc["evidence"].endswith(
        "held-out accuracy 0.6863 vs 0.6900 (lower; per seed 0.6887, 0.6838 vs 0.6887, 0.6912)")
    assert before[mrpc["goal"]]["evidence"] in mrpc["evidence"].replace(
        "; per seed 0.6887, 0.6838 vs 0.6887, 0.6912", "")
