"""``bertforge evaluate``: score predictions with SQuAD's official metrics or ROUGE."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bertforge.commands.base import Command
from bertforge.core.io import json_text
from bertforge.core.schema import REQUIRED, check_fields, opt
from bertforge.errors import ConfigError


@dataclass
class EvaluateConfig:
    what: str = opt(REQUIRED, "What to evaluate.", positional=True,
                    choices=("squad", "summarization"))
    predictions: str = opt(REQUIRED, "squad: predictions.json (question id -> answer); "
                           "summarization: JSON Lines with id and summary (or prediction), or a "
                           ".txt, one per line.")
    data: Optional[str] = opt(None, "squad: the SQuAD dev JSON (v1.1 or v2.0).")
    na_probs: Optional[str] = opt(None, "squad v2.0: null_odds.json (no-answer scores) for the "
                                  "threshold search.")
    references: Optional[str] = opt(None, "summarization: reference summaries (JSONL/CSV/TSV, "
                                    "CNN/DailyMail story directory, or .txt one per line); "
                                    "matched by id when both have ids.")
    prediction_field: Optional[str] = opt(None, "summarization: the predictions' text field "
                                          "(default: summary/prediction).")
    reference_field: Optional[str] = opt(None, "summarization: the references' field (default: "
                                         "detected; a list field gives several references per "
                                         "example).")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.what == "summarization" and not self.references:
            raise ConfigError("evaluate summarization needs --references (the reference "
                              "summaries)")
        if self.what == "squad" and not self.data:
            raise ConfigError("evaluate squad needs --data (the SQuAD dev JSON)")


def run_evaluate(cfg: EvaluateConfig) -> int:
    if cfg.what == "summarization":
        from bertforge.metrics.rouge import evaluate_summarization_files

        scores = evaluate_summarization_files(Path(cfg.predictions), Path(cfg.references),
                                              prediction_field=cfg.prediction_field,
                                              reference_field=cfg.reference_field)
    else:
        from bertforge.metrics.squad import evaluate_squad_files

        scores = evaluate_squad_files(Path(cfg.data), Path(cfg.predictions),
                                      Path(cfg.na_probs) if cfg.na_probs else None)
    print(json_text(scores, "evaluate", indent=2))
    return 0


EVALUATE = Command("evaluate", "Score predictions: SQuAD v1.1/v2.0 (official metrics) or "
                   "summaries (ROUGE-1/2/L/Lsum).", EvaluateConfig, run_evaluate)
