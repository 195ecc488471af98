"""Sequence (pair) classification and regression: the nine GLUE tasks and the user's own data.

With ``data.task_name`` (``task: glue``) the GLUE files are read with the task's canonical labels
and metrics; otherwise the user's CSV/TSV/JSON Lines (``data.text_columns``, ``data.label_column``,
``data.regression``), labels in sorted order from the training file, reported as accuracy/F1 (or
Pearson/Spearman/MSE). MNLI evaluates dev_matched (``accuracy``) and dev_mismatched
(``accuracy_mm``) in one pass. Predictions go to predictions.jsonl.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.batch import Batch, LossOutput, real_tokens
from bertforge.data.finetuning import LabelMap, TextExample, glue_task, read_glue
from bertforge.errors import ConfigError
from bertforge.metrics.classification import glue_metrics
from bertforge.tasks.finetuning import EncoderTask, Encoded, Examples, choice_loss


def model_label_map(config: Any) -> LabelMap | None:
    """Label names recorded in a fine-tuned model's config (id2label), if any."""
    if not config.id2label:
        return None
    return LabelMap([config.id2label[i] for i in range(config.num_labels)])


def sequence_arrays(tokenizer, firsts: list, seconds: list | None, max_length: int,
                    shape: tuple[int, ...], truncation: str = "longest_first") -> dict:
    """input_ids/token_type_ids/attention_mask of ``shape + (max_length,)`` from text (pairs)."""
    windows = tokenizer.encode_windows(firsts, seconds, max_length=max_length,
                                       truncation=truncation)
    arrays = tokenizer.pad_windows(windows, max_length)
    return {key: value.reshape(shape + (max_length,)) for key, value in arrays.items()}


class ClassificationTask(EncoderTask):
    """Facts of its examples: ``glue`` (the GLUE task, or None), ``regression``, ``labels`` (the
    class names, None for regression) and ``matched`` (evaluation rows before MNLI's
    mismatched ones)."""

    @property
    def name(self) -> str:
        glue = self.examples.facts["glue"]
        return f"glue/{glue.name}" if glue is not None else "classification"

    def read(self) -> Examples:
        cfg, d = self.cfg, self.cfg.data
        if cfg.task == "glue" and not d.task_name:
            raise ConfigError("task=glue needs data.task_name (cola sst2 mrpc stsb qqp mnli "
                              "qnli rte wnli)")
        glue = glue_task(d.task_name) if d.task_name else None
        regression = glue.is_regression if glue is not None else d.regression
        train = self._read(glue, d.train, True)[: d.max_train_examples] if d.train else None
        labels = None
        if not regression:
            labels = (glue.label_map() if glue is not None else LabelMap.from_examples(train)
                      if train is not None else model_label_map(self.source.config))
            if labels is None:
                raise ConfigError(f"model={cfg.model} records no label names (id2label) and no "
                                  "data.train was given to learn them from")
        evaluation, matched = self._read_evaluation(glue)
        return Examples(train, evaluation, {"glue": glue, "regression": regression,
                                            "labels": labels, "matched": matched})

    def _read_evaluation(self, glue: Any) -> tuple[list | None, int]:
        d = self.cfg.data
        if not d.validation:
            return None, 0
        evaluation = self._read(glue, d.validation, self.labelled)[: d.max_eval_examples]
        matched = len(evaluation)
        if d.validation_mismatched:
            if glue is None or glue.name != "mnli":
                raise ConfigError("data.validation_mismatched is for task=glue with "
                                  "data.task_name=mnli only")
            evaluation += self._read(glue, d.validation_mismatched,
                                     self.labelled)[: d.max_eval_examples]
        return evaluation, matched

    def _read(self, glue: Any, path: str, require_labels: bool) -> list[TextExample]:
        if glue is not None:
            return read_glue(path, glue.name, require_labels=require_labels)
        d = self.cfg.data
        return self.spec.reader.load()(path, d.text_columns, d.label_column,
                                       regression=d.regression, require_labels=require_labels)

    def encode(self, examples: Sequence[TextExample], training: bool) -> Encoded:
        pairs = any(ex.text_b is not None for ex in examples)
        arrays = sequence_arrays(self.tokenizer, [ex.text_a for ex in examples],
                                 [ex.text_b or "" for ex in examples] if pairs else None,
                                 self.max_seq_length, (len(examples),))
        if training or self.labelled:
            facts = self.examples.facts
            if facts["regression"]:
                arrays["labels"] = np.asarray([float(ex.label) for ex in examples], np.float32)
            else:
                arrays["labels"] = np.asarray([facts["labels"].id(str(ex.label), ex.source)
                                               for ex in examples], dtype=np.int64)
        return Encoded(self.batches(arrays))

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        logits = model(**self.model_inputs(batch)).logits
        if not self.examples.facts["regression"]:
            return choice_loss(logits, batch)
        loss = F.mse_loss(logits.float().squeeze(-1), batch["labels"].float())
        return LossOutput(loss, {"loss": loss.detach()}, sequences=int(logits.shape[0]),
                          tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"logits": out.logits}

    def predictions(self, logits: np.ndarray) -> np.ndarray:
        return logits[:, 0] if self.examples.facts["regression"] else logits.argmax(-1)

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        facts = self.examples.facts
        preds = self.predictions(outputs["logits"])
        gold = self.features.evaluation.features.arrays["labels"]
        parts = [("", slice(0, facts["matched"])), ("_mm", slice(facts["matched"], len(gold)))]
        metrics: dict[str, float] = {}
        for suffix, rows in parts:
            if rows.start == rows.stop:
                continue
            if facts["glue"] is not None:
                scores = glue_metrics(facts["glue"].name, preds[rows], gold[rows])
            else:
                scores = self.spec.metric.load()(preds[rows], gold[rows],
                                                 len(facts["labels"] or ()) or 1,
                                                 regression=facts["regression"])
            metrics.update({k + suffix: v for k, v in scores.items()})
        return metrics

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        facts = self.examples.facts
        preds = self.predictions(outputs["logits"]).tolist()
        return [{"id": ex.id,
                 "label": p if facts["regression"] else facts["labels"].name(int(p))}
                for ex, p in zip(self.examples.evaluation, preds)]

    def model_overrides(self) -> dict[str, Any]:
        facts = self.examples.facts
        if facts["regression"]:
            return {"num_labels": 1, "id2label": None, "problem_type": "regression",
                    "finetuning_task": self.name}
        return {"num_labels": len(facts["labels"]), "id2label": facts["labels"].id2label,
                "problem_type": "single_label_classification", "finetuning_task": self.name}


__all__ = ["ClassificationTask", "model_label_map", "sequence_arrays"]
