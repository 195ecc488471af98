"""Encoder tasks: sequence and token classification, fill-mask, feature extraction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from bertforge.data.finetuning.labels import LabelMap
from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import (InputError, Pipeline, TextRequest, _MAX_TOP_K,
                                                _fields, _labels, _logits, _number, _softmax, _text)
from bertforge.tokenization import BertTokenizer

# --- sequence classification ---------------------------------------------------------------------


@dataclass
class TextClassificationPipeline(Pipeline):
    """Sequence (pair) classification with the label names of config.json, or regression."""

    fields: ClassVar[tuple[str, ...]] = ("text", "text_pair")
    labels: LabelMap | None = field(init=False, default=None)  # None: regression (one output)

    def __post_init__(self) -> None:
        regression = self.config.problem_type == "regression" or self.config.num_labels == 1
        self.labels = None if regression else _labels(self.config)

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        item = _fields(item, self.fields)
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

    def format_line(self, result: dict) -> str:
        return (f"{result['label']}  {result['score']:.4f}" if "label" in result
                else f"score {result['score']:.4f}")


# --- token classification ------------------------------------------------------------------------


@dataclass
class TokenClassificationPipeline(Pipeline):
    """Word-level tags: a word is tagged on its first sub-token, as fine-tuning trains it.

    Words are the tokenizer's pre-tokenized words (whitespace and punctuation split); the result
    lists the words whose tag is not "O", with their character spans in the text.
    """

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

    def format_line(self, result: dict) -> str:
        return " ".join(f"{e['word']}/{e['tag']}" for e in result["entities"]) or "(no entities)"


# --- fill-mask -----------------------------------------------------------------------------------


@dataclass
class FillMaskPipeline(Pipeline):
    """The ``top_k`` most likely tokens at every mask of the text ([MASK] for BERT, <mask> for
    BART, whose decoder reads the text shifted right and so scores every position)."""

    fields: ClassVar[tuple[str, ...]] = ("text", "top_k")
    options: ClassVar[tuple[str, ...]] = ("top_k",)
    top_k: int = 5

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= _MAX_TOP_K:
            raise ConfigError(f"top_k must be between 1 and {_MAX_TOP_K}, got {self.top_k}")

    @property
    def mask_token(self) -> str:
        return self.tokenizer.vocab[self.tokenizer.mask_id]

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        item = _fields(item, self.fields)
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

    def format_line(self, result: dict) -> str:
        return "\n".join("  ".join(f"{c['token']} {c['score']:.4f}" for c in candidates)
                         for candidates in result["masks"])


# --- feature extraction --------------------------------------------------------------------------


@dataclass
class FeatureExtractionPipeline(Pipeline):
    """One vector per text from the encoder's last hidden states: their mean over the real
    tokens (``pooling="mean"``, as sentence-transformers) or the first token's ([CLS]/<s>)."""

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

    def format_line(self, result: dict) -> str:
        vector = result["embedding"]
        shown = ", ".join(f"{x:.4f}" for x in vector[:6])
        return f"[{shown}, ...] ({len(vector)} dimensions, {result['pooling']} pooling)"


