"""Sequence (pair) classification and regression: the nine GLUE tasks and the user's own data.

``task: glue`` reads GLUE's files (``data.task_name``) with the task's canonical labels and
metrics; ``task: classification`` reads the user's CSV/TSV/JSON Lines (``data.text_columns``,
``data.label_column``, ``data.regression``), labels in sorted order from the training file, and
reports accuracy/F1 (or Pearson/Spearman/MSE). MNLI evaluates dev_matched (``accuracy``) and
dev_mismatched (``accuracy_mm``) in one pass. Predictions go to predictions.jsonl.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.batch import Batch, LossOutput, real_tokens
from bertforge.data.finetuning import (LabelMap, TextExample, glue_task, read_classification,
                                       read_glue)
from bertforge.errors import ConfigError
from bertforge.metrics.classification import classification_metrics, glue_metrics
from bertforge.models import BertConfig, BertForSequenceClassification
from bertforge.tasks.finetune import EncoderTask, FeatureSet, choice_loss


def model_label_map(model: str) -> LabelMap | None:
    """Label names recorded in a fine-tuned model's config.json, if any."""
    config = BertConfig.load(model)
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
    model_class = BertForSequenceClassification

    def read(self) -> tuple[list | None, list | None]:
        cfg, d = self.cfg, self.cfg.data
        if cfg.task == "glue":
            if not d.task_name:
                raise ConfigError("task=glue needs data.task_name (cola sst2 mrpc stsb qqp mnli "
                                  "qnli rte wnli)")
            self.glue = glue_task(d.task_name)
            self.name = f"glue/{self.glue.name}"
            self.regression = self.glue.is_regression
            self.labels = None if self.regression else self.glue.label_map()
        else:
            self.glue, self.name, self.regression = None, "classification", d.regression
            self.labels = None
        train = self._read(d.train, True)[: d.max_train_examples] if d.train else None
        if not self.regression and self.labels is None:
            self.labels = (LabelMap.from_examples(train) if train is not None
                           else model_label_map(str(cfg.model)))
            if self.labels is None:
                raise ConfigError(f"model={cfg.model} records no label names (id2label) and no "
                                  "data.train was given to learn them from")
        evals = None
        self.n_matched = 0
        if d.validation:
            evals = self._read(d.validation, self.labelled)[: d.max_eval_examples]
            self.n_matched = len(evals)
            if d.validation_mismatched:
                if self.glue is None or self.glue.name != "mnli":
                    raise ConfigError("data.validation_mismatched is for task=glue with "
                                      "data.task_name=mnli only")
                evals += self._read(d.validation_mismatched, self.labelled)[: d.max_eval_examples]
        return train, evals

    def _read(self, path: str, require_labels: bool) -> list[TextExample]:
        if self.glue is not None:
            return read_glue(path, self.glue.name, require_labels=require_labels)
        d = self.cfg.data
        return read_classification(path, d.text_columns, d.label_column,
                                   regression=d.regression, require_labels=require_labels)

    def encode(self, examples: list[TextExample], training: bool) -> FeatureSet:
        pairs = any(ex.text_b is not None for ex in examples)
        arrays = sequence_arrays(self.tokenizer, [ex.text_a for ex in examples],
                                 [ex.text_b or "" for ex in examples] if pairs else None,
                                 self.max_seq_length, (len(examples),))
        if training or self.labelled:
            if self.regression:
                arrays["labels"] = np.asarray([float(ex.label) for ex in examples], np.float32)
            else:
                arrays["labels"] = np.asarray([self.labels.id(str(ex.label), ex.source)
                                               for ex in examples], dtype=np.int64)
        return FeatureSet(arrays)

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits
        if not self.regression:
            return choice_loss(logits, batch)
        loss = F.mse_loss(logits.float().squeeze(-1), batch["labels"].float())
        return LossOutput(loss, {"loss": loss.detach()}, sequences=int(logits.shape[0]),
                          tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"logits": out.logits}

    def predictions(self, logits: np.ndarray) -> np.ndarray:
        return logits[:, 0] if self.regression else logits.argmax(-1)

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        preds = self.predictions(outputs["logits"])
        gold = self.eval_features.arrays["labels"]
        parts = [("", slice(0, self.n_matched)), ("_mm", slice(self.n_matched, len(gold)))]
        metrics: dict[str, float] = {}
        for suffix, rows in parts:
            if rows.start == rows.stop:
                continue
            if self.glue is not None:
                scores = glue_metrics(self.glue.name, preds[rows], gold[rows])
            else:
                scores = classification_metrics(preds[rows], gold[rows],
                                                len(self.labels or ()) or 1,
                                                regression=self.regression)
            metrics.update({k + suffix: v for k, v in scores.items()})
        return metrics

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        preds = self.predictions(outputs["logits"]).tolist()
        return [{"id": ex.id, "label": p if self.regression else self.labels.name(int(p))}
                for ex, p in zip(self.eval_examples, preds)]

    def model_overrides(self) -> dict[str, Any]:
        if self.regression:
            return {"num_labels": 1, "id2label": None, "problem_type": "regression",
                    "finetuning_task": self.name}
        return {"num_labels": len(self.labels), "id2label": self.labels.id2label,
                "problem_type": "single_label_classification", "finetuning_task": self.name}
