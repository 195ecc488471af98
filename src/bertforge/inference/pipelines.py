"""Inference pipelines: one loaded model, its tokenizer and its task, answering request items.

``bertforge predict MODE``, the HTTP server and the ONNX backend all go through a ``Pipeline``:
``parse`` validates one request item (a JSON object) and encodes it, so a bad field is an
``InputError`` naming it before any batch is formed; ``cost`` is the tokens the item will occupy
(the server's token budget); calling the pipeline on parsed requests runs them as one padded
batch and returns one JSON-able result per request, the same as if each had run alone.

Pre- and post-processing are the fine-tuning tasks' own: SQuAD windows and the n-best search
(``qa_features``, ``postprocess_qa``, with the run's config.yaml settings when present), the
label names saved in config.json, first-sub-token tagging, and generation settings from
generation_config.json. So a pipeline answers what evaluation would have answered.

A batch is padded to its longest sequence rounded up to a multiple of 8, never to
``max_length``: padding is compute, and requests vary a lot in length. An input longer than
``max_length`` tokens is an ``InputError`` (``truncation="error"``) or is cut and its result says
``"truncated": true`` (``"truncate"``); QA splits long contexts into windows instead, and
summarization cuts the article to the model's positions by default.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from bertforge.data.finetuning.labels import LabelMap
from bertforge.data.finetuning.squad import QAExample, QAFeatures, postprocess_qa, qa_features
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer, Window, load_tokenizer
from bertforge.train.precision import Precision, build_precision

__all__ = ["InputError", "Pipeline", "PIPELINES", "TASKS", "infer_task", "load_pipeline"]

TASKS = ("question-answering", "text-classification", "token-classification", "fill-mask",
         "summarization", "feature-extraction")
TRUNCATION = ("error", "truncate")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_MASKED_LOGIT = -1e4  # start/end logits of padding, never part of a span
_MAX_TOP_K = 100


class InputError(ValueError):
    """A bad field of one request item: ``field`` names it ("question", "inputs[2].context"; ""
    for the item itself) and ``message`` says what is wrong and what to send instead."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message

    def within(self, prefix: str) -> InputError:
        """The same error with its field inside ``prefix`` (``inputs[2]`` + ``context``)."""
        return InputError(f"{prefix}.{self.field}" if self.field else prefix, self.message)


# --- request fields ------------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _fields(item: Any, allowed: Sequence[str]) -> Mapping[str, Any]:
    """``item`` as a mapping whose keys are all in ``allowed``."""
    if not isinstance(item, Mapping):
        raise InputError("", f"expected a JSON object with {', '.join(allowed)}, got "
                         f"{_json_type(item)}")
    for key in item:
        if key not in allowed:
            raise InputError(str(key), f"is not a field of this request; fields: "
                             f"{', '.join(allowed)}")
    return item


def _text(item: Mapping[str, Any], name: str, required: bool = True) -> str | None:
    value = item.get(name)
    if value is None:
        if required:
            raise InputError(name, "is required: a non-empty string")
        return None
    if not isinstance(value, str):
        raise InputError(name, f"must be a string, got {_json_type(value)}")
    if not value.strip():
        raise InputError(name, "must not be empty")
    return value


def _number(item: Mapping[str, Any], name: str, kind: type, minimum: float | None = None,
            maximum: float | None = None) -> Any:
    """An optional int (``kind=int``) or finite float field within [minimum, maximum]."""
    value = item.get(name)
    if value is None:
        return None
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not real or (kind is int and not isinstance(value, int)) or not math.isfinite(value):
        wanted = "a whole number" if kind is int else "a finite number"
        raise InputError(name, f"must be {wanted}, got {_json_type(value)} {value!r}")
    if minimum is not None and value < minimum:
        raise InputError(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise InputError(name, f"must be <= {maximum}, got {value}")
    return kind(value)


# --- the base class ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextRequest:
    """A parsed single-text (or text-pair) request: its encoded window and whether it was cut."""

    text: str
    window: Window
    truncated: bool
    top_k: int = 0  # fill-mask only


def _logits(value: Any) -> np.ndarray:
    """Model output (a tensor of the PyTorch model, or an array of another backend) as float32."""
    if torch.is_tensor(value):
        return value.float().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class Pipeline(ABC):
    """One loaded model + tokenizer + task (build with ``load_pipeline``).

    Thread-compatible, not thread-safe: one thread calls it at a time (the server's worker).
    Subclasses add their task's options as fields with defaults (``options`` lists them).
    """

    task: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()
    default_truncation: ClassVar[str] = "error"

    model: Any                 # the PyTorch model, or a backend with the same call and outputs
    tokenizer: Any             # BertTokenizer or BpeTokenizer
    model_dir: Path
    config: Any                # BertConfig or BartConfig
    device: torch.device
    precision: Precision
    max_length: int            # tokens per sequence (pair), special tokens included
    truncation: str            # "error" or "truncate"
    backend: str = "pytorch"

    @abstractmethod
    def parse(self, item: Mapping[str, Any]) -> Any:
        """Validate and encode one request item; ``InputError`` names a missing, wrong-typed,
        empty or too long field."""

    def cost(self, request: Any) -> int:
        """Tokens ``request`` occupies in a batch."""
        return len(request.window.ids)

    @abstractmethod
    def __call__(self, requests: Sequence[Any]) -> list[dict]:
        """One JSON-able result per parsed request, in order, from one padded batch."""

    def describe(self) -> dict:
        """What /health and the OpenAPI examples show: task, model, limits, an example item."""
        return {"task": self.task, "model": str(self.model_dir),
                "model_type": self.config.model_type, "backend": self.backend,
                "device": str(self.device), "precision": self.precision.name,
                "max_length": self.max_length, "truncation": self.truncation,
                "example": self.example()}

    @abstractmethod
    def example(self) -> dict:
        """A valid request item, for documentation."""

    # -- shared machinery ---------------------------------------------------------------------
    @property
    def input_names(self) -> tuple[str, ...]:
        if self.config.model_type == "bert":
            return ("input_ids", "attention_mask", "token_type_ids")
        return ("input_ids", "attention_mask")

    def parse_text(self, item: Mapping[str, Any]) -> TextRequest:
        """An item of one ``text`` field, encoded (the parse of tagging and embeddings)."""
        item = _fields(item, ("text",))
        text = _text(item, "text")
        return TextRequest(text, *self.encode_text(text))

    def encode_text(self, text: str, pair: str | None = None) -> tuple[Window, bool]:
        """The window of ``text`` (and ``pair``) with special tokens, and whether it was cut to
        ``max_length`` (``InputError`` instead under ``truncation="error"``)."""
        n = len(self.tokenizer.encode(text, pair))
        over = n > self.max_length
        if over and self.truncation == "error":
            what = "with text_pair " if pair is not None else ""
            raise InputError("text", f"{what}{n} tokens long, over this model's limit of "
                             f"{self.max_length}; shorten it, or use truncation=truncate")
        if isinstance(self.tokenizer, BertTokenizer):
            window = self.tokenizer.encode_windows([text], None if pair is None else [pair],
                                                   max_length=self.max_length)[0]
        else:
            ids = self.tokenizer.encode_truncated([text], self.max_length)[0]
            window = Window(ids=ids, type_ids=[0] * len(ids), offsets=[], sequence_ids=[],
                            word_ids=[], source=0)
        return window, over

    def batch_width(self, lengths: Sequence[int]) -> int:
        """The padded width of a batch: its longest sequence rounded up to 8, within limits."""
        return min(-(-max(lengths) // 8) * 8, max(self.max_length, max(lengths)))

    def pad(self, windows: Sequence[Window]) -> dict[str, torch.Tensor]:
        """Model inputs of ``windows`` padded to ``batch_width``, on the pipeline's device."""
        width = self.batch_width([len(w.ids) for w in windows])
        if isinstance(self.tokenizer, BertTokenizer):
            arrays = self.tokenizer.pad_windows(windows, width)
        else:
            ids = np.full((len(windows), width), self.tokenizer.pad_id, dtype=np.int64)
            mask = np.zeros_like(ids)
            for i, w in enumerate(windows):  # a loop over sequences, not tokens
                ids[i, :len(w.ids)], mask[i, :len(w.ids)] = w.ids, 1
            arrays = {"input_ids": ids, "attention_mask": mask}
        return {k: torch.from_numpy(arrays[k]).to(self.device) for k in self.input_names}

    def forward(self, inputs: dict[str, torch.Tensor]) -> Any:
        """The model's output for ``inputs`` in inference mode and the pipeline's precision."""
        with torch.inference_mode(), self.precision.autocast():
            return self.model(**inputs)

    def mark(self, result: dict, request: Any) -> dict:
        """``result`` with ``"truncated": true`` when the request's input was cut."""
        if getattr(request, "truncated", False):
            result["truncated"] = True
        return result


def _labels(config: Any) -> LabelMap:
    """The label names of config.json (id2label), else transformers' LABEL_i."""
    names = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
    return LabelMap([names[i] for i in range(config.num_labels)])


# --- question answering ------------------------------------------------------------------------


@dataclass(frozen=True)
class QARequest:
    question: str
    context: str
    features: QAFeatures  # the windows of this one question, as fine-tuning cuts them


@dataclass
class QuestionAnsweringPipeline(Pipeline):
    """Extractive QA; a long context is split into doc-stride windows, never cut."""

    task: ClassVar[str] = "question-answering"
    options: ClassVar[tuple[str, ...]] = ("doc_stride", "max_query_length", "n_best_size",
                                          "max_answer_length", "null_score_diff_threshold",
                                          "max_windows")
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0
    max_windows: int = 64      # windows per forward pass
    version_2: bool = False    # SQuAD 2.0 model: may answer "no answer"

    def __post_init__(self) -> None:
        # Checks the window settings now (ConfigError), not at the first request.
        qa_features([], self.tokenizer, max_seq_length=self.max_length,
                     doc_stride=self.doc_stride, max_query_length=self.max_query_length,
                     training=False)

    def parse(self, item: Mapping[str, Any]) -> QARequest:
        item = _fields(item, ("question", "context"))
        question, context = _text(item, "question"), _text(item, "context")
        example = QAExample(id="0", question=question, context=context, answers=[])
        return QARequest(question, context, qa_features(
            [example], self.tokenizer, max_seq_length=self.max_length,
            doc_stride=self.doc_stride, max_query_length=self.max_query_length, training=False))

    def cost(self, request: QARequest) -> int:
        return int(request.features.attention_mask.sum())

    def __call__(self, requests: Sequence[QARequest]) -> list[dict]:
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
            offsets=[o for f in parts for o in f.offsets],
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
        return [self._answer(preds.predictions[ex.id], preds.nbest[ex.id]) for ex in examples]

    def _answer(self, text: str, nbest: list[dict]) -> dict:
        best = next((e for e in nbest if e["text"] == text), nbest[0])
        result: dict[str, Any] = {"answer": text, "score": best["probability"],
                                  "start": best["start"] if text else None,
                                  "end": best["end"] if text else None}
        if self.version_2:
            result["no_answer"] = text == ""
        return result

    def describe(self) -> dict:
        return {**super().describe(), "doc_stride": self.doc_stride,
                "max_query_length": self.max_query_length, "version_2": self.version_2}

    def example(self) -> dict:
        return {"question": "Where is the Eiffel Tower?",
                "context": "The Eiffel Tower is a wrought-iron tower in Paris, France."}


# --- sequence classification ---------------------------------------------------------------------


@dataclass
class TextClassificationPipeline(Pipeline):
    """Sequence (pair) classification with the label names of config.json, or regression."""

    task: ClassVar[str] = "text-classification"
    labels: LabelMap | None = field(init=False, default=None)  # None: regression (one output)

    def __post_init__(self) -> None:
        regression = self.config.problem_type == "regression" or self.config.num_labels == 1
        self.labels = None if regression else _labels(self.config)

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        item = _fields(item, ("text", "text_pair"))
        text, pair = _text(item, "text"), _text(item, "text_pair", required=False)
        return TextRequest(text, *self.encode_text(text, pair))

    def __call__(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        logits = _logits(self.forward(self.pad([r.window for r in requests])).logits)  # (B, L)
        if self.labels is None:
            return [self.mark({"score": float(row[0])}, r) for r, row in zip(requests, logits)]
        results = []
        for r, probs in zip(requests, _softmax(logits)):
            top = int(probs.argmax())
            results.append(self.mark({
                "label": self.labels.name(top), "score": float(probs[top]),
                "scores": {name: float(p) for name, p in zip(self.labels.names, probs)}}, r))
        return results

    def describe(self) -> dict:
        return {**super().describe(), "labels": None if self.labels is None else
                list(self.labels.names), "regression": self.labels is None}

    def example(self) -> dict:
        return {"text": "A gripping, beautifully shot film."}


# --- token classification ------------------------------------------------------------------------


@dataclass
class TokenClassificationPipeline(Pipeline):
    """Word-level tags: a word is tagged on its first sub-token, as fine-tuning trains it.

    Words are the tokenizer's pre-tokenized words (whitespace and punctuation split); the result
    lists the words whose tag is not "O", with their character spans in the text.
    """

    task: ClassVar[str] = "token-classification"
    labels: LabelMap = field(init=False)

    def __post_init__(self) -> None:
        self.labels = _labels(self.config)

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        return self.parse_text(item)

    def __call__(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        logits = _logits(self.forward(self.pad([r.window for r in requests])).logits)
        results = []
        for r, row in zip(requests, logits):  # row: (S, num_labels)
            w = r.window
            words: dict[int, list[int]] = {}  # word index -> its token positions
            for t, word in enumerate(w.word_ids):
                if word is not None:
                    words.setdefault(word, []).append(t)
            entities = []
            for positions in words.values():
                first = positions[0]
                probs = _softmax(row[first])
                tag = self.labels.name(int(probs.argmax()))
                if tag == "O":
                    continue
                lo, hi = w.offsets[first][0], w.offsets[positions[-1]][1]
                entities.append({"word": r.text[lo:hi], "tag": tag, "start": lo,
                                 "end": hi, "score": float(probs.max())})
            results.append(self.mark({"entities": entities}, r))
        return results

    def describe(self) -> dict:
        return {**super().describe(), "labels": list(self.labels.names)}

    def example(self) -> dict:
        return {"text": "Marie Curie worked in Paris."}


# --- fill-mask -----------------------------------------------------------------------------------


@dataclass
class FillMaskPipeline(Pipeline):
    """The ``top_k`` most likely tokens at every mask of the text ([MASK] for BERT, <mask> for
    BART, whose decoder reads the text shifted right and so scores every position)."""

    task: ClassVar[str] = "fill-mask"
    options: ClassVar[tuple[str, ...]] = ("top_k",)
    top_k: int = 5

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= _MAX_TOP_K:
            raise ConfigError(f"top_k must be between 1 and {_MAX_TOP_K}, got {self.top_k}")

    @property
    def mask_token(self) -> str:
        return self.tokenizer.vocab[self.tokenizer.mask_id]

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        item = _fields(item, ("text", "top_k"))
        text = _text(item, "text")
        top_k = _number(item, "top_k", int, 1, _MAX_TOP_K) or self.top_k
        window, truncated = self.encode_text(text)
        if self.tokenizer.mask_id not in window.ids:
            where = "within the first max_length tokens" if truncated else "in it"
            raise InputError("text", f"has no {self.mask_token} {where}: mark each word to fill "
                             f"in with {self.mask_token}")
        return TextRequest(text, window, truncated, top_k)

    def __call__(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        logits = self.forward(self.pad([r.window for r in requests])).logits  # (B, S, V)
        tok = self.tokenizer
        dropped = {tok.cls_id, tok.sep_id, tok.pad_id}  # [CLS]/<s>, [SEP]/</s>, padding
        results = []
        for b, r in enumerate(requests):
            masks = []
            for pos in [t for t, i in enumerate(r.window.ids) if i == tok.mask_id]:
                probs = _softmax(_logits(logits[b, pos]))  # (V,)
                best = np.argsort(-probs, kind="stable")[:r.top_k].tolist()
                candidates = []
                for token_id in best:
                    ids = list(r.window.ids)
                    ids[pos] = token_id
                    sequence = tok.decode([i for i in ids if i not in dropped],
                                          skip_special_tokens=False).strip()
                    candidates.append({"token": self.spell(token_id),
                                       "score": float(probs[token_id]), "sequence": sequence})
                masks.append(candidates)
            results.append(self.mark({"masks": masks}, r))
        return results

    def spell(self, token_id: int) -> str:
        """A token as text: the WordPiece entry, or the decoded byte-level piece."""
        if isinstance(self.tokenizer, BertTokenizer):
            return self.tokenizer.vocab[token_id]
        return self.tokenizer.decode([token_id]).strip()

    def describe(self) -> dict:
        return {**super().describe(), "mask_token": self.mask_token, "top_k": self.top_k}

    def example(self) -> dict:
        return {"text": f"The capital of France is {self.mask_token}.", "top_k": self.top_k}


# --- summarization -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryRequest:
    ids: np.ndarray       # (S,) encoded article, <s> ... </s>
    settings: Any         # GenerationConfig: the model's, with this request's overrides
    truncated: bool


_GENERATION_FIELDS = {"num_beams": (int, 1), "max_length": (int, 1), "min_length": (int, 0),
                      "length_penalty": (float, None), "no_repeat_ngram_size": (int, 0)}


@dataclass
class SummarizationPipeline(Pipeline):
    """Abstractive summaries by BART with the model's generation_config.json and per-request
    overrides. Requests with the same settings share a batch."""

    task: ClassVar[str] = "summarization"
    default_truncation: ClassVar[str] = "truncate"

    def parse(self, item: Mapping[str, Any]) -> SummaryRequest:
        from bertforge.inference.generate import generation_settings

        item = _fields(item, ("text", *_GENERATION_FIELDS))
        text = _text(item, "text")
        overrides = {name: value for name, (kind, low) in _GENERATION_FIELDS.items()
                     if (value := _number(item, name, kind, low)) is not None}
        try:
            settings = generation_settings(self.model, overrides, source=str(self.model_dir))
        except ConfigError as exc:
            message = str(exc)
            named = next((k for k in overrides if f"setting {k}=" in message), "max_length")
            raise InputError(named, message) from None
        n = len(self.tokenizer.encode(text))
        if n > self.max_length and self.truncation == "error":
            raise InputError("text", f"{n} tokens long, over this model's limit of "
                             f"{self.max_length}; shorten it, or use truncation=truncate")
        ids = np.asarray(self.tokenizer.encode_truncated([text], self.max_length)[0], np.int64)
        return SummaryRequest(ids, settings, n > self.max_length)

    def cost(self, request: SummaryRequest) -> int:
        return len(request.ids) * request.settings.num_beams  # beams repeat the encoder rows

    def __call__(self, requests: Sequence[SummaryRequest]) -> list[dict]:
        from bertforge.inference.generate import generate_texts

        groups: dict[Any, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.settings, []).append(i)
        summaries: list[str] = [""] * len(requests)
        for settings, members in groups.items():
            texts = generate_texts(self.model, self.tokenizer, [requests[i].ids for i in members],
                                   settings, batch_size=len(members), device=self.device,
                                   autocast=self.precision.autocast)
            for i, text in zip(members, texts):
                summaries[i] = text
        return [self.mark({"summary": s}, r) for s, r in zip(summaries, requests)]

    def example(self) -> dict:
        return {"text": "The city council met on Monday and approved the new budget, which "
                        "raises spending on schools and parks.", "num_beams": 4}


# --- feature extraction --------------------------------------------------------------------------


@dataclass
class FeatureExtractionPipeline(Pipeline):
    """One vector per text from the encoder's last hidden states: their mean over the real
    tokens (``pooling="mean"``, as sentence-transformers) or the first token's ([CLS]/<s>)."""

    task: ClassVar[str] = "feature-extraction"
    options: ClassVar[tuple[str, ...]] = ("pooling", "normalize")
    pooling: str = "mean"
    normalize: bool = False  # scale every vector to unit length (cosine similarity = dot)

    def __post_init__(self) -> None:
        if self.pooling not in ("mean", "cls"):
            raise ConfigError(f"pooling must be mean or cls, got {self.pooling!r}")

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        return self.parse_text(item)

    def __call__(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        inputs = self.pad([r.window for r in requests])
        out = self.forward(inputs)
        hidden = _logits(out if torch.is_tensor(out) or isinstance(out, np.ndarray)
                         else out.last_hidden_state)  # (B, S, H)
        if self.pooling == "cls":
            vectors = hidden[:, 0]
        else:
            mask = inputs["attention_mask"].cpu().numpy()[..., None].astype(np.float32)
            vectors = (hidden * mask).sum(1) / mask.sum(1)  # (B, H)
        if self.normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return [self.mark({"embedding": v.tolist(), "pooling": self.pooling}, r)
                for v, r in zip(vectors, requests)]

    def describe(self) -> dict:
        return {**super().describe(), "pooling": self.pooling, "normalize": self.normalize,
                "dimensions": self.config.hidden_size}

    def example(self) -> dict:
        return {"text": "A sentence to embed."}


PIPELINES: dict[str, type[Pipeline]] = {cls.task: cls for cls in (
    QuestionAnsweringPipeline, TextClassificationPipeline, TokenClassificationPipeline,
    FillMaskPipeline, SummarizationPipeline, FeatureExtractionPipeline)}


# --- loading -------------------------------------------------------------------------------------

# Architectures (config.json) each task's head can be read from; feature extraction reads any.
_FITS = {
    "question-answering": ("BertForQuestionAnswering",),
    "text-classification": ("BertForSequenceClassification",),
    "token-classification": ("BertForTokenClassification",),
    "fill-mask": ("BertForMaskedLM", "BertForPreTraining", "BartForConditionalGeneration"),
    "summarization": ("BartForConditionalGeneration",),
}
_BY_ARCHITECTURE = {
    "BertForQuestionAnswering": "question-answering",
    "BertForSequenceClassification": "text-classification",
    "BertForTokenClassification": "token-classification",
    "BertForMaskedLM": "fill-mask", "BertForPreTraining": "fill-mask",
    "BertModel": "feature-extraction", "BartModel": "feature-extraction",
    "BartForConditionalGeneration": "summarization",
}


def infer_task(config: Any, source: str) -> str:
    """The task a model was fine-tuned (or pretrained) for, from config.json's
    ``finetuning_task``, else its ``architectures``; ``ConfigError`` when neither tells."""
    tuned = config.finetuning_task or ""
    if tuned in ("squad", "squad_v2"):
        return "question-answering"
    if tuned.startswith("glue/") or tuned == "classification":
        return "text-classification"
    if tuned in ("token-classification", "summarization"):
        return tuned
    for name in config.architectures or ():
        if name in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[name]
    raise ConfigError(f"{source}/config.json does not say which task the model does "
                      f"(finetuning_task={config.finetuning_task!r}, architectures="
                      f"{config.architectures}); pass the task: {', '.join(TASKS)}")


def _check_fit(task: str, config: Any, source: str) -> None:
    """``ConfigError`` unless ``task`` is known and config.json's architectures can do it."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    wanted = _FITS.get(task)
    if wanted is None or not config.architectures:
        return  # feature extraction fits all; without architectures the weights decide
    if not set(config.architectures) & set(wanted):
        raise ConfigError(f"{source} is a {'/'.join(config.architectures)} model; task {task} "
                          f"needs a {' or '.join(wanted)} model")


def _model_class(task: str, is_bart: bool) -> tuple[type, str | None]:
    """The model class of a task and the weight prefix of the head it must find in the files."""
    from bertforge.models import (BartForConditionalGeneration, BartModel, BertForMaskedLM,
                                  BertForQuestionAnswering, BertForSequenceClassification,
                                  BertForTokenClassification, BertModel)

    if is_bart:
        if task in ("summarization", "fill-mask"):
            return BartForConditionalGeneration, None
        if task == "feature-extraction":
            return BartModel, None
        raise ConfigError(f"task {task} needs a BERT model; BART models do summarization, "
                          "fill-mask and feature-extraction")
    if task == "summarization":
        raise ConfigError("task summarization needs a BART model (an encoder-decoder)")
    return {"question-answering": (BertForQuestionAnswering, "qa_outputs."),
            "text-classification": (BertForSequenceClassification, "classifier."),
            "token-classification": (BertForTokenClassification, "classifier."),
            "fill-mask": (BertForMaskedLM, "cls.predictions."),
            "feature-extraction": (BertModel, None)}[task]


def _load_model(task: str, model_dir: Path, is_bart: bool, device: torch.device) -> Any:
    """The task's model with the directory's weights, on ``device``, in eval mode; a head the
    files lack is a ``ConfigError`` (it would answer at random), not a fresh initialisation."""
    from bertforge.models.hub import read_weights

    cls, head = _model_class(task, is_bart)
    config = cls.config_class.load(model_dir)
    # Feature extraction never uses BERT's pooler, so it is not built (nor reported missing).
    model = cls(config, add_pooling_layer=False) if cls.__name__ == "BertModel" else cls(config)
    weights, source = read_weights(model_dir)
    report = model.load_hf_state_dict(weights, source=source)
    if head and any(k.startswith(head) for k in report.initialized):
        raise ConfigError(f"{source} has no {head.rstrip('.')} weights, the head task {task} "
                          "needs; give a model fine-tuned (or pretrained) for it")
    model.load_extras(model_dir)
    return (model.encoder if task == "feature-extraction" and is_bart else model).to(device).eval()


def _run_settings(model_dir: Path) -> dict[str, Any]:
    """QA window and n-best settings of the run that wrote ``model_dir`` (its config.yaml)."""
    path = model_dir / "config.yaml"
    if not path.is_file():
        return {}
    from bertforge.config import FinetuneConfig, load_config

    cfg = load_config(FinetuneConfig, path)
    if cfg.task != "squad":
        return {}
    return {"max_length": cfg.max_seq_length, "doc_stride": cfg.data.doc_stride,
            "max_query_length": cfg.data.max_query_length, "n_best_size": cfg.eval.n_best_size,
            "max_answer_length": cfg.eval.max_answer_length,
            "null_score_diff_threshold": cfg.eval.null_score_diff_threshold}


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name} was asked for but no CUDA GPU is available; use cpu")
    return device


def load_pipeline(model_dir: str | Path, task: str | None = None, *, device: str = "auto",
                  precision: str = "auto", max_length: int | None = None,
                  truncation: str | None = None, backend: Any = None,
                  **options: Any) -> Pipeline:
    """The pipeline of ``model_dir`` for ``task`` (None: the task the model was fine-tuned for).

    ``max_length``: tokens per input (default: the run's data.max_seq_length for QA, else the
    model's positions within the tokenizer's limit). ``truncation``: "error" or "truncate"
    (default: "truncate" for summarization, else "error"; QA windows instead). ``backend``: a
    callable with the PyTorch model's call signature and outputs (e.g. onnxruntime-backed) used
    instead of the PyTorch model. ``options``: the task's own (QA: doc_stride, max_query_length,
    n_best_size, max_answer_length, null_score_diff_threshold, max_windows; fill-mask: top_k;
    feature-extraction: pooling, normalize). User mistakes raise ``ConfigError``.
    """
    from bertforge.models.auto import is_seq2seq, load_config

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"model {model_dir} is not a model directory (no config.json)")
    config = load_config(model_dir)
    if task is None:
        task = infer_task(config, str(model_dir))
    _check_fit(task, config, str(model_dir))
    cls = PIPELINES[task]
    unknown = sorted(set(options) - set(cls.options))
    if unknown:
        allowed = ", ".join(cls.options) or "none"
        raise ConfigError(f"option {unknown[0]} does not apply to {task} (its options: {allowed})")
    truncation = truncation or cls.default_truncation
    if truncation not in TRUNCATION:
        raise ConfigError(f"truncation must be error or truncate, got {truncation!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    try:
        tokenizer = load_tokenizer(model_dir)
    except DataError as exc:
        raise ConfigError(f"model {model_dir}: {exc}") from None
    positions = config.max_position_embeddings
    settings = _run_settings(model_dir) if task == "question-answering" else {}
    run_length = settings.pop("max_length", None)
    limit = max_length or run_length or (
        384 if task == "question-answering" else tokenizer.model_max_length)
    if max_length is not None and not 3 <= max_length <= positions:
        raise ConfigError(f"max_length={max_length} must be between 3 and the model's "
                          f"{positions} positions")
    target = _device(device)
    model = backend if backend is not None else _load_model(task, model_dir, is_seq2seq(config),
                                                            target)
    extra: dict[str, Any] = {**settings, **options}
    if task == "question-answering":
        extra["version_2"] = config.finetuning_task == "squad_v2"
    return cls(model=model, tokenizer=tokenizer, model_dir=model_dir, config=config,
               device=target, precision=build_precision(precision, target),
               max_length=min(limit, positions), truncation=truncation,
               backend="pytorch" if backend is None else type(backend).__name__, **extra)
