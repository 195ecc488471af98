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
from typing import Any, Callable, ContextManager, Sequence

import torch
import torch.nn.functional as F

from bertforge.data.batch import Batch, LossOutput, real_tokens
from bertforge.data.finetuning.qa import NO_SPAN_ODDS
from bertforge.data.finetuning.squad import postprocess_qa, qa_features, write_qa_outputs
from bertforge.metrics.squad import SquadQuestion, score_v2
from bertforge.tasks.finetuning import EncoderTask, Encoded, Examples, pad_to

_MASKED_LOGIT = -1e4  # logits of padding positions, never chosen as a span end


class SquadTask(EncoderTask):
    prediction_file = "predictions.json"

    @property
    def version_2(self) -> bool:
        """SQuAD v2.0 (questions may have no answer): learned from the files, or from the
        model when predicting new questions."""
        return self.examples.facts["version_2"]

    def read(self) -> Examples:
        data = self.cfg.data
        read = self.spec.reader.load()
        train, evaluation, version_2 = None, None, False
        if data.train:
            parsed = read(data.train)
            train, version_2 = parsed.examples[: data.max_train_examples], parsed.version == "2.0"
        if not self.labelled:  # new questions: answer them as the model was trained to
            version_2 = self.source.config.finetuning_task == "squad_v2"
        if data.validation:
            parsed = read(data.validation, require_answers=self.labelled)
            evaluation = parsed.examples[: data.max_eval_examples]
            version_2 = version_2 or parsed.version == "2.0"
        return Examples(train, evaluation, {"version_2": version_2})

    def encode(self, examples: Sequence, training: bool) -> Encoded:
        d = self.cfg.data
        qa = qa_features(examples, self.tokenizer, max_seq_length=self.max_seq_length,
                         doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                         training=training)
        arrays = {"input_ids": qa.input_ids, "token_type_ids": qa.token_type_ids,
                  "attention_mask": qa.attention_mask}
        if training:
            arrays.update(start_positions=qa.start_positions, end_positions=qa.end_positions)
        return Encoded(self.batches(arrays), alignment=None if training else qa)

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        out = model(**self.model_inputs(batch))
        # The span softmax runs over real tokens only: padding is never an answer, and its logits
        # (the head's bias when the encoder ran unpadded) would otherwise depend on the batch's
        # width. transformers' loss includes them; this is the one place the two differ.
        padding = batch["attention_mask"] == 0
        start = F.cross_entropy(out.start_logits.float().masked_fill(padding, _MASKED_LOGIT),
                                batch["start_positions"])
        end = F.cross_entropy(out.end_logits.float().masked_fill(padding, _MASKED_LOGIT),
                              batch["end_positions"])
        loss = (start + end) / 2
        return LossOutput(loss, {"loss": loss.detach()}, sequences=int(batch["input_ids"].shape[0]),
                          tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        width = self.max_seq_length
        return {"start_logits": pad_to(out.start_logits, width, _MASKED_LOGIT),
                "end_logits": pad_to(out.end_logits, width, _MASKED_LOGIT)}

    def collect(self, model: torch.nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, Any]:
        """The logits of every window, and the answers the n-best search makes of them (scoring
        and writing the predictions of one pass share one search)."""
        outputs = super().collect(model, autocast)
        e = self.cfg.eval
        outputs["answers"] = postprocess_qa(
            self.examples.evaluation, self.features.evaluation.alignment,
            outputs["start_logits"], outputs["end_logits"], n_best_size=e.n_best_size,
            max_answer_length=e.max_answer_length, version_2=self.version_2,
            null_score_diff_threshold=e.null_score_diff_threshold)
        return outputs

    def score(self, outputs: dict[str, Any]) -> dict:
        preds = outputs["answers"]
        questions = [SquadQuestion(ex.id, tuple(a.text for a in ex.answers))
                     for ex in self.examples.evaluation]
        if not self.version_2:  # the record's metric; v2 adds unanswerable questions
            return self.spec.metric.load()(questions, preds.predictions)
        # The predictions already answer "" where the null score wins by the configured
        # threshold, so exact/f1 score them as they are (threshold inf); null_odds order the
        # questions for the official best-threshold search.
        odds = {k: min(v, NO_SPAN_ODDS) for k, v in preds.null_odds.items()}
        return score_v2(questions, preds.predictions, na_probs=odds, na_prob_thresh=math.inf)

    def write_predictions(self, output_dir: Path, outputs: dict[str, Any]) -> None:
        write_qa_outputs(output_dir, outputs["answers"], self.version_2)

    def model_overrides(self) -> dict[str, Any]:
        return {"finetuning_task": "squad_v2" if self.version_2 else "squad"}


__all__ = ["SquadTask"]
