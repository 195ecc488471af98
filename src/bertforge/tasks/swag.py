"""SWAG multiple choice: score each (context, start + ending) pair, softmax over the endings.

Inputs are (B, C, S); ``BertForMultipleChoice`` runs the C choices as independent sequences and
returns (B, C) logits. One example counts as one sequence (of C x S tokens) in throughput.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.batch import Batch, LossOutput, real_tokens
from bertforge.data.finetuning import ChoiceExample, read_swag
from bertforge.errors import DataError
from bertforge.io import write_text_atomic
from bertforge.metrics.classification import accuracy
from bertforge.models import BertForMultipleChoice
from bertforge.tasks.classify import sequence_arrays
from bertforge.tasks.finetune import FeatureSet, FinetuneTask


class MultipleChoiceTask(FinetuneTask):
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
                       token_type_ids=batch["token_type_ids"]).logits.float()  # (B, C)
        loss = F.cross_entropy(logits, batch["labels"])
        acc = (logits.detach().argmax(-1) == batch["labels"]).float().mean()
        return LossOutput(loss, {"loss": loss.detach(), "acc": acc},
                          sequences=int(logits.shape[0]), tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"logits": out.logits}

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        return {"accuracy": accuracy(outputs["logits"].argmax(-1),
                                     self.eval_features.arrays["labels"])}

    def write_predictions(self, output_dir: Path, outputs: dict[str, np.ndarray]) -> None:
        rows = [json.dumps({"id": ex.id, "label": int(p)})
                for ex, p in zip(self.eval_examples, outputs["logits"].argmax(-1))]
        write_text_atomic(output_dir / "predictions.jsonl", "\n".join(rows) + "\n")

    def model_overrides(self) -> dict[str, Any]:
        return {"finetuning_task": "swag"}
