"""Encoder tasks: sequence and token classification, reranking (text pairs scored by a
cross-encoder), fill-mask. Feature extraction (embeddings) is ``features.py``'s."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from bertforge.data.finetuning.labels import LabelMap
from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import (InputError, Pipeline, TextRequest, _MAX_TOP_K,
                                                _fields, _flag, _labels, _logits, _number,
                                                _softmax, _text)
from bertforge.inference.pipelines.chunking import (DEFAULT_MAX_WINDOWS, check_chunking,
                                                    chunk_description, chunk_windows, per_input,
                                                    run_windows)
from bertforge.tokenization import BertTokenizer, Window

# --- per-item options --------------------------------------------------------------------------


@contextmanager
def _truncation_for(pipeline: Any, truncate: bool | None) -> Iterator[None]:
    """``pipeline`` cutting long inputs (``truncate=True``) or not cutting them (False: refused,
    or still split into windows by a pipeline that chunks) for the body of the ``with``; None
    leaves its setting. Pipelines run on one thread (the server's worker), so a request's own
    choice can be set around its parse and put back."""
    if truncate is None or not hasattr(pipeline, "truncation"):
        yield
        return
    saved = pipeline.truncation
    pipeline.truncation = "truncate" if truncate else "chunk" if saved == "chunk" else "error"
    try:
        yield
    finally:
        pipeline.truncation = saved


def encode_item(pipeline: Pipeline, text: str, pair: str | None,
                truncate: bool | None) -> tuple[Any, bool]:
    """``pipeline.encode_text`` under the item's own ``truncate`` (None: the pipeline's
    truncation); an item over the length is an ``InputError`` that says how to ask for a cut."""
    with _truncation_for(pipeline, truncate):
        return pipeline.encode_text(text, pair)


def encode_chunked(pipeline: Pipeline, text: str, pair: str | None, truncate: bool | None,
                   prefix: int = 0) -> tuple[Window, bool, tuple[Window, ...]]:
    """``encode_item``'s window and cut, and the windows of a text over the length under
    ``truncation="chunk"`` (``chunking``; the first is the window): ``TextRequest``'s
    ``window``, ``truncated`` and ``windows``. ``prefix``: characters at the start of ``text``
    (a prompt) that every window repeats."""
    with _truncation_for(pipeline, truncate):
        window, over = pipeline.encode_text(text, pair)
        if over and pipeline.truncation == "chunk":
            windows = chunk_windows(pipeline, text, pair, prefix)
            return windows[0], False, windows
    return window, over, ()


def parse_single(pipeline: Pipeline, item: Mapping[str, Any]) -> TextRequest:
    """An item of one ``text`` and its own ``truncate``, encoded (tagging, fill-mask)."""
    item = _fields(item, pipeline.fields)
    text = _text(item, "text")
    return TextRequest(text, *encode_item(pipeline, text, None, _flag(item, "truncate")))


# --- sequence classification ---------------------------------------------------------------------


@dataclass
class TextClassificationPipeline(Pipeline):
    """Sequence (pair) classification with the label names of config.json, or regression. An
    item may ask for its own ``truncate`` (cut to ``max_length`` instead of an error).

    Under ``truncation="chunk"`` a long ``text`` is split into windows of ``chunk_overlap``
    shared tokens (``chunking``; a ``text_pair`` is kept whole in each window), and its logits
    are the mean (``chunk_pool="mean"``) or the maximum (``"max"``) of its windows' logits,
    then turned into scores as a text that fits; its result says ``"chunks": N``."""

    fields: ClassVar[tuple[str, ...]] = ("text", "text_pair", "truncate")
    options: ClassVar[tuple[str, ...]] = ("chunk_overlap", "chunk_pool", "max_windows")
    chunks: ClassVar[bool] = True
    chunk_overlap: int | None = None  # tokens neighbouring windows share; None: room // 4
    chunk_pool: str = "mean"
    max_windows: int = DEFAULT_MAX_WINDOWS  # windows per forward pass (at least the texts')
    labels: LabelMap | None = field(init=False, default=None)  # None: regression (one output)

    def __post_init__(self) -> None:
        check_chunking(self)
        regression = self.config.problem_type == "regression" or self.config.num_labels == 1
        self.labels = None if regression else _labels(self.config)

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        item = _fields(item, self.fields)
        text, pair = _text(item, "text"), _text(item, "text_pair", required=False)
        window, cut, windows = encode_chunked(self, text, pair, _flag(item, "truncate"))
        return TextRequest(text, window, cut, windows=windows)

    def logits(self, requests: Sequence[TextRequest]) -> np.ndarray:
        """(B, num_labels) float32 logits of ``requests``: of their windows, run in padded
        batches (one for texts that fit), pooled by ``chunk_pool`` per chunked text."""
        parts, counts = run_windows(self, requests, lambda windows: _logits(
            self.forward(self.pad(windows)).logits))  # each (windows, num_labels)
        return np.stack(per_input(np.concatenate(parts), counts, self.chunk_pool))

    def run(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        logits = self.logits(requests)  # (B, L)
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
                list(self.labels.names), "regression": self.labels is None,
                **chunk_description(self)}

    def example(self) -> dict:
        return {"text": "A gripping, beautifully shot film."}

    def format_line(self, result: dict) -> str:
        return (f"{result['label']}  {result['score']:.4f}" if "label" in result
                else f"score {result['score']:.4f}")


@dataclass
class TextRankingPipeline(TextClassificationPipeline):
    """A reranker (cross-encoder): how relevant a passage (``text_pair``) is to a query
    (``text``), from the model's one output for the pair: ``{"score": sigmoid(logit),
    "logit": logit}``, what sentence-transformers' ``CrossEncoder.predict`` gives a one-label
    model (its default activation). ``text`` alone may hold ``query<TAB>passage`` (a line of
    ``bertforge predict rerank``'s input). An item may ask for its own ``truncate``.
    ``truncation="chunk"`` does not apply: it is the passage that runs long, and scoring its
    windows against the query (their maximum, say) is another model of relevance."""

    options: ClassVar[tuple[str, ...]] = ()
    chunks: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.config.num_labels != 1:
            raise ConfigError(f"{self.model_dir}/config.json has num_labels="
                              f"{self.config.num_labels}; a text-ranking model (a reranker) "
                              "has one output, the pair's relevance: load it as "
                              "text-classification")
        self.labels = None

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        item = _fields(item, self.fields)
        query, passage = _text(item, "text"), _text(item, "text_pair", required=False)
        if passage is None:
            query, tab, passage = query.partition("\t")
            if not (tab and query.strip() and passage.strip()):
                raise InputError("text_pair", "is required: the passage to score against "
                                 "{text}, the query (or send {text} as query<TAB>passage)",
                                 refers=("text",))
        return TextRequest(query, *encode_item(self, query, passage, _flag(item, "truncate")))

    def run(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        logits = self.logits(requests)[:, 0].astype(np.float64)  # (B,)
        scores = 1.0 / (1.0 + np.exp(-logits))
        return [self.mark({"score": float(s), "logit": float(x)}, r)
                for r, s, x in zip(requests, scores, logits)]

    def describe(self) -> dict:
        described = {**super().describe(), "scoring": "sigmoid of the logit for (text, "
                     "text_pair)"}
        for key in ("labels", "regression"):
            described.pop(key, None)
        return described

    def example(self) -> dict:
        return {"text": "how tall is the eiffel tower",
                "text_pair": "The Eiffel Tower is 330 metres tall."}

    def format_line(self, result: dict) -> str:
        return f"score {result['score']:.4f}  (logit {result['logit']:.4f})"


# --- token classification ------------------------------------------------------------------------


@dataclass
class TokenClassificationPipeline(Pipeline):
    """Word-level tags: a word is tagged on its first sub-token, as fine-tuning trains it.

    Words are the tokenizer's pre-tokenized words (whitespace and punctuation split) as its
    word ids say; the result lists the words whose tag is not "O", with their character spans
    in the text. An item may ask for its own ``truncate``.
    """

    fields: ClassVar[tuple[str, ...]] = ("text", "truncate")
    labels: LabelMap = field(init=False)

    def __post_init__(self) -> None:
        self.labels = _labels(self.config)

    def parse(self, item: Mapping[str, Any]) -> TextRequest:
        return parse_single(self, item)

    def run(self, requests: Sequence[TextRequest]) -> list[dict]:
        if not requests:
            return []
        logits = _logits(self.forward(self.pad([r.window for r in requests])).logits)
        results = []
        for r, row in zip(requests, logits):  # row: (S, num_labels)
            w = r.window
            entities = []
            for first, last in w.word_spans(r.text).values():
                probs = _softmax(row[first])
                tag = self.labels.name(int(probs.argmax()))
                if tag == "O":
                    continue
                lo, hi = w.offsets[first][0], w.offsets[last][1]
                # Byte-level BPE counts the space before a word with it ("Ġword").
                lo += len(r.text[lo:hi]) - len(r.text[lo:hi].lstrip())
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

    fields: ClassVar[tuple[str, ...]] = ("text", "top_k", "truncate")
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
        top_k = _number(item, "top_k", int, 1, _MAX_TOP_K) or self.top_k
        parsed = parse_single(self, item)
        text, window, truncated = parsed.text, parsed.window, parsed.truncated
        if self.tokenizer.mask_id not in window.ids:
            where = (f"within its first {self.max_length} tokens, the model's limit"
                     if truncated else "in it")
            raise InputError("text", f"has no {self.mask_token} {where}: mark each word to fill "
                             f"in with {self.mask_token}")
        return TextRequest(text, window, truncated, top_k)

    def run(self, requests: Sequence[TextRequest]) -> list[dict]:
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
