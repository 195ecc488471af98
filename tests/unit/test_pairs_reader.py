"""read_pairs / read_ranking: every format under both conventions (sentence-transformers'
columns, FlagEmbedding's objects), scores and margins, and each error naming file, line and
field. The texts of the column convention are checked against what Hugging Face datasets reads
from the same files (the loader sentence-transformers' trainer is fed from)."""

from __future__ import annotations

import csv
import gzip
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.data.finetuning.pairs import TextRows, read_pairs, read_ranking
from bertforge.errors import DataError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TRIPLETS = [
    {"anchor": "what is the capital of france?", "positive": "Paris is the capital.",
     "negative": 'Lyon, "the city of lights"?'},
    {"anchor": "who wrote hamlet", "positive": "Shakespeare wrote it\nin about 1600.",
     "negative": "Marlowe wrote Faust."},
    {"anchor": "größte stadt", "positive": "Berlin ist die größte Stadt.",
     "negative": "München liegt im Süden."},
]


def write(path: Path, rows: list[dict[str, Any]], *, bom: bool = False) -> Path:
    """``rows`` in the format the extension names (CSV quoted, TSV unquoted)."""
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
        return path
    if name.endswith((".jsonl", ".json")):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    else:
        out = _Lines()
        options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if name.endswith(".tsv") else {}
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n", **options)
        writer.writeheader()
        writer.writerows(rows)
        text = out.text
    data = (("\ufeff" if bom else "") + text).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


class _Lines:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s


def message(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text.split(": ", 1)[0]  # the place comes first, on one line
    return text


# --- sentence-transformers' columns ---------------------------------------------------------

@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.json", "t.parquet", "t.csv.gz",
                                  "t.jsonl.gz"])
def test_triplets_in_every_format(tmp_path: Path, name: str) -> None:
    rows = read_pairs(write(tmp_path / name, TRIPLETS, bom=True))
    assert rows.kind == "triplets"
    assert rows.columns == ("anchor", "positive", "negative_1")
    assert rows.texts == [(r["anchor"], r["positive"], r["negative"]) for r in TRIPLETS]
    assert rows.scores is None and rows.margins is None
    assert rows.source == str(tmp_path / name)
    if name.endswith(".parquet"):
        assert rows.lines == [1, 2, 3]
    elif "csv" in name:
        assert rows.lines == [2, 3, 5]  # row 2's quoted positive spans lines 3-4
    else:
        assert rows.lines == [1, 2, 3]


def test_tsv_is_unquoted(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text('sentence1\tsentence2\n"quoted\tit\'s "half\n', encoding="utf-8")
    rows = read_pairs(path)
    assert rows.kind == "pairs" and rows.texts == [('"quoted', 'it\'s "half')]


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.parquet"])
def test_texts_match_hugging_face_datasets(tmp_path: Path, name: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The columns, in order, are what a datasets.Dataset of the file holds, the label left out
    (sentence-transformers' own convention for its trainer's inputs)."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    table = [{**r, "score": 0.25 * i} for i, r in enumerate(TRIPLETS)]
    path = write(tmp_path / name, table)
    builder = {"t.csv": "csv", "t.jsonl": "json", "t.parquet": "parquet"}[name]
    reference = datasets.load_dataset(builder, data_files=str(path), split="train",
                                      cache_dir=str(tmp_path / "cache"))
    inputs = [c for c in reference.column_names if c not in ("label", "score")]
    rows = read_pairs(path)
    assert rows.texts == [tuple(r[c] for c in inputs) for r in reference]
    np.testing.assert_array_equal(rows.margins[:, 0], np.float32(reference["score"]))


def test_pairs_scored_and_margins(tmp_path: Path) -> None:
    pairs = read_pairs(write(tmp_path / "p.csv", [{"query": "q", "answer": "a"},
                                                  {"query": "r", "answer": "b"}]))
    assert pairs.kind == "pairs" and pairs.columns == ("anchor", "positive")
    assert pairs.texts == [("q", "a"), ("r", "b")]

    scored = read_pairs(write(tmp_path / "s.jsonl", [
        {"sentence1": "a", "sentence2": "b", "score": 0.8},
        {"sentence1": "c", "sentence2": "d", "score": -1}]))
    assert scored.kind == "scored" and scored.columns == ("sentence1", "sentence2")
    assert scored.scores.dtype == np.float32
    np.testing.assert_array_equal(scored.scores, np.float32([0.8, -1.0]))

    one = read_pairs(write(tmp_path / "m.csv", [
        {"anchor": "a", "positive": "p", "negative": "n", "label": "1.5"}]))
    assert one.kind == "triplets" and one.margins.shape == (1, 1) and one.margins[0, 0] == 1.5

    many = [{"q": "a", "p": "b", "n1": "c", "n2": "d", "label": [0.5, 2.0]}]
    listed = read_pairs(write(tmp_path / "l.jsonl", many))
    assert listed.columns == ("anchor", "positive", "negative_1", "negative_2")
    np.testing.assert_array_equal(listed.margins, np.float32([[0.5, 2.0]]))
    in_csv = read_pairs(write(tmp_path / "l.csv", [{**many[0], "label": "[0.5, 2]"}]))
    np.testing.assert_array_equal(in_csv.margins, listed.margins)


def test_id_columns_are_not_texts_and_max_rows_cuts(tmp_path: Path) -> None:
    table = [{"id": i, "anchor": f"a{i}", "positive": f"p{i}"} for i in range(10)]
    rows = read_pairs(write(tmp_path / "t.jsonl", table), max_rows=4)
    assert rows.kind == "pairs" and rows.texts == [(f"a{i}", f"p{i}") for i in range(4)]
    assert len(rows) == 4 and rows.lines == [1, 2, 3, 4] and rows.where(2).endswith("t.jsonl:3")


# --- FlagEmbedding's objects ----------------------------------------------------------------

FLAG = [
    {"query": "q1", "pos": ["p1", "p2"], "neg": ["n1", "n2", "n3"], "pos_scores": [0.9, 0.8],
     "neg_scores": [0.5, 0.25, 0.0], "prompt": "Represent: "},
    {"query": "q2", "pos": ["p3"], "neg": ["n4", "n5"], "pos_scores": [1.0],
     "neg_scores": [0.125, 0.75], "prompt": "Represent: "},
]


@pytest.mark.parametrize("name", ["f.jsonl", "f.parquet"])
def test_flag_embedding_uneven_negatives(tmp_path: Path, name: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        rows = read_pairs(write(tmp_path / name, FLAG))
    assert rows.kind == "triplets"
    assert rows.columns == ("anchor", "positive", "negative_1", "negative_2")
    assert rows.texts == [("Represent: q1", "p1", "n1", "n2"), ("Represent: q1", "p2", "n1", "n2"),
                          ("Represent: q2", "p3", "n4", "n5")]
    assert rows.lines == [1, 1, 2]
    np.testing.assert_allclose(rows.margins, np.float32([[0.4, 0.65], [0.3, 0.55],
                                                         [0.875, 0.25]]), rtol=1e-6)
    warned = [r.getMessage() for r in caplog.records if "negatives" in r.getMessage()]
    assert len(warned) == 1 and "between 2 and 3" in warned[0] and "dropping 2" in warned[0]


def test_flag_embedding_without_negatives_and_scores(tmp_path: Path) -> None:
    rows = read_pairs(write(tmp_path / "f.jsonl", [{"query": "q", "pos": ["a", "b"]}]))
    assert rows.kind == "pairs" and rows.texts == [("q", "a"), ("q", "b")]
    assert rows.margins is None


def test_flag_embedding_row_without_negatives_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "f.jsonl", [{"query": "q", "pos": ["a"], "neg": ["x"]},
                                        {"query": "r", "pos": ["b"], "neg": []}])
    with pytest.raises(DataError) as exc:
        read_pairs(path)
    text = message(exc)
    assert text.startswith(f"{path}:2: no negatives") and f"{path}:1" in text


@pytest.mark.parametrize("row, expected", [
    ({"query": "q", "pos": []}, ":1: field 'pos' is an empty list"),
    ({"query": "q", "pos": ["a", ""]}, ":1: field 'pos[1]' is empty"),
    ({"query": "q", "pos": ["a"], "neg": [3]}, ":1: field 'neg[0]' holds a number, not text"),
    ({"query": "q", "pos": "a", "neg": {"x": 1}}, ":1: field 'neg' holds an object"),
    ({"query": "", "pos": ["a"]}, ":1: field 'query' is empty"),
    ({"query": "q", "pos": ["a"], "pos_scores": [1.0]}, ":1: field 'neg_scores' holds nothing"),
    ({"query": "q", "pos": ["a"], "neg": ["b"], "pos_scores": [1.0], "neg_scores": [1, 2]},
     ":1: field 'neg_scores' holds a list of integers where the row's texts need a list of 1"),
])
def test_flag_embedding_errors(tmp_path: Path, row: dict, expected: str) -> None:
    if "neg_scores" in expected and "nothing" in expected:
        row = {**row, "neg": ["b"]}
    path = write(tmp_path / "f.jsonl", [row])
    with pytest.raises(DataError) as exc:
        read_pairs(path)
    assert message(exc).startswith(f"{path}{expected}")


def test_flag_embedding_scores_on_every_row_or_none(tmp_path: Path) -> None:
    path = write(tmp_path / "f.jsonl", [{"query": "q", "pos": ["a"], "neg": ["b"]},
                                        {"query": "r", "pos": ["c"], "neg": ["d"],
                                         "pos_scores": [1], "neg_scores": [0]}])
    with pytest.raises(DataError, match=r"f\.jsonl:2: field 'pos_scores' is given but the "
                                        r"first row has none"):
        read_pairs(path)


# --- text-ranking ---------------------------------------------------------------------------

def test_ranking_pointwise(tmp_path: Path) -> None:
    table = [{"label": 1, "passage": "Paris.", "query": "capital?"},
             {"label": 0, "passage": "Lyon.", "query": "capital?"},
             {"label": 0.25, "passage": "Nice.", "query": "capital?"}]
    rows = read_ranking(write(tmp_path / "r.csv", table))
    assert rows.kind == "pointwise" and rows.columns == ("query", "passage")
    assert rows.texts[0] == ("capital?", "Paris.")  # by name, not in file order
    np.testing.assert_array_equal(rows.scores, np.float32([1, 0, 0.25]))

    other = read_ranking(write(tmp_path / "r.jsonl", [
        {"question": "q", "doc": "d", "score": True}, {"question": "q", "doc": "e",
                                                       "score": False}]))
    assert other.kind == "pointwise" and other.texts == [("q", "d"), ("q", "e")]
    np.testing.assert_array_equal(other.scores, np.float32([1, 0]))


def test_ranking_listwise(tmp_path: Path) -> None:
    rows = read_ranking(write(tmp_path / "l.parquet", TRIPLETS))
    assert rows.kind == "listwise" and rows.columns == ("query", "positive", "negative_1")
    assert rows.texts[1] == tuple(TRIPLETS[1].values())
    flag = read_ranking(write(tmp_path / "f.jsonl", [{**FLAG[1], "prompt": None}]))
    assert flag.kind == "listwise" and flag.texts == [("q2", "p3", "n4", "n5")]
    np.testing.assert_array_equal(flag.margins, np.float32([[0.875, 0.25]]))
    pairs = read_ranking(write(tmp_path / "p.csv", [{"query": "q", "positive": "p"}]))
    assert pairs.kind == "listwise" and pairs.columns == ("query", "positive")


def test_ranking_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "r.csv", [{"query": "q", "passage": "p", "label": "1"},
                                      {"query": "q", "passage": "p", "label": "3"}])
    with pytest.raises(DataError) as exc:
        read_ranking(path)
    assert message(exc).startswith(f"{path}:3: label 3 in field 'label' is outside [0, 1]")
    path = write(tmp_path / "x.csv", [{"a": "q", "b": "p", "c": "n", "label": "1"}])
    with pytest.raises(DataError, match=r"x\.csv: a label column and 3 text columns"):
        read_ranking(path)


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, content, expected", [
    ("e.jsonl", "", ": no rows"),
    ("e.csv", "anchor,positive\n", ": no rows"),
    ("e.csv", "text,label\nhello,1\n", ": 1 text column(s) (found: 'text', 'label')"),
    ("e.csv", "anchor,positive\na,\n", ":2: field 'positive' is empty"),
    ("e.csv", "anchor,positive\na,b\nc,d,e\n", ":3: 3 fields where the header (line 1)"),
    ("e.csv", 'anchor,positive\na,"b\n', ":2: not valid CSV"),
    ("e.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n',
     ":2: no value in field 'positive'"),
    ("e.jsonl", '{"anchor": "a", "positive": 5}\n', ":1: field 'positive' holds a number"),
    ("e.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": \n', ":2:12: not valid JSON"),
    ("e.jsonl", '["a", "b"]\n', ":1: a JSON list, not an object"),
    ("e.csv", "anchor,positive,score\na,b,high\n", ":2: field 'score' holds 'high', not a finite"),
    ("e.csv", "anchor,positive,score\na,b,\n", ":2: field 'score' holds nothing"),
    ("e.csv", "a,p,n1,n2,label\na,b,c,d,1\n",
     ":2: field 'label' holds one number but the row has 2 negatives"),
    ("e.jsonl", '{"a": "x", "p": "y", "n": "z", "label": [1, 2]}\n',
     ":1: field 'label' holds 2 margin(s) for 1 negative(s)"),
    ("e.csv", "anchor,positive,label,score\na,b,1,2\n", ": both 'label' and 'score' columns"),
    ("e.csv", "anchor,anchor\na,b\n", ":1: the header names column(s) 'anchor' more than once"),
    ("e.xlsx", "x", ": cannot tell the format from the extension '.xlsx'"),
])
def test_errors_name_file_line_and_field(tmp_path: Path, name: str, content: str,
                                         expected: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as exc:
        read_pairs(path)
    assert message(exc).startswith(f"{path}{expected}")


def test_bad_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"anchor,positive\na,b\nc,\xff\n")
    with pytest.raises(DataError, match=r"bad\.csv:3: not UTF-8 text \(byte 0xff\)"):
        read_pairs(path)


def test_missing_file_and_parquet_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_pairs(tmp_path / "none.jsonl")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: not a readable Parquet file"):
        read_pairs(broken)
    good = write(tmp_path / "good.parquet", [{"anchor": "a", "positive": 1}])
    with pytest.raises(DataError, match=r"good\.parquet row 1: field 'positive' holds a number"):
        read_pairs(good)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if pyarrow were missing
    with pytest.raises(DataError) as exc:
        read_pairs(good)
    assert "pip install bertforge[parquet]" in message(exc)
    assert read_pairs(write(tmp_path / "t.jsonl", TRIPLETS[:1])).kind == "triplets"


def test_max_rows_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="max_rows=0 must be at least 1"):
        read_pairs(write(tmp_path / "t.jsonl", TRIPLETS), max_rows=0)


def test_text_rows_is_frozen() -> None:
    rows = TextRows(("anchor", "positive"), [("a", "b")], "pairs")
    with pytest.raises(AttributeError):
        rows.kind = "triplets"  # type: ignore[misc]
    assert rows.where(0) == ""
