"""SQuAD v1.1 / v2.0 scoring: hand-computed cases, the best-threshold search against a brute-force
reference, file validation, and (when present) the shared dev files."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest

from bertforge.errors import DataError
from bertforge.metrics.squad import (
    SquadQuestion,
    evaluate_squad_files,
    exact_match,
    normalize_answer,
    score_v2,
    squad_v1_scores,
    squad_v2_scores,
    token_f1,
)

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad"  # ../shared/data
V2_KEYS = ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
           "NoAns_exact", "NoAns_f1", "NoAns_total"]
BEST_KEYS = ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def dataset(*qas: tuple[str, list[str]], impossible: bool = False) -> list[dict[str, Any]]:
    """A one-article, one-paragraph dataset of (id, gold answers) questions."""
    entries = []
    for qid, answers in qas:
        qa: dict[str, Any] = {"id": qid, "question": "?",
                              "answers": [{"text": a, "answer_start": 0} for a in answers]}
        if impossible:
            qa["is_impossible"] = not answers
        entries.append(qa)
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": entries}]}]


@pytest.mark.parametrize("text, expected", [
    ("The  Quick, brown-fox!", "quick brownfox"),
    ("an apple a day", "apple day"),
    ("theatre another", "theatre another"),   # articles only as whole words
    ("A.B.", "ab"),
    ("the.", ""),                             # punctuation goes first, then the article
    ("  Über\tdas\nHaus ", "über das haus"),
    ("", ""),
])
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_and_f1() -> None:
    assert exact_match("The Cat.", "cat") == 1
    assert exact_match("cats", "cat") == 0
    assert token_f1("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)   # p=1, r=1/2
    assert token_f1("dog dog dog", "dog") == pytest.approx(0.5)                # p=1/3, r=1
    assert token_f1("red dog", "big red dog") == pytest.approx(0.8)
    assert token_f1("x y", "z") == 0.0


def test_empty_answers_v1_versus_v2() -> None:
    assert token_f1("", "") == 0.0                       # v1.1: no shared token -> 0
    assert token_f1("", "", version_2=True) == 1.0       # v2.0: no answer matches no answer
    assert token_f1("the", "", version_2=True) == 1.0    # normalizes to empty as well
    assert token_f1("cat", "", version_2=True) == 0.0
    assert token_f1("", "cat", version_2=True) == 0.0


def test_v1_max_over_golds_and_missing_prediction(caplog: pytest.LogCaptureFixture) -> None:
    data = dataset(("q1", ["big red dog", "the dog"]), ("q2", ["Paris"]), ("q3", ["Rome"]),
                   ("q4", ["x"]))
    preds = {"q1": "red dog", "q2": "paris.", "q3": "Milan", "extra": "?"}
    with caplog.at_level(logging.WARNING):
        out = squad_v1_scores(data, preds)
    # q1: EM 0 vs both golds; F1 max(0.8, 2/3) = 0.8; q2: 1/1; q3 and missing q4: 0.
    assert list(out) == ["exact_match", "f1"]
    assert out["exact_match"] == pytest.approx(100 * 1 / 4)
    assert out["f1"] == pytest.approx(100 * 1.8 / 4)
    assert "1 of 4 questions have no prediction" in caplog.text
    assert "1 predictions are for ids not in the dataset" in caplog.text


def test_v1_rejects_question_without_answers() -> None:
    with pytest.raises(DataError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[1\].*'q2'"):
        squad_v1_scores(dataset(("q1", ["a b"]), ("q2", [])), {"q1": "b"})


def test_v2_split_and_empty_gold_rules() -> None:
    data = dataset(("a1", ["the", "a cat"]),   # "the" normalizes to empty and is dropped
                   ("a2", ["The"]),            # all golds empty: gold is "", yet HasAns
                   ("a3", ["the", "dog"]),     # so "" does not match the dropped "the"
                   ("n1", []), ("n2", []), impossible=True)
    out = squad_v2_scores(data, {"a1": "cat", "a2": "", "a3": "", "n1": "", "n2": "dog"})
    assert list(out) == V2_KEYS
    assert out["total"] == 5 and out["HasAns_total"] == 3 and out["NoAns_total"] == 2
    assert out["exact"] == pytest.approx(60.0) and out["f1"] == pytest.approx(60.0)
    assert out["HasAns_exact"] == pytest.approx(200 / 3)
    assert out["NoAns_exact"] == pytest.approx(50.0) and out["NoAns_f1"] == pytest.approx(50.0)


def test_v2_without_unanswerable_questions_has_no_noans_keys() -> None:
    out = squad_v2_scores(dataset(("a", ["x"])), {"a": "x"})
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]


# q1..q4 worked on paper. Raw: q1 EM 1 F1 1; q2 EM 0 F1 0.8 (p=1, r=2/3); q3 (no answer,
# answered "London") 0; q4 (no answer, answered "") 1.
HAND = dataset(("q1", ["Paris"]), ("q2", ["big red dog"]), ("q3", []), ("q4", []),
               impossible=True)
HAND_PREDS = {"q1": "Paris", "q2": "red dog", "q3": "London", "q4": ""}
HAND_PROBS = {"q1": 0.1, "q2": 0.5, "q3": 0.3, "q4": 0.9}


def test_v2_best_threshold_by_hand() -> None:
    out = squad_v2_scores(HAND, HAND_PREDS, HAND_PROBS)
    assert list(out) == V2_KEYS + BEST_KEYS
    assert out["exact"] == pytest.approx(50.0) and out["f1"] == pytest.approx(70.0)
    # Walk from "no answer everywhere" = 2 (q3, q4): q1 (0.1) +1 -> 3 (best); q3 (0.3) -1 -> 2;
    # q2 (0.5) +0.8 (F1) / +0 (EM); q4 (0.9) +0. Best 3/4 at threshold 0.1 for both.
    assert out["best_f1"] == pytest.approx(75.0) and out["best_f1_thresh"] == 0.1
    assert out["best_exact"] == pytest.approx(75.0) and out["best_exact_thresh"] == 0.1
    # Applying that threshold does give the best score.
    again = squad_v2_scores(HAND, HAND_PREDS, HAND_PROBS, na_prob_thresh=0.1)
    assert again["f1"] == pytest.approx(75.0)


def test_v2_threshold_replaces_confident_no_answers() -> None:
    # q2 (0.5) and q4 (0.9) are above 0.4 and become "": q2 scores 0, q4 stays 1.
    out = squad_v2_scores(HAND, HAND_PREDS, HAND_PROBS, na_prob_thresh=0.4)
    assert out["exact"] == pytest.approx(50.0) and out["f1"] == pytest.approx(50.0)
    assert out["HasAns_f1"] == pytest.approx(50.0) and out["NoAns_f1"] == pytest.approx(50.0)


def test_v2_best_threshold_at_start_is_all_no_answer() -> None:
    data = dataset(("a", ["Paris"]), ("n", []), impossible=True)
    out = squad_v2_scores(data, {"a": "Rome", "n": "Berlin"}, {"a": 0.2, "n": 0.4})
    # Start 1 (n right by answering nothing); a adds 0, n takes 1 away: the start is best.
    assert out["best_exact"] == pytest.approx(50.0) and out["best_exact_thresh"] == 0.0
    assert out["best_f1"] == pytest.approx(50.0) and out["best_f1_thresh"] == 0.0
    assert out["exact"] == 0.0


def _brute_force_best_f1(questions: list[SquadQuestion], preds: dict[str, str],
                         probs: dict[str, float]) -> float:
    """Try every threshold (below all, and each probability): answers above it become ""."""
    best = -1.0
    for t in [-1.0, *probs.values()]:
        total = 0.0
        for q in questions:
            pred = "" if probs[q.qid] > t else preds[q.qid]
            golds = [a for a in q.answers if normalize_answer(a)] or [""]
            total += max(token_f1(pred, g, version_2=True) for g in golds)
        best = max(best, 100 * total / len(questions))
    return best


def test_v2_best_threshold_matches_brute_force() -> None:
    rng = random.Random(0)
    words = ["red", "dog", "cat", "blue", "sky", "sun"]
    for _ in range(50):
        questions, preds, probs = [], {}, {}
        for i in range(rng.randint(1, 9)):
            answers = tuple(" ".join(rng.sample(words, rng.randint(1, 3)))
                            for _ in range(rng.randint(0, 2)))
            questions.append(SquadQuestion(f"q{i}", answers))
            preds[f"q{i}"] = rng.choice(["", " ".join(rng.sample(words, rng.randint(1, 3)))])
            probs[f"q{i}"] = rng.random()
        out = score_v2(questions, preds, probs)
        assert out["best_f1"] == pytest.approx(_brute_force_best_f1(questions, preds, probs))
        applied = score_v2(questions, preds, probs, na_prob_thresh=out["best_f1_thresh"])
        if out["best_f1_thresh"] > 0.0:
            assert applied["f1"] == pytest.approx(out["best_f1"])


def test_v2_missing_prediction_scores_zero(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        out = squad_v2_scores(HAND, {"q1": "Paris", "q4": ""}, {"q1": 0.1, "q4": 0.9})
    assert "2 of 4 questions have no prediction" in caplog.text
    assert out["exact"] == pytest.approx(50.0) and out["total"] == 4
    # Only predicted questions move with the threshold: start 1 (q4), q1 +1 -> 2 of 4.
    assert out["best_exact"] == pytest.approx(50.0) and out["best_exact_thresh"] == 0.1


def test_v2_missing_probability_is_an_error() -> None:
    with pytest.raises(ValueError, match="no no-answer probability"):
        squad_v2_scores(HAND, HAND_PREDS, {"q1": 0.1})


# --- files -----------------------------------------------------------------------------------

def write(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_files_v1_and_v2(tmp_path: Path) -> None:
    v1 = write(tmp_path / "v1.json", {"version": "1.1", "data": dataset(("q", ["Paris"]))})
    preds = write(tmp_path / "p.json", {"q": "paris"})
    assert evaluate_squad_files(v1, preds) == {"exact_match": 100.0, "f1": 100.0}
    # No "version" but is_impossible present: v2.0.
    v2 = write(tmp_path / "v2.json", {"data": HAND})
    out = evaluate_squad_files(v2, write(tmp_path / "p2.json", HAND_PREDS),
                               write(tmp_path / "na.json", HAND_PROBS))
    assert out == squad_v2_scores(HAND, HAND_PREDS, HAND_PROBS)
    assert list(out) == V2_KEYS + BEST_KEYS


@pytest.mark.parametrize("which, content, message", [
    ("data", "{not json", r"data\.json:1:2: not valid JSON"),
    ("data", [1, 2], r"data\.json: expected a JSON object with a 'data' list"),
    ("data", {"version": "1.1", "data": [{"paragraphs": [{"qas": [{"id": "q", "answers": []},
                                                                  {"answers": []}]}]}]},
     r"data\.json: data\[0\]\.paragraphs\[0\]\.qas\[0\] \(id 'q'\): no gold answers"),
    ("data", {"version": "v2.0", "data": [{"paragraphs": [{"qas": [{"id": "q", "answers": []},
                                                                   {"answers": []}]}]}]},
     r"data\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\]: .*string 'id'"),
    ("data", {"data": [{"title": "x"}]}, r"data\.json: data\[0\]: .*'paragraphs'"),
    ("data", {"data": [{"paragraphs": [{"qas": 5}]}]},
     r"data\.json: data\[0\]\.paragraphs\[0\]: .*'qas' list"),
    ("data", {"data": {"a": 1}}, r"data\.json: 'data' must be a list of articles, got dict"),
    ("data", {"data": [{"paragraphs": [{"qas": [{"id": "q", "answers": [{"txt": 1}]}]}]}]},
     r"data\.json: data\[0\]\.paragraphs\[0\]\.qas\[0\] \(id 'q'\): 'answers'"),
    ("data", {"data": [{"paragraphs": [{"qas": [{"id": "q", "answers": [{"text": "a"}]}] * 2}]}]},
     r"data\.json: .*qas\[1\]: question id 'q' was already used at .*qas\[0\]"),
    ("data", {"data": []}, r"data\.json: the dataset has no questions"),
    ("preds", ["q"], r"preds\.json: expected a JSON object"),
    ("preds", {"q": 3}, r"preds\.json: the prediction for id 'q' is int"),
    ("na", {"q": "high"}, r"na\.json: the value for id 'q' is 'high', not a number"),
    ("na", {}, r"na\.json: 1 predicted questions have no no-answer probability .*'q'"),
    ("na", "[", r"na\.json:1:2: not valid JSON"),
])
def test_bad_files_name_the_file(tmp_path: Path, which: str, content: Any, message: str) -> None:
    files = {"data": {"version": "v2.0", "data": dataset(("q", ["a"]))},
             "preds": {"q": "a"}, "na": {"q": 0.5}}
    files[which] = content
    paths = {}
    for name, obj in files.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(obj if isinstance(obj, str) else json.dumps(obj))
    with pytest.raises(DataError, match=message):
        evaluate_squad_files(paths["data"], paths["preds"], paths["na"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.json: no such file; give the SQuAD dev file"):
        evaluate_squad_files(tmp_path / "nope.json", tmp_path / "p.json")


# --- the shared dev files ----------------------------------------------------------------------

def _shared(name: str) -> dict[str, Any]:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} is not there")
    return json.loads(path.read_text())


def _qas(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [qa for a in doc["data"] for p in a["paragraphs"] for qa in p["qas"]]


def test_shared_v1(tmp_path: Path) -> None:
    doc = _shared("dev-v1.1-part-a.json")
    gold = {qa["id"]: qa["answers"][0]["text"] for qa in _qas(doc)}
    preds = write(tmp_path / "p.json", gold)
    out = evaluate_squad_files(SHARED / "dev-v1.1-part-a.json", preds)
    assert out == {"exact_match": pytest.approx(100.0), "f1": pytest.approx(100.0)}
    empty = squad_v1_scores(doc["data"], {qid: "" for qid in gold})
    # "" scores 0 except, as officially, an exact match on a gold that normalizes to "" (the
    # data has one: a gold answer "."); v1.1 F1 of two empty answers is 0.
    blank = sum(1 for qa in _qas(doc)
                if any(not normalize_answer(a["text"]) for a in qa["answers"]))
    assert blank <= 3
    assert empty == {"exact_match": pytest.approx(100.0 * blank / len(gold)), "f1": 0.0}
    # Dropping each answer's first word: v1.1 and v2.0 agree on data without empty answers.
    cut = {qid: " ".join(t.split()[1:]) or "zzz" for qid, t in gold.items()}
    v1, v2 = squad_v1_scores(doc["data"], cut), squad_v2_scores(doc["data"], cut)
    assert 0 < v1["exact_match"] < v1["f1"] < 100
    assert v1["exact_match"] == pytest.approx(v2["exact"]) and v1["f1"] == pytest.approx(v2["f1"])


def test_shared_v2(tmp_path: Path) -> None:
    doc = _shared("dev-v2.0-part-a.json")
    qas = _qas(doc)
    gold = {qa["id"]: qa["answers"][0]["text"] if qa["answers"] else "" for qa in qas}
    out = evaluate_squad_files(SHARED / "dev-v2.0-part-a.json", write(tmp_path / "p.json", gold))
    assert list(out) == V2_KEYS
    assert out["exact"] == pytest.approx(100.0) and out["f1"] == pytest.approx(100.0)
    assert out["total"] == len(qas)
    no_answer = sum(1 for qa in qas if not qa["answers"])
    assert 0 < no_answer < len(qas)
    empty = squad_v2_scores(doc["data"], {qid: "" for qid in gold})
    assert empty["exact"] == pytest.approx(100.0 * no_answer / len(qas))
    assert empty["HasAns_exact"] == 0.0 and empty["NoAns_exact"] == 100.0
