"""Entity-level tagging scores: hand-built chunk cases and parity with the seqeval package."""

from __future__ import annotations

import random
import warnings

import pytest

from bertforge.metrics.seqeval import entity_scores, sentence_entities


def spans(tags: list[str]) -> list[tuple[str, int, int]]:
    return [(t, a, b) for t, _, a, b in sentence_entities(tags)]


@pytest.mark.parametrize("tags, expected", [
    # IOB2: every entity opens with B-.
    (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    (["B-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),
    # IOB1: I- opens an entity; B- only separates two adjacent entities of one type.
    (["I-PER", "I-PER", "B-PER", "O"], [("PER", 0, 1), ("PER", 2, 2)]),
    # I- after O starts an entity (lenient reading of IOB2 too).
    (["O", "I-LOC", "I-LOC"], [("LOC", 1, 2)]),
    # A type change ends one entity and starts another, even inside I- runs.
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
    (["I-PER", "I-ORG"], [("PER", 0, 0), ("ORG", 1, 1)]),
    # IOBES: S- is a one-token entity, E- closes one; E-/I- after E- or S- start anew.
    (["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC"], [("PER", 0, 0), ("LOC", 1, 3), ("LOC", 4, 4)]),
    (["B-PER", "E-PER", "I-PER"], [("PER", 0, 1), ("PER", 2, 2)]),
    (["B-PER", "S-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 1), ("PER", 2, 2)]),
    (["O", "E-PER", "O"], [("PER", 1, 1)]),
    # An entity still open at the end of the sentence is closed there.
    (["O", "B-MISC", "I-MISC"], [("MISC", 1, 2)]),
    # A bare prefix is an entity of type "_".
    (["B", "I", "O"], [("_", 0, 1)]),
    (["O", "O"], []),
    ([], []),
])
def test_chunks(tags: list[str], expected: list[tuple[str, int, int]]) -> None:
    assert spans(tags) == expected


def test_scores_by_hand() -> None:
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O"]]
    out = entity_scores(true, pred)
    # Gold: PER, LOC, ORG(0-2). Pred: PER, ORG (wrong type for LOC), ORG(0-1, short). 1 found.
    assert out["precision"] == pytest.approx(1 / 3)
    assert out["recall"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx(1 / 3)
    assert out["accuracy"] == pytest.approx(5 / 7)
    assert out["per_type"] == {
        "LOC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
        "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1},
    }


def test_entities_do_not_span_sentences() -> None:
    # Joined, I-PER I-PER would be one entity; per sentence they are two, both found.
    out = entity_scores([["I-PER"], ["I-PER"]], [["I-PER"], ["B-PER"]])
    assert out["f1"] == 1.0 and out["per_type"]["PER"]["support"] == 2


def test_no_entities() -> None:
    out = entity_scores([["O", "O"]], [["O", "O"]])
    assert (out["precision"], out["recall"], out["f1"], out["accuracy"]) == (0.0, 0.0, 0.0, 1.0)
    assert out["per_type"] == {}


def test_errors_name_the_sentence() -> None:
    with pytest.raises(ValueError, match="sentence 1: 1 predicted tags for 2 gold tags"):
        entity_scores([["O"], ["O", "B-X"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="1 predicted sentences for 2 gold"):
        entity_scores([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match=r"sentence 0, token 1: tag 'U-PER'"):
        entity_scores([["O", "U-PER"]], [["O", "O"]])
    with pytest.raises(ValueError, match="no tokens"):
        entity_scores([[]], [[]])


def _random_tags(rng: random.Random, prefixes: str, n: int) -> list[str]:
    types = ["PER", "LOC", "ORG"]
    return [rng.choice(["O", "O"] + [f"{p}-{t}" for p in prefixes for t in types])
            for _ in range(n)]


@pytest.mark.parametrize("prefixes", ["BI", "I", "BIES"])
def test_parity_with_seqeval(prefixes: str) -> None:
    pytest.importorskip("seqeval")
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
    from seqeval.metrics.sequence_labeling import (
        get_entities,
        precision_recall_fscore_support,
    )

    rng = random.Random(len(prefixes))
    for _ in range(60):
        true, pred = [], []
        for _ in range(rng.randint(1, 6)):
            n = rng.randint(0, 12)
            gold = _random_tags(rng, prefixes, n)
            # Keep about half the gold tags, so that many entities match.
            guess = [g if rng.random() < 0.5 else t
                     for g, t in zip(gold, _random_tags(rng, prefixes, n))]
            true.append(gold)
            pred.append(guess)
        if not any(true):
            continue
        for sentence in true:
            assert spans(sentence) == get_entities(sentence)
        out = entity_scores(true, pred)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # seqeval warns on 0/0, then uses 0 as we do
            assert out["precision"] == pytest.approx(precision_score(true, pred))
            assert out["recall"] == pytest.approx(recall_score(true, pred))
            assert out["f1"] == pytest.approx(f1_score(true, pred))
            assert out["accuracy"] == pytest.approx(accuracy_score(true, pred))
            p, r, f, s = precision_recall_fscore_support(true, pred, average=None)
        names = sorted({e[0] for sent in true + pred for e in get_entities(sent)})
        assert list(out["per_type"]) == names
        for i, name in enumerate(names):
            got = out["per_type"][name]
            assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((p[i], r[i], f[i]))
            assert got["support"] == s[i]
