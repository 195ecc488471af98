"""The files a reader follows through one SQuAD fine-tuning run (scripts/walk_files.py) may not
grow back, and no call may climb from a lower layer into a higher one outside the kinds the
design has (the runner driving its task, the speed pass, callbacks handed down)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "walk_files.py"
MOST_FILES = 20  # the walk after the trainer merges (issue 39); lower it when it shrinks


@pytest.fixture(scope="module")
def walk() -> dict:
    spec = importlib.util.spec_from_file_location("walk_files", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure()


def test_the_walk_does_not_grow(walk: dict) -> None:
    assert walk["orchestration_files"] == len(walk["walk"])
    assert walk["orchestration_files"] <= MOST_FILES, walk["walk"]
    # The run reached eval_results.json through the runner and the SQuAD task.
    assert {"cli.py", "train/run.py", "train/loop.py", "tasks/squad.py"} <= set(walk["walk"])


def test_parsing_reads_no_help_text(walk: dict) -> None:
    # --help text (recipe files, the registries' lists) is made only when help is printed.
    assert not [f for f in walk["walk"] if f.startswith("recipes/")], walk["walk"]
    assert "commands/base.py" not in walk["walk"]


def test_no_call_climbs_back_up(walk: dict) -> None:
    assert "other" not in walk["climbs"], walk["climbs"].get("other")
    protocol = walk["climbs"].get("task protocol", [])
    assert protocol and all(c.startswith("train/") for c in protocol), protocol
