"""``bertforge predict``: with a MODE, answer inputs given as options or read from stdin; without,
predict a whole file with the fine-tuning task's reader (``--data``, ``--output``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from bertforge.commands.base import Command, beside, precision_option
from bertforge.config import GenerationOptions
from bertforge.core.limits import MIN_SEQUENCE_TOKENS, POOLINGS
from bertforge.core.schema import REQUIRED, check_fields, closest_key, flag, opt, save_config
from bertforge.errors import ConfigError
from bertforge.inference.interactive import MODES


@dataclass
class PredictConfig(GenerationOptions):
    """``bertforge predict``; the generation options apply to summarize (and to a
    summarization model's file predictions)."""

    mode: Optional[str] = opt(None, "qa: answer questions about a passage; classify: label names "
                              "and scores; tag: word tags; fill-mask: tokens for [MASK] (<mask> "
                              "for BART); summarize: BART summaries; embed: text vectors. Omit "
                              "to predict a file.", positional="?", choices=tuple(MODES))
    model: str = opt(REQUIRED, "A model directory (e.g. written by `bertforge finetune`); its "
                     "config.json says the task.")
    data: Optional[str] = opt(None, "No MODE: SQuAD JSON / JSONL questions, or TSV/CSV/JSONL "
                              "sentences, or CoNLL/JSONL tokens, as the model's task reads them.")
    output: Optional[str] = opt(None, "No MODE: file to write (SQuAD: id -> answer JSON; others: "
                                "JSON Lines).")
    question: Optional[str] = opt(None, "qa: the question; without it questions are read from "
                                  "stdin, one a line.")
    context: Optional[str] = opt(None, "qa: the passage to answer from.")
    context_file: Optional[str] = opt(None, "qa: a UTF-8 file holding the passage.")
    text: Optional[List[str]] = opt(None, "Other modes: an input text (repeat for more); without "
                                    "it texts are read from stdin, one a line.", repeat=True)
    json: bool = opt(False, "Print one JSON object per input (JSON Lines) instead of text lines.")
    device: str = opt("auto", "auto (cuda if available), cpu, cuda, cuda:1...")
    precision: str = precision_option()
    max_seq_length: Optional[int] = opt(None, "Tokens per input (default: the run's "
                                        "data.max_seq_length for qa, else the model's "
                                        "positions).", minimum=MIN_SEQUENCE_TOKENS)
    truncation: Optional[str] = opt(None, "An input over --max-seq-length: an error, cut (and "
                                    "marked), or (classify, embed) chunk: split into "
                                    "overlapping windows whose results are averaged. Default: "
                                    "truncate for summarize, error otherwise; qa splits long "
                                    "passages into windows itself.",
                                    choices=("error", "truncate", "chunk"))
    doc_stride: Optional[int] = opt(None, "qa: tokens between window starts (default: the run's, "
                                    "else 128).", minimum=1)
    max_query_length: Optional[int] = opt(None, "qa: questions are cut to this many tokens "
                                          "(default: the run's, else 64).", minimum=1)
    top_k: Optional[int] = opt(None, "fill-mask: candidates per mask (default 5).", minimum=1)
    pooling: Optional[str] = opt(None, "embed: mean of the token vectors, the first token's or "
                                 "the last token's (default: the model's saved "
                                 "sentence-transformers pooling, else mean).", choices=POOLINGS)
    finetune_overrides: List[str] = opt(
        help="No MODE: fine-tuning config keys for the run's settings, e.g. "
             "--eval.batch_size=128 (every --key=value that is not a predict option).",
        factory=list, cli=False)

    def __post_init__(self) -> None:
        check_fields(self)
        super().__post_init__()
        if self.mode is None:
            given = [f for f in ("question", "context", "context_file", "text")
                     if getattr(self, f)]
            if given:
                raise ConfigError(f"{flag(given[0])} needs a MODE, e.g. "
                                  "`bertforge predict qa --model DIR --question Q --context C`")
            if not (self.data and self.output):
                raise ConfigError("predict needs a MODE (qa, classify, tag, fill-mask, "
                                  "summarize, embed) or --data and --output to predict a whole "
                                  "file")
        elif self.finetune_overrides or self.data or self.output:
            wrong = " ".join(self.finetune_overrides) or ("--data" if self.data else "--output")
            raise ConfigError(f"predict {self.mode} does not take {wrong}: --data, --output and "
                              "fine-tuning --key=value settings are for predicting a whole "
                              f"file (no MODE){self._hint()}")

    def _hint(self) -> str:
        """A predict option that a fine-tuning setting given with a MODE may have meant."""
        key = self.finetune_overrides[0][2:].split("=")[0] if self.finetune_overrides else ""
        close = closest_key(PredictConfig, key) if key else None
        return f"; did you mean {flag(close)}?" if close else ""


def run_predict(cfg: PredictConfig) -> int:
    if cfg.mode is None:
        from bertforge.core.io import output_lock
        from bertforge.inference.predict import predict_file

        # Two commands writing one file would each publish their own: one writer at a time,
        # as for a run's directory (the predictions and their config.yaml both).
        with output_lock(Path(cfg.output), "--output", "bertforge predict", beside=True):
            out = predict_file(Path(cfg.model), Path(cfg.data), Path(cfg.output),
                               cfg.finetune_overrides, values={"eval": cfg.generation_overrides(),
                                                               "precision": cfg.precision})
            save_config(cfg, beside(out))
        print(f"wrote predictions to {out}")
        return 0
    from bertforge.inference.interactive import run_predict as answer

    options = {k: getattr(cfg, k) for k in ("doc_stride", "max_query_length", "pooling")
               if getattr(cfg, k) is not None}
    fields = {"top_k": cfg.top_k} if cfg.top_k is not None else {}
    return answer(cfg.mode, cfg.model, question=cfg.question, context=cfg.context,
                  context_file=cfg.context_file, texts=cfg.text or (), as_json=cfg.json,
                  device=cfg.device, precision=cfg.precision, max_length=cfg.max_seq_length,
                  truncation=cfg.truncation, options=options,
                  fields={**fields, **cfg.generation_overrides()}, stdin=sys.stdin,
                  stdout=sys.stdout, stderr=sys.stderr)


PREDICT = Command(
    "predict", "Predict with a model. With a MODE: answer a question or label texts given as "
    "options or read from stdin, one per line. Without: predict a whole file with the "
    "fine-tuning task's reader (--data, --output; extra --key=value options are fine-tuning "
    "config keys, e.g. --eval.batch_size=128).", PredictConfig, run_predict,
    passthrough="finetune_overrides", saves="file predictions only: OUTPUT.config.yaml")
