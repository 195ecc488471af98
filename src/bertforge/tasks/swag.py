"""SWAG multiple choice: score each (context, start + ending) pair, softmax over the endings.

Inputs are (B, C, S); ``BertForMultipleChoice`` runs the C choices as independent sequences and
returns (B, C) logits. One example counts as one sequence (of C x S tokens) in throughput.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bertforge.data.batch import Batch, LossOutput
from bertforge.data.finetuning import ChoiceExample, read_swag
from bertforge.errors import DataError
from bertforge.metrics.classification import accuracy
from bertforge.models import BertForMultipleChoice
from bertforge.tasks.classify import sequence_arrays
from bertforge.tasks.finetune import EncoderTask, FeatureSet, choice_loss


class MultipleChoiceTask(EncoderTask):
    name = "swag"
    model_class = BertForMultipleChoice

    def read(self) -> tuple[list | None, list | None]:
        d = self.cfg.data
        train = read_swag(d.train)[: d.max_train_examples] if d.train else None
        evals = (read_swag(d.validation, require_labels=self.labelled)[: d.max_eval_examples]
                 if d.validation else None)
        return train, evals

    def encode(self, examples: list[ChoiceExample], training: bool) -> FeatureSet:
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
        return FeatureSet(arrays)

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits  # (B, C)
        return choice_loss(logits, batch)

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"logits": out.logits}

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        return {"accuracy": accuracy(outputs["logits"].argmax(-1),
                                     self.eval_features.arrays["labels"])}

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        return [{"id": ex.id, "label": int(p)}
                for ex, p in zip(self.eval_examples, outputs["logits"].argmax(-1))]

    def model_overrides(self) -> dict[str, Any]:
        return {"finetuning_task": "swag"}
