"""SQuAD v1.1 / v2.0 extractive question answering as a fine-tuning task.

Windows with doc stride (``data.doc_stride``) from the tokenizer's offsets; the loss is the mean
of the start and end cross-entropies (answers outside a window, and unanswerable questions,
target [CLS]); evaluation post-processes the n-best spans of every window of a question into one
answer and scores it with the official definitions. Outputs: predictions.json (id -> text),
nbest_predictions.json and, for v2.0, null_odds.json.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.batch import Batch, LossOutput, real_tokens
from bertforge.data.finetuning.qa_postprocess import NO_SPAN_ODDS, QAPredictions
from bertforge.data.finetuning.squad import (QAFeatures, postprocess_qa, qa_features, read_squad,
                                             write_qa_outputs)
from bertforge.metrics.squad import SquadQuestion, score_v1, score_v2
from bertforge.models import BertConfig, BertForQuestionAnswering
from bertforge.tasks.finetune import EncoderTask, FeatureSet, pad_to

_MASKED_LOGIT = -1e4  # logits of padding positions, never chosen as a span end


class SquadTask(EncoderTask):
    name = "squad"
    model_class = BertForQuestionAnswering
    prediction_file = "predictions.json"

    def read(self) -> tuple[list | None, list | None]:
        data = self.cfg.data
        self.version_2 = False
        self._processed: tuple[dict, QAPredictions] | None = None
        train = None
        if data.train:
            parsed = read_squad(data.train)
            train = parsed.examples[: data.max_train_examples]
            self.version_2 = parsed.version == "2.0"
        if not self.labelled:  # new questions: answer them as the model was trained to
            self.version_2 = BertConfig.load(str(self.cfg.model)).finetuning_task == "squad_v2"
        if data.validation:
            evals = read_squad(data.validation, require_answers=self.labelled)
            self.version_2 = self.version_2 or evals.version == "2.0"
            return train, evals.examples[: data.max_eval_examples]
        return train, None

    def encode(self, examples: list, training: bool) -> FeatureSet:
        d = self.cfg.data
        qa = qa_features(examples, self.tokenizer, max_seq_length=self.max_seq_length,
                         doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                         training=training)
        arrays = {"input_ids": qa.input_ids, "token_type_ids": qa.token_type_ids,
                  "attention_mask": qa.attention_mask}
        if training:
            arrays.update(start_positions=qa.start_positions, end_positions=qa.end_positions)
        else:
            self.qa_eval = qa
        return FeatureSet(arrays)

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        start = F.cross_entropy(out.start_logits.float(), batch["start_positions"])
        end = F.cross_entropy(out.end_logits.float(), batch["end_positions"])
        loss = (start + end) / 2
        return LossOutput(loss, {"loss": loss.detach()}, sequences=int(batch["input_ids"].shape[0]),
                          tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        width = self.max_seq_length
        return {"start_logits": pad_to(out.start_logits, width, _MASKED_LOGIT),
                "end_logits": pad_to(out.end_logits, width, _MASKED_LOGIT)}

    def postprocess(self, outputs: dict[str, np.ndarray]) -> QAPredictions:
        """Answers from the logits of an evaluation pass; scoring and writing the predictions
        of the same pass share one run of the n-best search."""
        if self._processed is None or self._processed[0] is not outputs:
            e = self.cfg.eval
            self._processed = (outputs, postprocess_qa(
                self.eval_examples, self.qa_eval, outputs["start_logits"], outputs["end_logits"],
                n_best_size=e.n_best_size, max_answer_length=e.max_answer_length,
                version_2=self.version_2, null_score_diff_threshold=e.null_score_diff_threshold))
        return self._processed[1]

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        preds = self.postprocess(outputs)
        questions = [SquadQuestion(ex.id, tuple(a.text for a in ex.answers))
                     for ex in self.eval_examples]
        if not self.version_2:
            return score_v1(questions, preds.predictions)
        # The predictions already answer "" where the null score wins by the configured
        # threshold, so exact/f1 score them as they are (threshold inf); null_odds order the
        # questions for the official best-threshold search.
        odds = {k: min(v, NO_SPAN_ODDS) for k, v in preds.null_odds.items()}
        return score_v2(questions, preds.predictions, na_probs=odds, na_prob_thresh=math.inf)

    def write_predictions(self, output_dir: Path, outputs: dict[str, np.ndarray]) -> None:
        write_qa_outputs(output_dir, self.postprocess(outputs), self.version_2)

    def model_overrides(self) -> dict[str, Any]:
        return {"finetuning_task": "squad_v2" if self.version_2 else "squad"}


__all__ = ["QAFeatures", "SquadTask"]
