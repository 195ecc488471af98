"""Evaluation metrics for fine-tuned models: SQuAD, GLUE-style classification, entity tagging.

Each follows the definition that published numbers use (the official SQuAD scripts, the GLUE
metrics of the common fine-tuning scripts, CoNLL's entity chunks), so our results compare with
them. SQuAD scores are percentages, as officially; the others are fractions.
"""

from __future__ import annotations

from bertforge.metrics.classification import (
    accuracy,
    classification_metrics,
    f1_binary,
    f1_macro,
    glue_metrics,
    matthews_corrcoef,
    pearson,
    spearman,
)
from bertforge.metrics.seqeval import entity_scores, sentence_entities
from bertforge.metrics.squad import (
    SquadQuestion,
    evaluate_squad_files,
    exact_match,
    normalize_answer,
    questions_from_dataset,
    score_v1,
    score_v2,
    squad_v1_scores,
    squad_v2_scores,
    token_f1,
)

__all__ = [
    "SquadQuestion",
    "accuracy",
    "classification_metrics",
    "entity_scores",
    "evaluate_squad_files",
    "exact_match",
    "f1_binary",
    "f1_macro",
    "glue_metrics",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson",
    "questions_from_dataset",
    "score_v1",
    "score_v2",
    "sentence_entities",
    "spearman",
    "squad_v1_scores",
    "squad_v2_scores",
    "token_f1",
]
