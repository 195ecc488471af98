"""SWAG multiple choice and CoNLL / JSON Lines token tagging readers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bertforge.data.finetuning import ChoiceExample, TaggedExample, read_swag, read_token_tags
from bertforge.errors import DataError

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "finetune"
CONLL2003_NAMES = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"


def raises(match: str):
    return pytest.raises(DataError, match=re.escape(match))


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


# --- SWAG -----------------------------------------------------------------------------------

def test_swag_train() -> None:
    examples = read_swag(ASSETS / "swag_train.csv")
    first = examples[0]
    assert first.context == ("Members of the procession walk down the street holding small horn "
                             "brass instruments.")
    assert first.start == "A drum line" and first.label == 0 and first.id == "0"
    assert first.endings[0] == "passes by walking down the street playing their instruments."
    assert len(first.endings) == 4
    assert first.pairs()[1] == (first.context, "A drum line has heard approaching them.")
    assert examples[1].endings[1] == "smiles, then waves." and examples[1].label == 3
    assert examples[1].source == f"{ASSETS / 'swag_train.csv'}:3"


def test_swag_test_without_labels() -> None:
    examples = read_swag(ASSETS / "swag_test.csv", require_labels=False)
    assert examples == [ChoiceExample("0", "Someone stands.", "Someone",
                                      ["sits down.", "flies away.", "melts.", "sings a song."],
                                      None, f"{ASSETS / 'swag_test.csv'}:2")]
    with raises(f"{ASSETS / 'swag_test.csv'}: no column 'label'"):
        read_swag(ASSETS / "swag_test.csv")


def test_swag_jsonl_export(tmp_path: Path) -> None:
    path = write(tmp_path, "s.jsonl", '{"sent1": "A.", "sent2": "He", "ending0": "x", '
                                      '"ending1": "y", "label": 1, "fold-ind": "5"}\n')
    example = read_swag(path)[0]
    assert (example.id, example.endings, example.label) == ("0", ["x", "y"], 1)


def test_swag_missing_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "sent1,ending0,label\na,b,0\n")
    with raises(f"{path}: not a SWAG file: no column(s) sent2, ending1 (found: 'sent1', "
                "'ending0', 'label')"):
        read_swag(path)


@pytest.mark.parametrize("label,shown", [("4", "'4'"), ("b", "'b'"), ("", None)])
def test_swag_bad_labels(tmp_path: Path, label: str, shown: str | None) -> None:
    path = write(tmp_path, "s.csv", f"{SWAG_HEADER},label\n0,v,1,s,A.,He,g,a,b,c,d,0\n"
                                    f"1,v,2,s,A.,He,g,a,b,c,d,{label}\n")
    if shown is None:
        with raises(f"{path}:3: no label"):
            read_swag(path)
    else:
        with raises(f"{path}:3: label {shown} is not an ending number 0-3"):
            read_swag(path)


# --- CoNLL ----------------------------------------------------------------------------------

def test_conll_sentences_docstart_and_last_column() -> None:
    examples = read_token_tags(ASSETS / "conll.txt")
    path = ASSETS / "conll.txt"
    assert examples == [
        TaggedExample("0", ["EU", "rejects", "German", "call", "."],
                      ["B-ORG", "O", "B-MISC", "O", "O"], f"{path}:3"),
        TaggedExample("1", ["Peter", "Blackburn"], ["B-PER", "I-PER"], f"{path}:9"),
        TaggedExample("2", ["BRUSSELS"], ["B-LOC"], f"{path}:15"),
    ]


def test_conll_tokens_only() -> None:
    examples = read_token_tags(ASSETS / "tokens.txt")
    assert [(e.tokens, e.tags) for e in examples] == [(["EU", "rejects"], None),
                                                      (["Peter", "Blackburn"], None)]


def test_conll_tabs_and_no_break_spaces(tmp_path: Path) -> None:
    path = write(tmp_path, "t.tsv", "New\u00a0York\tB-LOC\r\nis\tO\r\n")
    assert read_token_tags(path)[0].tokens == ["New\u00a0York", "is"]


def test_conll_column_count_must_not_change(tmp_path: Path) -> None:
    path = write(tmp_path, "c.txt", "EU NNP B-ORG\nrejects O\n")
    with raises(f"{path}:2: 2 column(s) where line 1 has 3"):
        read_token_tags(path)


def test_conll_empty(tmp_path: Path) -> None:
    path = write(tmp_path, "c.conll", "-DOCSTART- -X- O\n\n")
    with raises(f"{path}: no tokens in the file"):
        read_token_tags(path)


# --- JSON Lines tagging ---------------------------------------------------------------------

def test_jsonl_tag_names() -> None:
    examples = read_token_tags(ASSETS / "ner.jsonl")
    assert examples[1] == TaggedExample("s2", ["Peter", "Blackburn"], ["B-PER", "I-PER"],
                                        f"{ASSETS / 'ner.jsonl'}:2")


def test_jsonl_tag_ids_need_names() -> None:
    examples = read_token_tags(ASSETS / "ner_ids.jsonl", label_names=CONLL2003_NAMES)
    assert examples[0].tags == ["B-ORG", "O", "B-MISC", "O"]
    with raises(f"{ASSETS / 'ner_ids.jsonl'}:1: the tags in 'ner_tags' are class ids; give the "
                "tag names in id order (label_names)"):
        read_token_tags(ASSETS / "ner_ids.jsonl")
    with raises(f"{ASSETS / 'ner_ids.jsonl'}:1: tag id 3 is outside the 2 tag names given"):
        read_token_tags(ASSETS / "ner_ids.jsonl", label_names=["O", "B-PER"])


def test_jsonl_tokens_only(tmp_path: Path) -> None:
    path = write(tmp_path, "p.jsonl", '{"tokens": ["a", "b"]}\n')
    assert read_token_tags(path) == [TaggedExample("0", ["a", "b"], None, f"{path}:1")]


@pytest.mark.parametrize("content,line,message", [
    ('{"tokens": ["a", "b"], "tags": ["O"]}\n', 1, "2 tokens but 1 tags"),
    ('{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["b"]}\n', 2, "no 'tags' field"),
    ('{"words": ["a"]}\n', 1, "no list of strings in 'tokens' (found fields: 'words')"),
    ('{"tokens": []}\n', 1, "'tokens' is empty"),
    ('{"tokens": ["a"], "tags": "O"}\n', 1, "'tags' is not a list"),
    ('{"tokens": ["a"], "tags": [null]}\n', 1, "tag None in 'tags' is neither a name nor an id"),
])
def test_jsonl_errors_name_the_line(tmp_path: Path, content: str, line: int,
                                    message: str) -> None:
    path = write(tmp_path, "t.jsonl", content)
    with raises(f"{path}:{line}: {message}"):
        read_token_tags(path)
