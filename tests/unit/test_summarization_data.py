"""Summarization readers (bertforge.data.finetuning.summarization): CNN/DailyMail story files,
CSV/TSV/JSON Lines tables with detected or named columns, several references per article, and
(when present) the shared CNN/DailyMail SummEval file.

Samples live in tests/assets/summarization/; broken files are written per test so that each
error message can be checked for the file and line it names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bertforge.data.finetuning.summarization import (
    SummaryExample, read_story, read_summarization,
)
from bertforge.errors import ConfigError, DataError

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "summarization"
STORIES = ASSETS / "stories"
SHARED = (Path(__file__).resolve().parents[3] / "shared" / "data" / "summarization"
          / "cnndm_test_summeval100.jsonl")  # ../shared/data from the repository root


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8", newline="")
    return path


def raises(match: str):
    return pytest.raises(DataError, match=re.escape(match))


# --- stories --------------------------------------------------------------------------------

def test_story_directory_reads_in_name_order_with_cleaned_text() -> None:
    examples = read_summarization(STORIES)
    assert [e.id for e in examples] == ["0c4e7b", "3f9a1c", "d2b856"]
    pier = examples[1]
    assert pier.source == str(STORIES / "3f9a1c.story")
    # the caption without a final period gets " .", paragraphs are joined by single spaces
    assert pier.article == (
        "Harbourton (Local Wire) -- The town council of Harbourton voted on Tuesday to reopen "
        "the old ferry pier after five years of repairs. Photo: The pier at low tide . Council "
        "member Ada Okafor said the pier would open to walkers in June and to boats in August. "
        '"We waited a long time for this," she said.')
    assert pier.summary == ("Harbourton council votes to reopen the ferry pier .\n"
                            "Walkers may use it from June, boats from August .")
    assert pier.references == (pier.summary,)
    # "!" and "." end highlights already; blank runs between paragraphs vanish
    bees = examples[0]
    assert bees.summary == ("Lowmoor beekeeper counts a record number of hives this spring!\n"
                            "She credits the mild winter, and neighbours plant clover for the "
                            "bees.")
    assert "records. Mara Lind" in bees.article and "colonies. Neighbours" in bees.article


def test_story_with_crlf_and_a_curly_closing_quote() -> None:
    article, highlights = read_story(STORIES / "d2b856.story")
    assert article == ("The ninth annual kite festival drew a crowd of about two thousand people "
                       "to Saltmarsh beach. Organisers said the wind was \u201cperfect\u201d")
    assert highlights == ["About two thousand people came to the Saltmarsh kite festival ."]


def test_single_story_file_and_max_examples() -> None:
    [one] = read_summarization(STORIES / "d2b856.story")
    assert one.id == "d2b856" and one.summary is not None
    assert [e.id for e in read_summarization(STORIES, max_examples=2)] == ["0c4e7b", "3f9a1c"]


def test_story_text_is_split_only_at_line_ends(tmp_path: Path) -> None:
    path = write(tmp_path, "s/x.story", "One line\u2028still the same line.\n\n@highlight\n\nA\n")
    article, highlights = read_story(path)
    assert article == "One line\u2028still the same line."
    assert highlights == ["A ."]


def test_story_without_highlights(tmp_path: Path) -> None:
    path = write(tmp_path, "s/bare.story", "An article with no highlights at all.\n")
    with raises(f"{path}: the story has no highlights (no line after an @highlight mark)"):
        read_summarization(path.parent)
    [example] = read_summarization(path.parent, require_summaries=False)
    assert example.summary is None and example.references == ()
    assert example.article == "An article with no highlights at all."


@pytest.mark.parametrize("content", ["", "\n\n", "@highlight\n\nOnly a highlight\n"])
def test_story_without_article_names_the_file(tmp_path: Path, content: str) -> None:
    path = write(tmp_path, "s/empty.story", content)
    with raises(f"{path}: the story has no article text"):
        read_summarization(tmp_path / "s", require_summaries=False)


@pytest.mark.parametrize("option", ["article_field", "summary_field"])
def test_field_options_do_not_apply_to_stories(option: str) -> None:
    with pytest.raises(ConfigError, match=f"{option} applies to tables only"):
        read_summarization(STORIES, **{option: "summary"})


def test_directory_without_stories(tmp_path: Path) -> None:
    write(tmp_path, "d/notes.txt", "not a story\n")
    with raises(f"{tmp_path / 'd'}: no .story files in this directory"):
        read_summarization(tmp_path / "d")


def test_missing_path() -> None:
    with raises("nowhere.story: no such file"):
        read_summarization(ASSETS / "nowhere.story")


# --- tables ---------------------------------------------------------------------------------

def test_cnndm_csv_detects_article_and_highlights() -> None:
    examples = read_summarization(ASSETS / "cnndm.csv")
    assert [(e.id, e.source) for e in examples] == [
        ("a01", f"{ASSETS / 'cnndm.csv'}:2"), ("a02", f"{ASSETS / 'cnndm.csv'}:4")]
    assert examples[0].summary == ("Thornby cycling club repairs forty bikes for pupils .\n"
                                   "The club meets on Saturdays in a barn .")
    assert examples[1].article.startswith("The Greywater museum will stay open late")


def test_xsum_jsonl_detects_document_and_summary() -> None:
    examples = read_summarization(ASSETS / "xsum.jsonl")
    assert [e.id for e in examples] == ["30001", "30002", "30003"]
    assert examples[2].source.endswith("xsum.jsonl:4")  # the blank line 3 is skipped
    assert examples[1].summary == "Castleford library celebrates its millionth loan."
    assert examples[0].article.startswith("The river ferry between Oldbridge and Fenwick")
    assert len(read_summarization(ASSETS / "xsum.jsonl", max_examples=1)) == 1


def test_named_fields_ignore_case_and_ids_fall_back_to_row_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, "d.tsv", "Body\tGist\tsummary\nFirst body.\tFirst gist.\tnot this\n"
                                    "Second body.\tSecond gist.\tnor this\n")
    examples = read_summarization(path, article_field="body", summary_field="GIST")
    assert [(e.id, e.article, e.summary) for e in examples] == [
        ("0", "First body.", "First gist."), ("1", "Second body.", "Second gist.")]


def test_several_references_in_a_list() -> None:
    first, second = read_summarization(ASSETS / "multi_refs.jsonl")
    assert first.references == ("Mill Street bakery sells out early after its oven breaks.",
                                "A broken oven left the Mill Street bakery short of bread.")
    assert first.summary == first.references[0]
    assert second.references == ("Three hundred trees planted along the Redford canal.",)


def test_detection_order_prefers_summary_over_highlights(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", json.dumps(
        {"text": "T.", "input": "I.", "highlights": "H.", "summary": "S."}) + "\n")
    [example] = read_summarization(path)
    assert (example.article, example.summary) == ("T.", "S.")


@pytest.mark.parametrize("options,message", [
    ({"article_field": "body"},
     "d.csv: no column 'body' (found: 'title', 'gist'); fix article_field"),
    ({"article_field": "title", "summary_field": "abstract"},
     "d.csv: no column 'abstract' (found: 'title', 'gist'); fix summary_field"),
    ({}, ("d.csv: no column named article, document, text, source, input (found: 'title', "
          "'gist'); set article_field")),
    ({"article_field": "title"},
     ("d.csv: no column named summary, highlights, target, abstract, highlights_tokenized "
      "(found: 'title', 'gist'); set summary_field")),
])
def test_column_errors_list_the_columns_found(tmp_path: Path, options: dict[str, str],
                                              message: str) -> None:
    path = write(tmp_path, "d.csv", "title,gist\nA title.,A gist.\n")
    with raises(message):
        read_summarization(path, **options)


def test_unlabeled_table_without_a_summary_column(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", '{"article": "Only an article.", "id": "u1"}\n')
    [example] = read_summarization(path, require_summaries=False)
    assert (example.id, example.summary, example.references) == ("u1", None, ())


def test_rows_without_a_summary(tmp_path: Path) -> None:
    path = write(tmp_path, "d.jsonl", '{"article": "A.", "summary": "S."}\n'
                                      '{"article": "B.", "summary": null}\n'
                                      '{"article": "C.", "summary": "  "}\n'
                                      '{"article": "D.", "summary": []}\n')
    with raises(f"{path}:2: no summary in column 'summary'; every training and evaluation"):
        read_summarization(path)
    examples = read_summarization(path, require_summaries=False)
    assert [e.summary for e in examples] == ["S.", None, None, None]


@pytest.mark.parametrize("line,message", [
    ('{"article": " ", "summary": "S."}', ":2: no article text in column 'article'"),
    ('{"summary": "S."}', ":2: no article text in column 'article'"),
    ('{"article": ["A."], "summary": "S."}', ":2: column 'article' holds a JSON list, not text"),
    ('{"article": "A.", "summary": {"t": "S."}}', ":2: column 'summary' holds a JSON dict"),
    ('{"article": "A.", "summary": ["S.", 3]}',
     ":2: item 1 of the list in column 'summary' is a JSON int; every reference summary"),
    ('{"article": "A.", "summary": ["S.", ""]}',
     ":2: item 1 of the list in column 'summary' is a blank text"),
])
def test_bad_cells_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "d.jsonl", '{"article": "A.", "summary": "S."}\n' + line + "\n")
    with raises(f"{path}{message}"):
        read_summarization(path)


def test_table_errors_come_from_the_table_reader(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "article,summary\nA.,S.\nB.\n")
    with raises(f"{path}:3: 1 field where the header (line 1) has 2 columns"):
        read_summarization(path)
    with raises("d.xml: cannot tell the format from the extension '.xml'"):
        read_summarization(write(tmp_path, "d.xml", "<a/>"))


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_max_examples_must_be_a_positive_integer(value: object) -> None:
    with pytest.raises(ValueError, match="max_examples"):
        read_summarization(ASSETS / "xsum.jsonl", max_examples=value)  # type: ignore[arg-type]


def test_summary_example_keeps_summary_first_in_references() -> None:
    assert SummaryExample("i", "A.", "S.", "f:1").references == ("S.",)
    assert SummaryExample("i", "A.", None, "f:1").references == ()
    with pytest.raises(ValueError, match="references\\[0\\] of example 'i'"):
        SummaryExample("i", "A.", "S.", "f:1", references=("T.", "S."))


# --- the shared CNN/DailyMail SummEval file -------------------------------------------------

def shared() -> Path:
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is absent (real summarization data is optional)")
    return SHARED


def test_shared_cnndm_summeval_reads_with_detection() -> None:
    examples = read_summarization(shared())
    assert len(examples) == 100 and len({e.id for e in examples}) == 100
    assert all(e.id.startswith(("cnn-test-", "dm-test-")) for e in examples)
    raw = json.loads(SHARED.read_text(encoding="utf-8").splitlines()[0])
    assert examples[0].article == raw["article"]  # "article", not "article_tokenized"
    assert examples[0].summary == raw["highlights_tokenized"]
    assert examples[0].source == f"{SHARED}:1"


def test_shared_cnndm_summeval_human_references() -> None:
    examples = read_summarization(shared(), summary_field="extra_refs_summeval", max_examples=5)
    assert len(examples) == 5
    assert all(len(e.references) == 10 and e.summary == e.references[0] for e in examples)
