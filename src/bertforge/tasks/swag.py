"""SWAG multiple choice: score each (context, start + ending) pair, softmax over the endings.

Inputs are (B, C, S); ``BertForMultipleChoice`` runs the C choices as independent sequences and
returns (B, C) logits. One example counts as one sequence (of C x S tokens) in throughput.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from bertforge.data.batch import Batch, LossOutput
from bertforge.data.finetuning import ChoiceExample
from bertforge.errors import DataError
from bertforge.tasks.classify import sequence_arrays
from bertforge.tasks.finetuning import EncoderTask, Encoded, Examples, choice_loss


class MultipleChoiceTask(EncoderTask):
    def read(self) -> Examples:
        d, read = self.cfg.data, self.spec.reader.load()
        train = read(d.train)[: d.max_train_examples] if d.train else None
        evaluation = (read(d.validation, require_labels=self.labelled)[: d.max_eval_examples]
                      if d.validation else None)
        return Examples(train, evaluation)

    def encode(self, examples: Sequence[ChoiceExample], training: bool) -> Encoded:
        choices = {len(ex.endings) for ex in examples}
        if len(choices) != 1:
            raise DataError(f"examples have different numbers of endings ({sorted(choices)}); "
                            f"first: {examples[0].source}")
        c = choices.pop()
        pairs = [pair for ex in examples for pair in ex.pairs()]
        arrays = sequence_arrays(self.tokenizer, [a for a, _ in pairs], [b for _, b in pairs],
                                 self.max_seq_length, (len(examples), c), truncation="only_second")
        if training or self.labelled:
            arrays["labels"] = np.asarray([ex.label for ex in examples], dtype=np.int64)
        return Encoded(self.batches(arrays))

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        logits = model(**self.model_inputs(batch)).logits  # (B, C)
        return choice_loss(logits, batch)

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"logits": out.logits}

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        gold = self.features.evaluation.features.arrays["labels"]
        return {"accuracy": self.spec.metric.load()(outputs["logits"].argmax(-1), gold)}

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        return [{"id": ex.id, "label": int(p)}
                for ex, p in zip(self.examples.evaluation, outputs["logits"].argmax(-1))]

    def model_overrides(self) -> dict[str, Any]:
        return {"finetuning_task": "swag"}


__all__ = ["MultipleChoiceTask"]
