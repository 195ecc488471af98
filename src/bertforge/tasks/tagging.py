"""Token classification (NER, POS, chunking) on CoNLL-style or JSON Lines files.

Words are split into sub-tokens; each word's tag is trained and predicted on its first
sub-token (the others carry IGNORE_INDEX), as BERT's paper did for CoNLL-2003. Which token is a
word's first is what the tokenizer's word ids say (``Window.word_spans``), so a word it keeps
nothing of is predicted "O" and moves no other word's tag. A sentence longer than
``data.max_seq_length`` tokens is cut (with one warning and a count); its cut words are
predicted "O". Scores are entity-level precision/recall/F1 with seqeval's definition.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.batch import IGNORE_INDEX, Batch, LossOutput, real_tokens
from bertforge.data.finetuning import LabelMap, TaggedExample
from bertforge.errors import ConfigError
from bertforge.tasks.classify import model_label_map
from bertforge.tasks.finetuning import EncoderTask, Encoded, Examples, pad_to

log = logging.getLogger(__name__)


class TokenClassificationTask(EncoderTask):
    """Facts of its examples: ``labels``, the tag names (from the training file, else the
    model). The evaluation features' alignment is the first sub-token of each kept word."""

    @property
    def labels(self) -> LabelMap:
        return self.examples.facts["labels"]

    def read(self) -> Examples:
        d, read = self.cfg.data, self.spec.reader.load()
        train = read(d.train)[: d.max_train_examples] if d.train else None
        labels = (LabelMap.from_examples(train) if train is not None
                  else model_label_map(self.source.config))
        if labels is None:
            raise ConfigError(f"model={self.cfg.model} records no tag names (id2label) and no "
                              "data.train was given to learn them from")
        evaluation = read(d.validation)[: d.max_eval_examples] if d.validation else None
        if evaluation is not None and self.labelled and any(ex.tags is None for ex in evaluation):
            raise ConfigError(f"{d.validation} has no tag column: it cannot be scored")
        return Examples(train, evaluation, {"labels": labels})

    def encode(self, examples: Sequence[TaggedExample], training: bool) -> Encoded:
        windows = self.tokenizer.encode_windows([ex.tokens for ex in examples],
                                                max_length=self.max_seq_length,
                                                is_pretokenized=True)
        n, s = len(windows), self.max_seq_length
        arrays = self.tokenizer.pad_windows(windows, s)
        labels = np.full((n, s), IGNORE_INDEX, dtype=np.int64)
        starts: list[np.ndarray] = []  # per example and word: its first sub-token, -1: none
        cut = 0
        for i, (ex, w) in enumerate(zip(examples, windows)):
            # By word id: a word the tokenizer keeps nothing of has no position, and the
            # words after it keep their own.
            first = {word: lo for word, (lo, _) in w.word_spans().items()}
            starts.append(np.array([first.get(k, -1) for k in range(len(ex.tokens))],
                                   dtype=np.int64))
            cut += len(w.ids) >= s and max(first, default=-1) + 1 < len(ex.tokens)
            if ex.tags is not None and (training or self.labelled):
                for word, position in first.items():
                    labels[i, position] = self.labels.id(ex.tags[word], ex.source)
        if cut:
            log.warning("%d of %d sentences are longer than data.max_seq_length=%d tokens; "
                        "their last words are %s", cut, n, s,
                        "not trained on" if training else "predicted as O")
        if training or self.labelled:
            arrays["labels"] = labels
        return Encoded(self.batches(arrays), alignment=None if training else starts)

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        logits = model(**self.model_inputs(batch)).logits.float()  # (B, S, L)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                               ignore_index=IGNORE_INDEX)
        return LossOutput(loss, {"loss": loss.detach()}, sequences=int(logits.shape[0]),
                          tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"tags": pad_to(out.logits.argmax(-1), self.max_seq_length, -1)}  # (B, S)

    def predicted_tags(self, outputs: dict[str, np.ndarray]) -> list[list[str]]:
        tags = outputs["tags"].astype(np.int64)
        out = []
        for row, first in zip(tags, self.features.evaluation.alignment):
            # A word without a sub-token (dropped by the tokenizer, or cut off) is "O".
            out.append([self.labels.name(int(row[t])) if t >= 0 else "O" for t in first])
        return out

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        scores = self.spec.metric.load()([ex.tags for ex in self.examples.evaluation],
                                         self.predicted_tags(outputs))
        # Flat names (PER_f1, ...) so every metric is a number in logs and eval_results.json.
        per_type = scores.pop("per_type")
        return {**scores, **{f"{kind}_{name}": value for kind, values in sorted(per_type.items())
                             for name, value in values.items()}}

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        return [{"id": ex.id, "tokens": ex.tokens, "tags": tags}
                for ex, tags in zip(self.examples.evaluation, self.predicted_tags(outputs))]

    def model_overrides(self) -> dict[str, Any]:
        return {"num_labels": len(self.labels), "id2label": self.labels.id2label,
                "finetuning_task": "token-classification"}


__all__ = ["TokenClassificationTask"]
