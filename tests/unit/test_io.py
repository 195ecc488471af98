"""Atomic writes: content, permissions, failure leaves the old file, temp names, JSON bytes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bertforge.data.native_writer import remove_temp_files
from bertforge.core.io import atomic_write, temp_name, write_json_atomic, write_text_atomic


def test_text_is_written_exactly_with_umask_permissions(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    old = os.umask(0o027)
    try:
        assert write_text_atomic(target, "één\r\ntwee\n") == target
    finally:
        os.umask(old)
    assert target.read_bytes() == "één\r\ntwee\n".encode("utf-8")  # no newline translation
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # 0o666 & ~umask, not mkstemp's 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path,
                                                                error: BaseException) -> None:
    target = tmp_path / "shard.bin"
    target.write_bytes(b"old")
    seen: list[Path] = []

    def write(tmp: Path) -> None:
        seen.append(tmp)
        tmp.write_bytes(b"half of the new")
        raise error

    with pytest.raises(type(error)):
        atomic_write(target, write)
    assert target.read_bytes() == b"old"
    assert seen[0].parent == tmp_path and not seen[0].exists()
    assert [p.name for p in tmp_path.iterdir()] == ["shard.bin"]


def test_writer_gets_an_existing_sibling_path_and_replaces_the_target(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    target.write_text("old")

    def write(tmp: Path) -> None:
        assert tmp.is_file() and tmp.stat().st_size == 0 and tmp.parent == tmp_path
        assert tmp.name.startswith(".m.json.tmp-")
        tmp.write_text("new")

    atomic_write(target, write, fsync=False)
    assert target.read_text() == "new"


def test_temp_names_are_unique_and_cleaned_up_as_leftovers(tmp_path: Path) -> None:
    target = tmp_path / "train" / "shard-00000.safetensors"
    target.parent.mkdir()
    names = {temp_name(target) for _ in range(50)}
    assert len(names) == 50
    leftover = next(iter(names))
    leftover.write_bytes(b"a killed writer's half shard")
    target.write_bytes(b"finished")
    remove_temp_files(tmp_path, ["train"])
    assert [p.name for p in target.parent.iterdir()] == [target.name]


def test_json_bytes_depend_only_on_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_json_atomic(a, {"z": 1, "a": [1, 2], "é": "ü"})
    write_json_atomic(b, {"é": "ü", "a": [1, 2], "z": 1})
    assert a.read_bytes() == b.read_bytes()
    assert a.read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "z": 1,\n  "\\u00e9": "\\u00fc"\n}\n'
    write_json_atomic(b, {"z": 1, "é": "ü"}, sort_keys=False, ensure_ascii=False)
    assert b.read_text(encoding="utf-8") == '{\n  "z": 1,\n  "é": "ü"\n}\n'
    assert json.loads(a.read_text()) == {"a": [1, 2], "z": 1, "é": "ü"}
