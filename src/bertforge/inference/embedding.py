"""A model directory as the callables ``bertforge.retrieval`` evaluates and mines with:
``DirectoryEncoder`` (texts -> vectors, queries and documents with their saved prompts) and
``PairScorer`` (a cross-encoder's logit per (query, passage) pair).

Both run through the inference pipelines (``load_pipeline``), so a directory is read exactly as
``bertforge predict`` and ``bertforge serve`` read it: saved pooling, normalization, prompts and
``max_seq_length``; long texts are cut to that length, as sentence-transformers cuts them. Texts
are batched longest first (by tokens), so a batch holds texts of similar lengths and pads
little; results come back in the callers' order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bertforge.core.jsonfile import read_json
from bertforge.core.progress import progress_bar
from bertforge.errors import ConfigError, DataError
from bertforge.inference.pipelines import (
    InputError,
    Pipeline,
    TextRequest,
    load_pipeline,
)
from bertforge.inference.pipelines.base import check_unicode

DOCUMENT_PROMPTS = ("document", "passage", "corpus")
"""The prompt names a document gets, first found (sentence-transformers' ``encode_document``
order); a query gets the "query" prompt."""
SIMILARITY_NAMES = {"cosine": "cosine", "cos_sim": "cosine", "dot": "dot",
                    "dot_product": "dot", "dot_score": "dot"}


def _requests(pipe: Pipeline, texts: Sequence[str], pairs: Sequence[str] | None,
              prefix: str) -> list[TextRequest]:
    """Each text (``prefix`` before it; with its pair) encoded and cut to the pipeline's
    length. Empty texts are encoded too (sentence-transformers embeds them); a text that is not
    valid UTF-8 is a ``DataError`` naming its position."""
    requests = []
    for i, text in enumerate(texts):
        pair = pairs[i] if pairs is not None else None
        try:
            check_unicode(text, "text")
            if pair is not None:
                check_unicode(pair, "text_pair")
        except InputError as exc:
            raise DataError(f"text {i} of a batch to embed: {exc.message}") from None
        window, cut = pipe.encode_text(prefix + text, pair)
        requests.append(TextRequest(text, window, cut))
    return requests


def _longest_first(requests: Sequence[TextRequest], batch_size: int, what: str) -> Any:
    """Batches of request indices, longest (in tokens) first, behind a progress bar (drawn on
    a terminal only) that counts ``what``."""
    lengths = np.array([len(r.window.ids) for r in requests])
    order = np.argsort(-lengths, kind="stable")
    batches = [order[lo:lo + batch_size] for lo in range(0, len(order), batch_size)]
    return progress_bar(iterable=batches, desc=what, unit="batch", leave=False,
                        disable=len(batches) < 2)


def _pipeline(directory: str | os.PathLike[str], task: str, device: str, batch_size: int,
              precision: str) -> Any:
    """The inference pipeline of ``task`` over ``directory``, long inputs cut."""
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    return load_pipeline(directory, task, device=device, precision=precision,
                         truncation="truncate")


def read_similarity(directory: str | os.PathLike[str]) -> str:
    """"cosine" or "dot": the similarity a sentence-transformers directory was trained for
    (``config_sentence_transformers.json``'s ``similarity_fn_name``; cosine without it, as
    sentence-transformers defaults). ``ConfigError`` for one bertforge does not rank by."""
    path = os.path.join(directory, "config_sentence_transformers.json")
    if not os.path.isfile(path):
        return "cosine"
    config = read_json(path, error=ConfigError)
    name = config.get("similarity_fn_name") if isinstance(config, dict) else None
    if name is None:
        return "cosine"
    if name not in SIMILARITY_NAMES:
        raise ConfigError(f"{path}: similarity_fn_name {name!r} is not one bertforge ranks by "
                          "(cosine or dot); set it to cosine or dot")
    return SIMILARITY_NAMES[name]


class DirectoryEncoder:
    """The embedding model of a directory (any BERT-family encoder; a sentence-transformers
    directory's pooling, normalization and prompts are its own) as embedding callables:
    :meth:`embed`, :meth:`embed_queries` and :meth:`embed_documents`, each texts -> float32
    (N, D). ``similarity`` is what the model was trained for ("cosine" or "dot")."""

    def __init__(self, directory: str | os.PathLike[str], *, device: str = "auto",
                 batch_size: int = 32, precision: str = "auto") -> None:
        self.pipeline = _pipeline(directory, "feature-extraction", device, batch_size, precision)
        self.batch_size = batch_size
        self.similarity = read_similarity(self.pipeline.model_dir)
        prompts = self.pipeline.prompts
        default = self.pipeline.prompt(None)  # the saved default prompt, usually ""
        self.query_prompt = prompts.get("query", default)
        self.document_prompt = next((prompts[n] for n in DOCUMENT_PROMPTS if n in prompts),
                                    default)

    @property
    def device(self) -> Any:
        return self.pipeline.device

    def embed(self, texts: Sequence[str], prompt: str | None = None) -> np.ndarray:
        """(len(texts), D) float32 vectors, ``prompt`` (None: the saved default prompt) put
        before each text."""
        pipe = self.pipeline
        prefix = pipe.prompt(None) if prompt is None else prompt
        requests = _requests(pipe, texts, None, prefix)
        out = np.zeros((len(texts), pipe.config.hidden_size), dtype=np.float32)
        for batch in _longest_first(requests, self.batch_size, "embedding"):
            out[batch] = torch.stack(pipe.vectors([requests[i] for i in batch])).numpy()
        return out

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of queries (or anchors), with the "query" prompt when the model has one."""
        return self.embed(texts, self.query_prompt)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of documents (passages), with the "document" (or "passage", "corpus")
        prompt when the model has one."""
        return self.embed(texts, self.document_prompt)


class PairScorer:
    """A reranker (cross-encoder) directory as a pair-scoring callable: (query, passage) pairs
    -> float32 (N,) raw logits of its one output (higher: more relevant). The directory must be
    a sequence classifier with one label (task text-ranking, or any 1-label regressor)."""

    def __init__(self, directory: str | os.PathLike[str], *, device: str = "auto",
                 batch_size: int = 32, precision: str = "auto") -> None:
        self.pipeline = _pipeline(directory, "text-ranking", device, batch_size, precision)
        self.batch_size = batch_size

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        pipe = self.pipeline
        requests = _requests(pipe, [q for q, _ in pairs], [p for _, p in pairs], "")
        out = np.zeros(len(pairs), dtype=np.float32)
        for batch in _longest_first(requests, self.batch_size, "reranking"):
            out[batch] = pipe.logits([requests[i] for i in batch])[:, 0]
        return out


__all__ = ["DOCUMENT_PROMPTS", "DirectoryEncoder", "PairScorer", "read_similarity"]
