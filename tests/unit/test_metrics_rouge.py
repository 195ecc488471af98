"""ROUGE (bertforge.metrics.rouge): hand-computed tiny cases, agreement with direct rouge-score
calls, stemming, ROUGE-Lsum sentence splitting, several references, and scoring files matched
by id or by order (with the shared CNN/DailyMail SummEval file when present)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from rouge_score import rouge_scorer

from bertforge.data.finetuning.summarization import read_summarization
from bertforge.data.segment import split_sentences
from bertforge.errors import ConfigError, DataError
from bertforge.metrics.rouge import (
    ROUGE_TYPES, evaluate_summarization_files, lsum_text, rouge_scores,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "summarization"
SHARED = (Path(__file__).resolve().parents[3] / "shared" / "data" / "summarization"
          / "cnndm_test_summeval100.jsonl")  # ../shared/data from the repository root


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8", newline="")
    return path


def jsonl(tmp_path: Path, name: str, rows: list[dict[str, object]]) -> Path:
    return write(tmp_path, name, "".join(json.dumps(row) + "\n" for row in rows))


def raises(match: str):
    return pytest.raises(DataError, match=re.escape(match))


# --- hand-computed ----------------------------------------------------------------------------

def test_one_word_differs() -> None:
    scores = rouge_scores(["the cat sat"], ["the cat ran"])
    assert scores["rouge1"] == pytest.approx(200 / 3)  # 2 of 3 unigrams on each side
    assert scores["rouge2"] == pytest.approx(50.0)     # "the cat" of 2 bigrams
    assert scores["rougeL"] == pytest.approx(200 / 3)
    assert scores["rougeLsum"] == pytest.approx(200 / 3)


def test_precision_and_recall_of_a_short_prediction() -> None:
    scores = rouge_scores(["The cat."], ["the cat sat"])  # case and punctuation do not count
    assert scores["rouge1_precision"] == pytest.approx(100.0)
    assert scores["rouge1_recall"] == pytest.approx(200 / 3)
    assert scores["rouge1"] == pytest.approx(80.0)      # 2PR / (P + R) = 2 * 1 * 2/3 / (5/3)
    assert scores["rouge2_precision"] == pytest.approx(100.0)
    assert scores["rouge2_recall"] == pytest.approx(50.0)
    assert set(scores) == {f"{t}{s}" for t in ROUGE_TYPES for s in ("", "_precision", "_recall")}


def test_bigrams_and_the_mean_over_examples() -> None:
    # bigrams: the-cat cat-sat sat-on on-the the-mat vs the-cat cat-sat sat-on on-a a-mat: 3 of 5
    scores = rouge_scores(["the cat sat on the mat", "dogs bark"],
                          ["the cat sat on a mat", "birds sing"])
    assert scores["rouge2"] == pytest.approx((60.0 + 0.0) / 2)
    assert scores["rouge1"] == pytest.approx((100 * 5 / 6 + 0.0) / 2)
    assert scores["rougeL"] == pytest.approx((100 * 5 / 6 + 0.0) / 2)  # LCS the cat sat on mat


def test_empty_prediction_scores_zero() -> None:
    assert rouge_scores([""], ["a reference"])["rouge1"] == 0.0


def test_stemming_matches_word_forms() -> None:
    with_stems = rouge_scores(["cats running"], ["cat runs"])
    without = rouge_scores(["cats running"], ["cat runs"], use_stemmer=False)
    assert with_stems["rouge1"] == pytest.approx(100.0) and with_stems["rouge2"] == 100.0
    assert without["rouge1"] == 0.0


def test_lsum_split_makes_summary_level_lcs_sentence_by_sentence() -> None:
    prediction, reference = "The cat sat. The dog ran.", "The dog ran. The cat sat."
    split = rouge_scores([prediction], [reference])
    joined = rouge_scores([prediction], [reference], lsum_split=False)
    # one LCS over all six tokens finds only "the dog ran" (or "the cat sat")
    assert split["rougeL"] == joined["rougeL"] == joined["rougeLsum"] == pytest.approx(50.0)
    # sentence by sentence every reference sentence is found whole
    assert split["rougeLsum"] == pytest.approx(100.0)
    # lines written by the caller count as sentences without splitting
    lines = rouge_scores(["The cat sat.\nThe dog ran."], ["The dog ran.\nThe cat sat."],
                         lsum_split=False)
    assert lines["rougeLsum"] == pytest.approx(100.0)


def test_lsum_text_splits_each_line_and_drops_blank_ones() -> None:
    assert lsum_text("Mr. Lee came. He sat down.\n\nThen he left.\n") == (
        "Mr. Lee came.\nHe sat down.\nThen he left.")
    assert lsum_text("") == ""


def test_several_references_take_the_best_per_type() -> None:
    single = rouge_scores(["the cat sat on the mat"], ["a dog ran"])
    multi = rouge_scores(["the cat sat on the mat"], [["a dog ran", "the cat sat on a mat"]])
    assert single["rouge1"] == 0.0
    assert multi["rouge1"] == pytest.approx(100 * 5 / 6)
    assert multi["rouge2"] == pytest.approx(60.0)
    # each type picks its own best reference: "mat the cat" has the better ROUGE-1 here,
    # "the cat sat" the better ROUGE-2
    refs = ["mat on the cat sat", "the cat ran"]
    mixed = rouge_scores(["the cat sat on the mat"], [refs])
    one = [rouge_scores(["the cat sat on the mat"], [r]) for r in refs]
    for name in ROUGE_TYPES:
        assert mixed[name] == pytest.approx(max(s[name] for s in one))
    # a tuple of references is a sequence like a list
    assert rouge_scores(["x"], [("x", "y")])["rouge1"] == 100.0


# --- against rouge-score itself -------------------------------------------------------------

PREDICTIONS = [
    "Harbourton council votes to reopen the ferry pier. It opens to walkers in June.",
    "Late entry is free after six. The museum opens late on Fridays in winter.",
    "Two roads flooded near Elmstead and reopened by noon.",
]
REFERENCES = [
    "Harbourton council votes to reopen the ferry pier .\nWalkers may use it from June .",
    "Greywater museum opens late on winter Fridays. Late entry will be free.",
    "Two roads near Elmstead were shut by overnight rain.",
]


@pytest.mark.parametrize("stem", [True, False])
def test_agrees_with_direct_rouge_score_calls(stem: bool) -> None:
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stem)

    def lines(text: str) -> str:
        return "\n".join(s for line in text.split("\n") for s in split_sentences(line))

    direct = [scorer.score(lines(r), lines(p)) for p, r in zip(PREDICTIONS, REFERENCES)]
    ours = rouge_scores(PREDICTIONS, REFERENCES, use_stemmer=stem)
    for name in ROUGE_TYPES:
        assert ours[name] == pytest.approx(100 * sum(d[name].fmeasure for d in direct) / 3)
        assert ours[f"{name}_recall"] == pytest.approx(
            100 * sum(d[name].recall for d in direct) / 3)
    assert ours["rougeLsum"] > ours["rougeL"] + 1  # splitting mattered: sentences swapped


def test_multi_reference_agrees_with_score_multi() -> None:
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    refs = [REFERENCES[0], REFERENCES[1]]
    direct = scorer.score_multi([lsum_text(r) for r in refs], lsum_text(PREDICTIONS[0]))
    ours = rouge_scores([PREDICTIONS[0]], [refs])
    for name in ROUGE_TYPES:
        assert ours[name] == pytest.approx(100 * direct[name].fmeasure)
        assert ours[f"{name}_precision"] == pytest.approx(100 * direct[name].precision)


@pytest.mark.parametrize("predictions,references,message", [
    (["a", "b"], ["a"], "2 predictions for 1 references"),
    ([], [], "no predictions to score"),
    ("a", ["a"], "predictions is one string"),
    (["a"], "a", "references is one string"),
    (["a", 3], ["a", "b"], "predictions[1] is int, not a string"),
    (["a", "b"], ["a", None], "references[1] is NoneType, not a string or a non-empty sequence"),
    (["a", "b"], ["a", []], "references[1] is list"),
    (["a", "b"], [["a"], ["b", 2]], "references[1] is list"),
])
def test_bad_arguments_name_the_index(predictions: object, references: object,
                                      message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rouge_scores(predictions, references)  # type: ignore[arg-type]


# --- files ----------------------------------------------------------------------------------

XSUM_REFERENCES = [e.summary for e in read_summarization(ASSETS / "xsum.jsonl")]
XSUM_PREDICTIONS = {"30001": "The Oldbridge ferry will run every twenty minutes.",
                    "30002": "A library lends its millionth book.",
                    "30003": "Rain closed two roads near Elmstead."}


def test_files_matched_by_id(tmp_path: Path) -> None:
    rows = [{"id": i, "prediction": XSUM_PREDICTIONS[i]} for i in ("30003", "30001", "30002")]
    scores = evaluate_summarization_files(jsonl(tmp_path, "p.jsonl", rows), ASSETS / "xsum.jsonl")
    expected = rouge_scores(list(XSUM_PREDICTIONS.values()), XSUM_REFERENCES)
    assert scores == {**expected, "count": 3}
    assert scores["rouge1"] > 0


def test_files_matched_by_order(tmp_path: Path) -> None:
    predictions = write(tmp_path, "p.txt", "\n".join(XSUM_PREDICTIONS.values()) + "\n")
    references = write(tmp_path, "r.txt", "\n".join(XSUM_REFERENCES))
    expected = {**rouge_scores(list(XSUM_PREDICTIONS.values()), XSUM_REFERENCES), "count": 3}
    assert evaluate_summarization_files(predictions, references) == expected
    # plain-text predictions have no ids, so a table of references pairs up by order too
    assert evaluate_summarization_files(predictions, ASSETS / "xsum.jsonl") == expected
    # and so do predictions without an id column
    rows = [{"summary": text} for text in XSUM_PREDICTIONS.values()]
    assert evaluate_summarization_files(jsonl(tmp_path, "p.jsonl", rows),
                                        ASSETS / "xsum.jsonl") == expected


def test_story_references_and_named_fields(tmp_path: Path) -> None:
    stories = read_summarization(ASSETS / "stories")
    rows = [{"guid": e.id, "output": e.article} for e in reversed(stories)]
    predictions = jsonl(tmp_path, "p.jsonl", rows)
    scores = evaluate_summarization_files(predictions, ASSETS / "stories",
                                          prediction_field="output")
    expected = rouge_scores([e.article for e in stories], [e.summary for e in stories])
    assert scores == {**expected, "count": 3}


def test_several_references_per_example(tmp_path: Path) -> None:
    rows = [{"id": "m2", "prediction": "Trees planted along the Redford canal."},
            {"id": "m1", "prediction": "A broken oven left the bakery short of bread."}]
    scores = evaluate_summarization_files(jsonl(tmp_path, "p.jsonl", rows),
                                          ASSETS / "multi_refs.jsonl", reference_field="summary")
    refs = [e.references for e in read_summarization(ASSETS / "multi_refs.jsonl")]
    assert scores == {**rouge_scores([rows[1]["prediction"], rows[0]["prediction"]], refs),
                      "count": 2}


def test_empty_prediction_lines_are_empty_summaries(tmp_path: Path) -> None:
    predictions = write(tmp_path, "p.txt", "Castleford library millionth loan.\n\r\n")
    references = write(tmp_path, "r.txt", "Castleford library celebrates its millionth loan.\n"
                                          "Two roads near Elmstead were shut.\n")
    scores = evaluate_summarization_files(predictions, references)
    assert scores["count"] == 2
    assert scores["rouge1_precision"] == pytest.approx(50.0)  # 100 for the first, 0 for ""


def test_missing_ids_are_named(tmp_path: Path) -> None:
    predictions = jsonl(tmp_path, "p.jsonl", [{"id": "30002", "summary": "A library."}])
    with raises(f"{predictions}: no prediction for 2 of the 3 examples of "
                f"{ASSETS / 'xsum.jsonl'}: id '30001', '30003'; predict every example"):
        evaluate_summarization_files(predictions, ASSETS / "xsum.jsonl")


def test_many_missing_ids_are_counted(tmp_path: Path) -> None:
    references = jsonl(tmp_path, "r.jsonl", [{"id": str(i), "summary": "S."} for i in range(8)])
    predictions = jsonl(tmp_path, "p.jsonl", [{"id": "0", "summary": "S."}])
    with raises("id '1', '2', '3', '4', '5' and 2 more;"):
        evaluate_summarization_files(predictions, references)


def test_extra_predictions_are_ignored_with_a_warning(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    rows = [{"id": i, "prediction": t} for i, t in XSUM_PREDICTIONS.items()]
    rows.append({"id": "99999", "prediction": "Something else entirely."})
    with caplog.at_level(logging.WARNING, logger="bertforge.metrics.rouge"):
        scores = evaluate_summarization_files(jsonl(tmp_path, "p.jsonl", rows),
                                              ASSETS / "xsum.jsonl")
    assert scores["count"] == 3
    assert "1 predictions are for ids not in" in caplog.text


def test_count_mismatch_names_both_files(tmp_path: Path) -> None:
    predictions = write(tmp_path, "p.txt", "one\ntwo\n")
    with raises(f"{predictions} holds 2 predictions but {ASSETS / 'xsum.jsonl'} holds 3 "
                "references; without ids in both files they pair up by order"):
        evaluate_summarization_files(predictions, ASSETS / "xsum.jsonl")


def test_file_errors(tmp_path: Path) -> None:
    refs = ASSETS / "xsum.jsonl"
    dup = jsonl(tmp_path, "dup.jsonl", [{"id": "a", "summary": "x"}, {"id": "a", "summary": "y"}])
    with raises(f"{dup}:2: id 'a' was already given on line 1; ids must be unique"):
        evaluate_summarization_files(dup, refs)
    with raises(f"{dup}:2: id 'a' was already given on line 1"):
        evaluate_summarization_files(write(tmp_path, "p.txt", "x\ny\n"), dup)
    none = jsonl(tmp_path, "none.jsonl", [{"id": "a", "prediction": None}])
    with raises(f"{none}:1: no prediction in column 'prediction'"):
        evaluate_summarization_files(none, refs)
    noid = jsonl(tmp_path, "noid.jsonl", [{"id": "a", "prediction": "x"}, {"prediction": "y"}])
    with raises(f"{noid}:2: no id in column 'id'"):
        evaluate_summarization_files(noid, refs)
    wrong = jsonl(tmp_path, "wrong.jsonl", [{"id": "a", "text": "x"}])
    with raises(f"{wrong}: no column named prediction, summary (found: 'id', 'text'); set "
                "prediction_field"):
        evaluate_summarization_files(wrong, refs)
    with raises(f"{refs}: no column 'gold' (found: 'document', 'summary', 'id'); fix "
                "reference_field"):
        evaluate_summarization_files(write(tmp_path, "q.txt", "x\n"), refs,
                                     reference_field="gold")
    empty = write(tmp_path, "empty.txt", "")
    with raises(f"{empty}: the file is empty; write one summary per line"):
        evaluate_summarization_files(empty, refs)
    blank = write(tmp_path, "blank.txt", "a summary\n\nanother\n")
    with raises(f"{blank}:2: a blank reference summary"):
        evaluate_summarization_files(write(tmp_path, "three.txt", "a\nb\nc\n"), blank)
    gaps = jsonl(tmp_path, "gaps.jsonl", [{"summary": "S."}, {"summary": ""}])
    with raises(f"{gaps}:2: no reference summary in column 'summary'"):
        evaluate_summarization_files(write(tmp_path, "two.txt", "a\nb\n"), gaps)


@pytest.mark.parametrize("option,references", [
    ("prediction_field", "xsum.jsonl"), ("reference_field", "r.txt"),
    ("reference_field", "stories"),
])
def test_field_options_need_a_table(tmp_path: Path, option: str, references: str) -> None:
    write(tmp_path, "r.txt", "x\n")
    predictions = write(tmp_path, "p.txt", "x\n")
    refs = tmp_path / references if references == "r.txt" else ASSETS / references
    with pytest.raises(ConfigError, match=f"{option} does not apply to"):
        evaluate_summarization_files(predictions, refs, **{option: "summary"})


# --- the shared CNN/DailyMail SummEval file -------------------------------------------------

def test_shared_lead3_baseline(tmp_path: Path) -> None:
    if not SHARED.is_file():
        pytest.skip(f"{SHARED} is absent (real summarization data is optional)")
    examples = read_summarization(SHARED)
    rows = [{"id": e.id, "prediction": " ".join(split_sentences(e.article)[:3])}
            for e in examples]
    scores = evaluate_summarization_files(jsonl(tmp_path, "lead3.jsonl", rows), SHARED)
    # Lead-3 on the CNN/DailyMail test set scores about 40 / 17.5 / 36.5 (R-1 / R-2 / R-Lsum)
    assert scores["count"] == 100
    assert 36 < scores["rouge1"] < 48 and 14 < scores["rouge2"] < 25
    assert scores["rougeL"] + 5 < scores["rougeLsum"] < scores["rouge1"]
    multi = evaluate_summarization_files(jsonl(tmp_path, "lead3.jsonl", rows[:10]),
                                         jsonl(tmp_path, "refs.jsonl", [
                                             {"id": e.id, "refs": list(e.references)}
                                             for e in read_summarization(
                                                 SHARED, summary_field="extra_refs_summeval",
                                                 max_examples=10)]),
                                         reference_field="refs")
    assert multi["count"] == 10 and 0 < multi["rouge1"] < 100
