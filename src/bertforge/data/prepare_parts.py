"""Preparation split across machines: the parts of ``bertforge prepare --part I/N`` and what
``--merge`` checks before it joins them.

The main process of ``prepare`` cuts the documents, in input order, into chunks whose
boundaries depend on the input alone, and every random choice of a chunk is seeded by its
index. Part I of N therefore reads the whole input (the cheap stage) but builds only the chunks
whose index is I modulo N (the costly one: segmenting, tokenizing, instances), into
``OUTPUT/parts/I-of-N``, each shard byte for byte the one a single run writes. A finished part
writes ``part.json`` last: the fingerprint of the settings it shares with the other parts (the
single run's), how many chunks the input makes and which it built. ``--merge`` moves the
shards into ``OUTPUT`` and writes the single run's manifest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from bertforge.core.io import write_json_atomic
from bertforge.core.jsonfile import read_json_object
from bertforge.errors import DataError

PARTS_DIR = "parts"
PART_FILE = "part.json"


def part_dir(root: Path, part: tuple[int, int]) -> Path:
    """Where part ``(I, N)`` of the output ``root`` is prepared: ``root/parts/I-of-N``."""
    return root / PARTS_DIR / f"{part[0]}-of-{part[1]}"


def mine(index: int, part: tuple[int, int] | None) -> bool:
    """Whether chunk ``index`` is built by ``part`` (every chunk without one)."""
    return part is None or index % part[1] == part[0]


def write_part_record(folder: Path, part: tuple[int, int], fingerprint: str, chunks: int,
                      indices: Iterable[int]) -> None:
    """``part.json``: the mark of a finished part (written last)."""
    write_json_atomic(folder / PART_FILE, {"part": list(part), "fingerprint": fingerprint,
                                           "chunks": chunks, "indices": sorted(indices)})


def finished_parts(root: Path, fingerprint: str) -> list[tuple[Path, dict[str, Any]]]:
    """Every part of ``root`` with its record, checked: all N finished, prepared with the
    settings whose fingerprint is ``fingerprint``, and together every chunk exactly once.
    ``DataError`` naming what is wrong and what to run."""
    found: dict[int, set[int]] = {}
    for folder in sorted((root / PARTS_DIR).glob("*-of-*")):
        index, _, count = folder.name.partition("-of-")
        if index.isdigit() and count.isdigit():
            found.setdefault(int(count), set()).add(int(index))
    if not found:
        raise DataError(f"--merge: no parts in {root / PARTS_DIR}; run this command with --part "
                        "I/N (for I = 0..N-1) instead of --merge first")
    if len(found) > 1:
        counts = " and ".join(map(str, found))
        raise DataError(f"--merge: {root / PARTS_DIR} holds parts of {counts} runs; keep the "
                        "folders of one N (delete the others)")
    (count, indices), = found.items()
    parts = []
    for i in range(count):
        folder = part_dir(root, (i, count))
        if not (folder / PART_FILE).is_file():
            raise DataError(f"--merge: part {i}/{count} is not finished ({folder / PART_FILE} "
                            f"is missing); run this command with --part {i}/{count} (it resumes) "
                            "and merge again")
        record = read_json_object(folder / PART_FILE)
        if record.get("fingerprint") != fingerprint:
            raise DataError(f"--merge: part {i}/{count} ({folder}) was prepared with other "
                            "settings or inputs than this command's; merge with the parts' "
                            "settings, or prepare that part again with these")
        parts.append((folder, record))
    _check_chunks(parts, count)
    return parts


def _check_chunks(parts: list[tuple[Path, dict[str, Any]]], count: int) -> None:
    """Every part saw the same number of chunks, and built exactly its own."""
    totals = {record["chunks"] for _, record in parts}
    if len(totals) != 1:
        raise DataError(f"--merge: the parts read different inputs ({sorted(totals)} chunks); "
                        "were the input files changed while they ran? Prepare them again")
    total = totals.pop()
    for i, (folder, record) in enumerate(parts):
        if record["indices"] != [k for k in range(total) if k % count == i]:
            raise DataError(f"--merge: {folder / PART_FILE} does not list part {i}/{count}'s "
                            "chunks; prepare that part again")


def move_shard(source: Path, target: Path) -> None:
    """One shard from a part into the merged output (atomic; already moved: nothing to do)."""
    if source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
    elif not target.is_file():
        raise DataError(f"--merge: {source} is missing (and not merged yet); prepare its part "
                        "again")


__all__ = ["PARTS_DIR", "PART_FILE", "finished_parts", "mine", "move_shard", "part_dir",
           "write_part_record"]
