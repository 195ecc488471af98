"""Question answering: the fine-tuning windows and n-best search, answers with character spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from bertforge.data.finetuning.qa import WindowOffsets, too_long
from bertforge.data.finetuning.squad import QAExample, QAFeatures, postprocess_qa, qa_features
from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import (InputError, Pipeline, _MASKED_LOGIT, _fields,
                                                _logits, _text)

# --- question answering ------------------------------------------------------------------------


@dataclass(frozen=True)
class QARequest:
    question: str
    context: str
    features: QAFeatures  # the windows of this one question, as fine-tuning cuts them


@dataclass
class QuestionAnsweringPipeline(Pipeline):
    """Extractive QA; a long context is split into doc-stride windows, never cut. A question or
    context over ``MAX_CONTEXT_CHARS`` characters (``data.finetuning.qa``) is an
    ``InputError``, and so is a question the tokenizer keeps nothing of. Answers are the spans
    evaluation picks, widened to whole words (``align_to_words``)."""

    fields: ClassVar[tuple[str, ...]] = ("question", "context")
    text_field: ClassVar[str | None] = None  # a bare string is not a question with a context
    options: ClassVar[tuple[str, ...]] = ("doc_stride", "max_query_length", "n_best_size",
                                          "max_answer_length", "null_score_diff_threshold",
                                          "max_windows", "align_to_words")
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    max_windows: int = 64      # windows per forward pass
    align_to_words: bool = True
    """Widen an answer that starts or ends inside a word to the whole word (as transformers'
    QA pipeline does); evaluation scores the spans as the model gives them."""
    version_2: bool | None = None  # SQuAD 2.0 model, may answer "no answer" (None: config.json)
    windowed: ClassVar[bool] = True

    @classmethod
    def run_settings(cls, run: Any) -> dict[str, Any]:
        """Window and n-best settings of the fine-tuning run that wrote the model (its
        config.yaml, a ``FinetuneConfig``), so a prediction cuts and reads a context as
        evaluation did."""
        data, e = run.data, run.eval
        settings = {"doc_stride": data.doc_stride, "max_query_length": data.max_query_length,
                    "n_best_size": e.n_best_size, "max_answer_length": e.max_answer_length,
                    "null_score_diff_threshold": e.null_score_diff_threshold}
        return {**settings, "max_length": data.max_seq_length} if data.max_seq_length else settings

    def __post_init__(self) -> None:
        if not isinstance(self.align_to_words, bool):
            raise ConfigError(f"align_to_words must be true or false, got {self.align_to_words!r}")
        if self.version_2 is None:
            self.version_2 = self.config.finetuning_task == "squad_v2"
        # Checks the window settings now (ConfigError), not at the first request.
        qa_features([], self.tokenizer, max_seq_length=self.max_length,
                     doc_stride=self.doc_stride, max_query_length=self.max_query_length,
                     training=False)

    def parse(self, item: Mapping[str, Any]) -> QARequest:
        item = _fields(item, self.fields)
        question, context = _text(item, "question"), _text(item, "context")
        for name, text in (("question", question), ("context", context)):
            why = too_long(text, name)
            if why:
                raise InputError(name, why)
        if not self.tokenizer.tokenize(question):
            raise InputError("question", "has no text the model can read (only control or "
                             "formatting characters); send the question's words")
        example = QAExample(id="0", question=question, context=context, answers=[])
        return QARequest(question, context, qa_features(
            [example], self.tokenizer, max_seq_length=self.max_length,
            doc_stride=self.doc_stride, max_query_length=self.max_query_length, training=False))

    def cost(self, request: QARequest) -> int:
        return int(request.features.attention_mask.sum())

    def run(self, requests: Sequence[QARequest]) -> list[dict]:
        if not requests:
            return []
        examples = [QAExample(id=str(i), question=r.question, context=r.context, answers=[])
                    for i, r in enumerate(requests)]
        parts = [r.features for r in requests]
        feats = QAFeatures(
            input_ids=np.concatenate([f.input_ids for f in parts]),
            token_type_ids=np.concatenate([f.token_type_ids for f in parts]),
            attention_mask=np.concatenate([f.attention_mask for f in parts]),
            example_index=np.concatenate([np.full(len(f), i, dtype=np.int64)
                                          for i, f in enumerate(parts)]),
            offsets=WindowOffsets.concat([f.offsets for f in parts]),
            token_is_max_context=np.concatenate([f.token_is_max_context for f in parts]))
        n, s = feats.input_ids.shape
        start = np.full((n, s), _MASKED_LOGIT, dtype=np.float32)  # (N windows, S)
        end = np.full((n, s), _MASKED_LOGIT, dtype=np.float32)
        lengths = feats.attention_mask.sum(1)
        for lo in range(0, n, self.max_windows):
            rows = slice(lo, lo + self.max_windows)
            width = self.batch_width(lengths[rows].tolist())
            inputs = {k: torch.from_numpy(np.ascontiguousarray(getattr(feats, k)[rows, :width]))
                      .to(self.device) for k in self.input_names}
            out = self.forward(inputs)
            start[rows, :width], end[rows, :width] = (_logits(out.start_logits),
                                                      _logits(out.end_logits))
        preds = postprocess_qa(examples, feats, start, end, n_best_size=self.n_best_size,
                               max_answer_length=self.max_answer_length,
                               version_2=self.version_2,
                               null_score_diff_threshold=self.null_score_diff_threshold)
        return [self._answer(ex.context, preds.predictions[ex.id], preds.nbest[ex.id])
                for ex in examples]

    def _answer(self, context: str, text: str, nbest: list[dict]) -> dict:
        """The result of one question: evaluation's best span, widened to whole words under
        ``align_to_words`` (its score stays the span's)."""
        best = next((e for e in nbest if e["text"] == text), nbest[0])
        start, end = (best["start"], best["end"]) if text else (None, None)
        if text and self.align_to_words:
            start, end = self.tokenizer.word_bounds(context, start, end)
            text = context[start:end]
        result: dict[str, Any] = {"answer": text, "score": best["probability"], "start": start,
                                  "end": end}
        if self.version_2:
            result["no_answer"] = text == ""
        return result

    def describe(self) -> dict:
        return {**super().describe(), "doc_stride": self.doc_stride,
                "max_query_length": self.max_query_length, "version_2": self.version_2,
                "align_to_words": self.align_to_words}

    def example(self) -> dict:
        return {"question": "Where is the Eiffel Tower?",
                "context": "The Eiffel Tower is a wrought-iron tower in Paris, France."}

    def format_line(self, result: dict) -> str:
        if not result["answer"]:
            return f"(no answer)  score {result['score']:.4f}"
        return (f"{result['answer']}  score {result['score']:.4f}, characters "
                f"{result['start']}-{result['end']}")


