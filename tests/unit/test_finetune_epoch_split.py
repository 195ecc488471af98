"""finetune_epoch_bench.py's held-out splits of the GLUE pair tasks: every row lands in exactly
one part, the held-out part has the task's size, the split is the same on every call, and
bertforge's GLUE reader reads both parts of a JSON Lines source (RTE's format)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("finetune_epoch_bench")


def _rte_like(path: Path, rows: int) -> list[str]:
    lines = [json.dumps({"premise": f"Premise number {i} is here.", "hypothesis": f"It is {i}.",
                         "label": ("entailment", "not_entailment")[i % 2], "idx": i})
             for i in range(rows)]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")  # a trailing blank line
    return lines


def _mrpc_like(path: Path, rows: int) -> list[str]:
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    lines = [f"{i % 2}\t{i}\t{i + 1000}\tSentence {i} says \"this\".\tSentence {i} agrees."
             for i in range(rows)]
    path.write_text("\ufeff" + "\n".join([header, *lines]) + "\n", encoding="utf-8")
    return lines


@pytest.mark.parametrize("name, make", [("rte", _rte_like), ("mrpc", _mrpc_like)])
def test_split_keeps_every_row_once_and_holds_out_the_tasks_size(bench, monkeypatch, tmp_path,
                                                                  name, make) -> None:
    source = tmp_path / f"source{bench.GLUE[name].suffix}"
    rows = make(source, 40)
    monkeypatch.setitem(bench.GLUE, name, source)
    monkeypatch.setitem(bench.HELD_OUT, name, 7)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    train, heldout = bench.split_glue(name, tmp_path / "a")
    again = bench.split_glue(name, tmp_path / "b")
    assert [p.read_bytes() for p in (train, heldout)] == [p.read_bytes() for p in again]
    parts = [p.read_text(encoding="utf-8").splitlines() for p in (train, heldout)]
    if name == "mrpc":  # each part keeps the header (without the source's byte-order mark)
        assert all(part[0].startswith("Quality\t") for part in parts)
        parts = [part[1:] for part in parts]
    assert len(parts[1]) == 7 and len(parts[0]) == 33
    assert sorted(parts[0] + parts[1]) == sorted(rows)
    assert parts[0] != rows[:33]  # shuffled before the split


def test_rte_parts_read_as_glue_rte(bench, monkeypatch, tmp_path) -> None:
    from bertforge.data.finetuning.glue import read_glue

    source = tmp_path / "train.jsonl"
    _rte_like(source, 30)
    monkeypatch.setitem(bench.GLUE, "rte", source)
    monkeypatch.setitem(bench.HELD_OUT, "rte", 5)
    train, heldout = bench.split_glue("rte", tmp_path)
    examples = read_glue(heldout, "rte")
    assert len(examples) == 5
    assert len(read_glue(train, "rte")) == 25
