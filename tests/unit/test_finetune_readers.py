"""Table reading, the user's own classification data and label maps (bertforge.data.finetuning).

Samples live in tests/assets/finetune/; broken files are written per test so that each error
message can be checked for the file and line it names.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from bertforge.data.finetuning import (
    LabelMap, TaggedExample, TextExample, read_classification, read_table,
)
from bertforge.errors import DataError, UserError

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "finetune"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


def raises(match: str):
    return pytest.raises(DataError, match=re.escape(match))


# --- tables ---------------------------------------------------------------------------------

def test_csv_rows_keep_their_start_lines_across_quoted_newlines() -> None:
    table = read_table(ASSETS / "reviews.csv")
    assert table.format == "csv" and table.columns == ["text", "label"]
    assert [r.line for r in table.rows] == [2, 3, 5]
    assert table.rows[1].fields == {"text": "Dull.\nVery dull.", "label": "neg"}
    assert table.where(table.rows[2]) == f"{ASSETS / 'reviews.csv'}:5"


def test_tsv_keeps_quotes_as_text_and_drops_the_bom() -> None:
    table = read_table(ASSETS / "mrpc.tsv")
    assert table.columns[0] == "Quality"
    assert table.rows[0].fields["#1 String"] == 'He called him "the witness.'


def test_headerless_tsv_takes_the_given_columns() -> None:
    table = read_table(ASSETS / "cola_raw.tsv", columns=["a", "b", "c", "d"])
    assert len(table.rows) == 3 and table.rows[0].line == 1
    assert table.rows[1].fields == {"a": "bc01", "b": "0", "c": "*", "d": "Cat the mat on sat."}


def test_jsonl_columns_in_order_of_first_use_and_blank_lines_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, "d.json", '{"a": 1}\n\n{"b": "x", "a": 2}\r\n')
    table = read_table(path)
    assert table.columns == ["a", "b"]
    assert [(r.line, r.fields) for r in table.rows] == [(1, {"a": 1}), (3, {"b": "x", "a": 2})]


def test_gzip_and_crlf(tmp_path: Path) -> None:
    path = write(tmp_path, "d.tsv.gz", gzip.compress(b"sentence\tlabel\r\nfine\t1\r\nbad\t0\r\n"))
    table = read_table(path)
    assert table.format == "tsv" and [r.fields["label"] for r in table.rows] == ["1", "0"]


@pytest.mark.parametrize("name,content,message", [
    ("e.csv", "", "e.csv: the file is empty"),
    ("e.tsv", "\n \n", "e.tsv: the file is empty"),
    ("h.csv", "text,label\n", "h.csv: the file has a header line but no rows"),
    ("e.jsonl", "\n", "e.jsonl: the file is empty"),
    ("w.tsv", "a\tb\n1\t2\n1\t2\t3\n", "w.tsv:3: 3 fields where the header (line 1) has 2"),
    ("w.csv", "a,b\n1,2\n\n1\n", "w.csv:4: 1 field where the header (line 1) has 2"),
    ("q.csv", 'a,b\n1,"2\n', "q.csv:2: not valid CSV"),
    ("d.csv", "a,b,a\n1,2,3\n", "d.csv:1: the header names column(s) 'a' more than once"),
    ("j.jsonl", '{"a": 1}\n{"a": 2,}\n', "j.jsonl:2:9: not valid JSON"),
    ("l.jsonl", '{"a": 1}\n[1, 2]\n', "l.jsonl:2: a JSON list, not an object"),
    ("o.json", '{\n "data": [1]\n}\n', "o.json:1:2: not valid JSON"),
    ("x.xlsx", "a", "x.xlsx: cannot tell the format from the extension '.xlsx'"),
    ("u.tsv", b"a\tb\n1\t2\n3\t\xe9t\xe9\n", "u.tsv:3: not UTF-8 text (byte 0xe9)"),
    ("z.csv.gz", b"not gzip", "z.csv.gz: not a complete gzip file"),
])
def test_table_errors_name_file_and_line(tmp_path: Path, name: str, content: str | bytes,
                                         message: str) -> None:
    path = write(tmp_path, name, content)
    with raises(str(tmp_path / message)):
        read_table(path)


def test_single_json_document_is_explained(tmp_path: Path) -> None:
    path = write(tmp_path, "o.json", '{\n "data": [1]\n}\n')
    with raises("the file is one JSON document; write one object per line"):
        read_table(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with raises(f"{tmp_path / 'nope.csv'}: no such file"):
        read_table(tmp_path / "nope.csv")
    with raises(f"{tmp_path}: is a directory"):
        read_table(tmp_path)


def test_data_error_is_a_user_error() -> None:
    assert issubclass(DataError, UserError)


# --- read_classification --------------------------------------------------------------------

def test_single_texts_detected_from_text_and_label() -> None:
    examples = read_classification(ASSETS / "reviews.csv")
    assert examples[0] == TextExample("0", "Great film, would watch again", None, "pos",
                                      f"{ASSETS / 'reviews.csv'}:2")
    assert [e.label for e in examples] == ["pos", "neg", "neu"]


def test_pairs_regression_and_id_column() -> None:
    examples = read_classification(ASSETS / "pairs.jsonl", regression=True)
    assert [(e.id, e.text_b, e.label) for e in examples] == [
        ("a1", "The sky has a colour.", 3.5), ("a2", "It is dry.", 0.0)]


def test_pairs_win_over_single_columns() -> None:
    examples = read_classification(ASSETS / "qnli_hf.csv")
    assert examples[0].text_a == "Who wrote it, and when?"
    assert examples[1].text_b == 'The "house" is far.'
    assert (examples[0].id, examples[0].label) == ("7", "0")


def test_given_columns_ignore_case(tmp_path: Path) -> None:
    path = write(tmp_path, "d.tsv", "Review\tStars\tSentence\ngood\t5\tx\nbad\t1\ty\n")
    examples = read_classification(path, text_columns=["review"], label_column="stars")
    assert [(e.text_a, e.label) for e in examples] == [("good", "5"), ("bad", "1")]


def test_json_numbers_as_class_names(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 0.0}\n')
    assert [e.label for e in read_classification(path)] == ["1", "0"]


def test_prediction_without_labels(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "sentence\nhello\n")
    assert read_classification(path, require_labels=False)[0].label is None
    path = write(tmp_path, "e.csv", "sentence,label\nhello,\nbye,b\n")
    assert [e.label for e in read_classification(path, require_labels=False)] == [None, "b"]


def test_auto_detection_failure_lists_columns_and_options(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "body,stars\nx,1\n")
    with raises(f"{path}: cannot tell which columns hold the text (found: 'body', 'stars'); "
                "set data.text_columns"):
        read_classification(path)
    with raises(f"{path}: no label column (looked for label, labels, score, target, class; "
                "found: 'body', 'stars'); set data.label_column"):
        read_classification(path, text_columns=["body"])


@pytest.mark.parametrize("kwargs,message", [
    ({"text_columns": ["title"]}, "d.csv: no column 'title' (found: 'text', 'label'); fix data.text_columns"),
    ({"label_column": "y"}, "d.csv: no column 'y' (found: 'text', 'label'); fix data.label_column"),
    ({"text_columns": ["text", "label", "text"]}, "data.text_columns names 3 columns"),
])
def test_bad_column_options(tmp_path: Path, kwargs: dict, message: str) -> None:
    path = write(tmp_path, "d.csv", "text,label\nx,1\n")
    with raises(message if message.startswith("data") else str(tmp_path / message)):
        read_classification(path, **kwargs)


def test_missing_label_or_text_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "text,label\nx,1\ny,\n")
    with raises(f"{path}:3: no label in column 'label'"):
        read_classification(path)
    path = write(tmp_path, "d.jsonl", '{"text": "x", "label": "a"}\n{"label": "b"}\n')
    with raises(f"{path}:2: no value in column 'text'"):
        read_classification(path)
    path = write(tmp_path, "l.jsonl", '{"text": ["x"], "label": "a"}\n')
    with raises(f"{path}:1: column 'text' holds a JSON list, not text"):
        read_classification(path)


def test_regression_label_must_be_a_number(tmp_path: Path) -> None:
    path = write(tmp_path, "d.tsv", "text\tscore\nx\t1.5\ny\thigh\n")
    with raises(f"{path}:3: label 'high' in column 'score' is not a finite number"):
        read_classification(path, regression=True)


# --- LabelMap -------------------------------------------------------------------------------

def test_label_map_from_training_examples_is_sorted() -> None:
    labels = LabelMap.from_examples(read_classification(ASSETS / "reviews.csv"))
    assert labels.names == ["neg", "neu", "pos"] and len(labels) == 3
    assert labels.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert labels.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert labels.id("pos", "x.csv:2") == 2 and labels.name(1) == "neu"
    with raises("dev.csv:7: label 'bad' was not seen in the training data "
                "(labels: neg, neu, pos)"):
        labels.id("bad", "dev.csv:7")


def test_label_map_of_tags_and_fixed_names() -> None:
    examples = [TaggedExample("0", ["a", "b"], ["O", "B-X"], "t.txt:1"),
                TaggedExample("1", ["c"], None, "t.txt:4")]
    assert LabelMap.from_examples(examples).names == ["B-X", "O"]
    fixed = LabelMap.from_examples([], names=["yes", "no"])
    assert fixed.names == ["yes", "no"] and fixed.fixed
    with raises("t.csv:3: label 'maybe' was not one of the task's labels (labels: yes, no)"):
        LabelMap.from_examples([TextExample("0", "x", None, "maybe", "t.csv:3")],
                               names=["yes", "no"])
    with pytest.raises(ValueError):
        LabelMap(["a", "a"])
