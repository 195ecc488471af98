"""Entity-level precision, recall and F1 for token tagging (NER, chunking).

Tagging models are judged on whole entities, not tokens: an entity counts as found only when its
type and both its boundaries are right. Published NER numbers use the CoNLL evaluation's lenient
reading of the tags (also the default of the ``seqeval`` package), which this module follows so
our scores compare with them:

* tags are ``O`` or ``P-TYPE`` with prefix ``P`` one of B (begin), I (inside), E (end), S (single);
  a bare prefix (``B``) is an entity of type ``_``;
* an entity starts at B or S, at I or E right after O / E / S, and at any tag whose type differs
  from the previous tag's; so IOB1 (I- opens an entity, B- only splits two adjacent ones of one
  type), IOB2 and IOBES tags all read as intended, and ill-formed sequences are read leniently;
* an entity ends before O, B or S, after E or S, and where the type changes.

Entities never span sentences. Scores are micro-averaged over all entities, as fractions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

_PREFIXES = frozenset("BIES")

Entity = tuple[str, int, int, int]  # type, sentence, first token, last token


def _split_tag(tag: str, sentence: int, position: int) -> tuple[str, str]:
    """``"B-PER"`` -> ``("B", "PER")``, ``"O"`` -> ``("O", "")``; anything else is an error."""
    if tag == "O":
        return "O", ""
    if isinstance(tag, str) and tag[:1] in _PREFIXES and (len(tag) == 1 or tag[1] == "-"):
        return tag[0], tag[2:] or "_"
    raise ValueError(f"sentence {sentence}, token {position}: tag {tag!r} is neither 'O' nor "
                     "B-/I-/E-/S- followed by a type")


def _ends(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    """Whether the entity open at the previous token (``prev`` is not O) ends before this one."""
    return (prev in "ES" or tag in "BSO" or prev_type != type_)


def _starts(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    """Whether this token (not O) opens a new entity."""
    return tag in "BS" or prev in "OES" or prev_type != type_


def sentence_entities(tags: Sequence[str], sentence: int = 0) -> list[Entity]:
    """The entities of one tagged sentence, as ``(type, sentence, first, last)`` (inclusive)."""
    entities: list[Entity] = []
    prev, prev_type, begin = "O", "", 0
    # A trailing O closes an entity still open at the end of the sentence.
    for i, label in enumerate([*tags, "O"]):
        tag, type_ = _split_tag(label, sentence, i)
        if prev != "O" and _ends(prev, prev_type, tag, type_):
            entities.append((prev_type, sentence, begin, i - 1))
        if tag != "O" and _starts(prev, prev_type, tag, type_):
            begin = i
        prev, prev_type = tag, type_
    return entities


def _prf(found: int, predicted: int, actual: int) -> tuple[float, float, float]:
    """Precision, recall, F1 from counts; 0.0 wherever a ratio has nothing to divide by."""
    precision = found / predicted if predicted else 0.0
    recall = found / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_scores(true_tags: list[list[str]], pred_tags: list[list[str]]) -> dict[str, object]:
    """Micro-averaged entity precision/recall/F1, token accuracy, and the scores of each type.

    Returns ``{"precision", "recall", "f1", "accuracy", "per_type": {TYPE: {"precision",
    "recall", "f1", "support"}}}`` with ``support`` the number of gold entities of the type;
    types seen only in predictions are listed too (support 0), since they cost precision.
    """
    if len(true_tags) != len(pred_tags):
        raise ValueError(f"{len(pred_tags)} predicted sentences for {len(true_tags)} gold "
                         "sentences; they must pair up")
    gold: set[Entity] = set()
    pred: set[Entity] = set()
    tokens = same = 0
    for s, (t, p) in enumerate(zip(true_tags, pred_tags)):
        if len(t) != len(p):
            raise ValueError(f"sentence {s}: {len(p)} predicted tags for {len(t)} gold tags; "
                             "predict one tag per token")
        gold.update(sentence_entities(t, s))
        pred.update(sentence_entities(p, s))
        tokens += len(t)
        same += sum(a == b for a, b in zip(t, p))
    if tokens == 0:
        raise ValueError("no tokens to score")

    found = gold & pred
    n_found, n_gold, n_pred = (Counter(e[0] for e in es) for es in (found, gold, pred))
    per_type: dict[str, dict[str, float | int]] = {}
    for type_ in sorted(set(n_gold) | set(n_pred)):
        p_, r_, f_ = _prf(n_found[type_], n_pred[type_], n_gold[type_])
        per_type[type_] = {"precision": p_, "recall": r_, "f1": f_, "support": n_gold[type_]}
    precision, recall, f1 = _prf(len(found), len(pred), len(gold))
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": same / tokens,
            "per_type": per_type}
