"""Corpora as they come: Parquet, Zstandard-compressed files and Hugging Face datasets (a
save_to_disk folder, a Hub name from the local cache), each with its bad-input paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.data.columns import DatasetInput, hub_input
from bertforge.data.corpus import ReadStats, expand_inputs, iter_corpus, iter_documents
from bertforge.errors import ConfigError, DataError
from hub_cache import fill_datasets_cache

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

TEXTS = ["First doc. Two sentences.", "Second doc.\n\nIts second paragraph.", "Third doc here."]


def read(source, **kwargs) -> tuple[list, list[str], ReadStats]:
    warnings: list[str] = []
    stats = ReadStats()
    docs = list(iter_documents(source, warn=warnings.append, stats=stats, **kwargs))
    return docs, warnings, stats


def jsonl(texts) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


# -- Parquet ----------------------------------------------------------------------------------


def test_parquet_rows_are_documents_by_row_group(tmp_path: Path) -> None:
    path = tmp_path / "web.parquet"
    table = pa.table({"id": [1, 2, 3, 4], "text": [TEXTS[0], None, TEXTS[1], TEXTS[2]]})
    pq.write_table(table, path, row_group_size=2)
    docs, warnings, stats = read(path)
    assert [d.lines for d in docs] == [[TEXTS[0]], ["Second doc.", "Its second paragraph."],
                                       [TEXTS[2]]]
    assert [d.source for d in docs] == [f"{path} row {n}" for n in (1, 3, 4)]
    assert warnings == [f"{path} row 2: field 'text' is null; row skipped (choose the field "
                        "with --text-field)"]
    assert stats.documents == 3 and stats.files_read == 1
    assert stats.input_bytes == path.stat().st_size
    assert stats.text_bytes == sum(len(t.encode()) for t in TEXTS)


def test_parquet_text_field_and_dictionary_columns(tmp_path: Path) -> None:
    path = tmp_path / "web.parquet"
    body = pa.array(["Dictionary encoded text.", "Again."]).dictionary_encode()
    pq.write_table(pa.table({"body": body}), path)
    docs, warnings, _ = read(path, text_field="body")
    assert [d.lines for d in docs] == [["Dictionary encoded text."], ["Again."]] and not warnings


@pytest.mark.parametrize("table, reason", [
    ({"body": ["x"]}, "no column 'text' (columns: body); name the text column with --text-field"),
    ({"text": [1, 2]}, "column 'text' holds int64, not text; name the text column with "
                       "--text-field"),
])
def test_parquet_without_a_text_column_is_skipped_with_the_reason(tmp_path: Path, table,
                                                                   reason: str) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(table), path)
    docs, warnings, stats = read(path)
    assert docs == [] and warnings == [f"skipping {path}: {reason}"]
    assert stats.skipped == [(str(path), reason)]


def test_truncated_parquet_is_skipped_and_a_broken_row_group_keeps_the_rows_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "web.parquet"
    pq.write_table(pa.table({"text": TEXTS}), path, row_group_size=2)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(path.read_bytes()[:-40])
    docs, warnings, _ = read(cut)
    assert docs == [] and warnings[0].startswith(f"skipping {cut}: not a readable Parquet file")
    assert warnings[0].endswith("truncated, or not Parquet") and len(warnings) == 1

    real = pq.ParquetFile.iter_batches

    def second_group_fails(self, *args, row_groups=None, **kwargs):
        if row_groups == [1]:
            raise OSError("Corrupt snappy compressed data.")
        return real(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", second_group_fails)
    docs, warnings, _ = read(path)
    assert len(docs) == 2 and warnings == [
        f"{path}: row group 2 of 2 cannot be read (Corrupt snappy compressed data.); the file is "
        "damaged. Keeping the 2 row(s) read before it."]


# -- Zstandard --------------------------------------------------------------------------------


def test_zstd_jsonl_and_text_read_like_their_plain_forms(tmp_path: Path) -> None:
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.zst"
    plain.write_bytes(jsonl(TEXTS))
    # Two frames, as `cat x.zst y.zst` makes: both are read.
    packed.write_bytes(zstandard.ZstdCompressor().compress(jsonl(TEXTS[:2]))
                       + zstandard.ZstdCompressor().compress(jsonl(TEXTS[2:])))
    want, _, _ = read(plain)
    got, warnings, stats = read(packed)
    assert [d.lines for d in got] == [d.lines for d in want] and not warnings
    assert stats.input_bytes == packed.stat().st_size
    text = tmp_path / "c.txt.zst"
    text.write_bytes(zstandard.ZstdCompressor().compress(b"One. Two.\n\nThree.\n"))
    docs, _, _ = read(text)
    assert [d.lines for d in docs] == [["One. Two."], ["Three."]]


def test_truncated_zstd_keeps_the_lines_before_the_cut(tmp_path: Path) -> None:
    lines = [f"Document number {i} has words in it." for i in range(40_000)]
    whole = zstandard.ZstdCompressor(level=1).compress(jsonl(lines))
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(whole[: len(whole) // 2])
    docs, warnings, _ = read(path)
    assert 0 < len(docs) < len(lines) and docs[-1].lines == [lines[len(docs) - 1]]
    assert len(warnings) == 1 and "reading stopped early (the compressed stream ends inside a " \
        "Zstandard frame); the file is truncated or corrupt" in warnings[0]
    small = tmp_path / "small.txt.zst"
    small.write_bytes(zstandard.ZstdCompressor().compress(b"Short text.\n")[:-3])
    docs, warnings, _ = read(small)
    assert docs == [] and warnings == [f"skipping {small}: cannot decompress (the compressed "
                                       "stream ends inside a Zstandard frame); corrupt, or not "
                                       "really .zst"]


def test_zstd_without_the_package_is_one_clear_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(jsonl(TEXTS)))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(DataError, match=r"a\.jsonl\.zst: reading \.zst needs zstandard; install "
                                        r"it with `pip install zstandard`"):
        read(path)


# -- Hugging Face datasets --------------------------------------------------------------------


def test_save_to_disk_folders_and_their_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    one = datasets.Dataset.from_dict({"text": TEXTS, "n": [1, 2, 3]})
    one.save_to_disk(str(tmp_path / "corpus" / "saved"))
    (tmp_path / "corpus" / "notes.txt").write_text("A file beside it.\n")
    found = expand_inputs([tmp_path / "corpus"])
    assert found == [tmp_path / "corpus" / "notes.txt",
                     DatasetInput(str(tmp_path / "corpus" / "saved"), hub=False)]
    docs, warnings, stats = read(found[1])
    assert [d.source for d in docs] == [f"{tmp_path / 'corpus' / 'saved'} row {n}"
                                        for n in (1, 2, 3)]
    assert docs[1].lines == ["Second doc.", "Its second paragraph."] and not warnings
    assert stats.input_bytes == found[1].size() > 0

    splits = datasets.DatasetDict({"validation": one.select([0]), "train": one.select([1, 2])})
    splits.save_to_disk(str(tmp_path / "dict"))
    docs, _, _ = read(expand_inputs([tmp_path / "dict"])[0])  # train by default
    assert [d.lines[0] for d in docs] == ["Second doc.", TEXTS[2]]
    docs, _, _ = read(expand_inputs([f"{tmp_path / 'dict'}@validation"])[0])
    assert [d.lines[0] for d in docs] == [TEXTS[0]]
    with pytest.raises(DataError, match=r"dict@test: no split 'test' \(splits: validation, "
                                        r"train\); give .*dict@SPLIT"):
        read(expand_inputs([f"{tmp_path / 'dict'}@test"])[0])
    docs, warnings, _ = read(found[1], text_field="body")
    assert docs == [] and "no column 'body' (columns: text, n)" in warnings[0]


def test_hub_names_parse_and_bad_ones_say_the_form() -> None:
    assert hub_input("hf://acme/web:en@train") == DatasetInput("acme/web", True, "en", "train")
    assert str(hub_input("hf://acme/web")) == "hf://acme/web"
    for bad in ("hf://", "hf://a/b/c", "hf://acme/web@", "hf://acme/web:"):
        with pytest.raises(ConfigError, match=r"not a Hub dataset name; write "
                                              r"hf://ORG/NAME\[:CONFIG\]\[@SPLIT\]"):
            hub_input(bad)


def test_hub_dataset_streams_from_the_cache_offline_and_says_what_to_do_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    cache = tmp_path / "hf" / "datasets"
    fill_datasets_cache(cache, "acme/web", {"text": TEXTS, "url": ["u"] * len(TEXTS)})
    offline_datasets(monkeypatch, cache)
    source = expand_inputs(["hf://acme/web"])[0]
    docs, warnings, stats = read(source)
    assert [d.source for d in docs] == [f"hf://acme/web row {n}" for n in (1, 2, 3)]
    assert docs[2].lines == [TEXTS[2]] and not warnings and stats.input_bytes == 0
    with pytest.raises(DataError) as missing:
        read(expand_inputs(["hf://acme/other@train"])[0])
    message = str(missing.value)
    assert "\n" not in message and message.startswith(
        f"--input hf://acme/other@train: acme/other is not in the local datasets cache ({cache}) "
        "and HF_HUB_OFFLINE is set; load it once with network access")
    assert "hf download --repo-type dataset acme/other" in message and "save_to_disk" in message
    with pytest.raises(DataError, match=r"hf://acme/web@test: Bad split: test"):
        read(expand_inputs(["hf://acme/web@test"])[0])


def offline_datasets(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """datasets offline, its cache at ``cache`` (the suite's Hub is offline already)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


# -- what the package imports -----------------------------------------------------------------


def test_importing_the_readers_loads_no_format_library() -> None:
    code = ("import sys, bertforge, bertforge.data.corpus, bertforge.data.prepare; "
            "print([m for m in ('pyarrow', 'zstandard', 'datasets') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"


def test_iter_corpus_mixes_every_form(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": TEXTS[:1]}), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(TEXTS[1:])))
    warnings: list[str] = []
    docs = list(iter_corpus([tmp_path], warn=warnings.append))
    assert [d.lines[0] for d in docs] == [TEXTS[0], "Second doc.", TEXTS[2]] and not warnings


def test_vocab_from_parquet_equals_vocab_from_jsonl(tmp_path: Path) -> None:
    from bertforge.tokenization.training import train_wordpiece

    texts = [f"{t} Word{i % 7} appears here, again and again." for i, t in
             enumerate(TEXTS * 20)]
    (tmp_path / "a.jsonl").write_bytes(jsonl(texts))
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet", row_group_size=16)
    for name in ("a.jsonl", "a.parquet"):
        train_wordpiece([tmp_path / name], vocab_size=120,
                        output=tmp_path / f"{name}-vocab" / "vocab.txt", progress=False)
    want = (tmp_path / "a.jsonl-vocab" / "vocab.txt").read_text()
    assert (tmp_path / "a.parquet-vocab" / "vocab.txt").read_text() == want
    assert len(want.split()) > 60
