"""Feature extraction: one vector per text, as sentence-transformers computes it from a model
directory's saved pooling, normalization, prompts and Matryoshka sizes
(``bertforge.export.sentence_transformers`` reads and writes them)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from bertforge.core.kinds import json_kind
from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import (InputError, Pipeline, TextRequest, _fields,
                                                _flag, _logits, _text)
from bertforge.inference.pipelines.chunking import (DEFAULT_MAX_WINDOWS, check_chunking,
                                                    chunk_description, per_input, run_windows)
from bertforge.inference.pipelines.encoders import encode_chunked
from bertforge.tokenization import Window
from bertforge.ops.pooling import POOLINGS, finish, pool


def check_dimensions(value: Any, hidden: int, matryoshka: Sequence[int] | None) -> int | None:
    """The vector size an item asks for: None for the whole ``hidden`` size; with Matryoshka
    sizes saved (the model was trained to be cut), any size from 1 to ``hidden``, else only
    ``hidden`` itself. ``InputError`` on ``dimensions`` otherwise (the server's rule too)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InputError("dimensions", f"must be a whole number, got {json_kind(value)}")
    value = int(value)
    if matryoshka is None and value != hidden:
        raise InputError("dimensions", f"must be this model's {hidden} (its vectors are not "
                         "shortened: it was trained without Matryoshka sizes), got "
                         f"{value}; leave it out")
    if not 1 <= value <= hidden:
        raise InputError("dimensions", f"must be from 1 to this model's {hidden} (it was "
                         f"trained to be cut to {', '.join(map(str, matryoshka or ()))}), got "
                         f"{value}")
    return None if value == hidden else value


@dataclass(frozen=True)
class EmbedRequest(TextRequest):
    """A text to embed (its saved prompt put before it), with the item's own ``normalize``
    (None: the pipeline's) and vector size (None: the hidden size)."""

    normalize: bool | None = None
    dimensions: int | None = None


@dataclass
class FeatureExtractionPipeline(Pipeline):
    """One vector per text from the encoder's last hidden states (``bertforge.ops.pooling``):
    their mean over the real tokens (``pooling="mean"``, as sentence-transformers), the first
    token's ([CLS]/<s>, ``"cls"``) or the last real token's (``"last"``).

    ``pooling`` and ``normalize`` default to what the model directory was saved with for
    sentence-transformers (``modules.json``, ``1_Pooling/config.json``, a Normalize module;
    ``bertforge export sentence-transformers`` writes them), else mean pooling, unnormalized.
    The directory's ``config_sentence_transformers.json`` gives its named prompts and its
    Matryoshka sizes. An item may ask for its own ``normalize``, ``truncate`` (cut to
    ``max_length`` instead of an error), ``prompt_name`` (a saved prompt put before the text,
    its tokens counted in ``max_length``; absent: the saved default prompt, usually none) and
    ``dimensions`` (a Matryoshka model's vectors cut to that size, then normalized).

    Under ``truncation="chunk"`` a long text is split into windows of ``chunk_overlap`` shared
    tokens (``chunking``), each starting with the text's prompt, if any. Each window is pooled
    as a text that fits; the text's vector is the plain mean of its windows' pooled vectors
    (every window is full, so this is also their mean weighted by real tokens), then cut to
    ``dimensions`` and normalized as any vector; its result says ``"chunks": N``."""

    fields: ClassVar[tuple[str, ...]] = ("text", "normalize", "truncate", "prompt_name",
                                         "dimensions")
    options: ClassVar[tuple[str, ...]] = ("pooling", "normalize", "chunk_overlap", "max_windows")
    chunks: ClassVar[bool] = True
    pooling: str | None = None  # None: the directory's saved pooling, else "mean"
    normalize: bool | None = None  # unit-length vectors (cosine similarity = dot); None: saved
    prompts: dict[str, str] = field(init=False, default_factory=dict)
    default_prompt_name: str | None = field(init=False, default=None)
    matryoshka_dims: list[int] | None = field(init=False, default=None)
    chunk_overlap: int | None = None  # tokens neighbouring windows share; None: room // 4
    max_windows: int = DEFAULT_MAX_WINDOWS  # windows per forward pass (at least the texts')

    def __post_init__(self) -> None:
        import bertforge.export.sentence_transformers as st

        check_chunking(self)
        saved = st.read_pooling(self.model_dir)
        where = ""
        if self.pooling is None:
            self.pooling = saved.pooling if saved is not None else "mean"
            where = (f" (from {saved.source}; pass pooling=, or serve with --no-embeddings)"
                     if saved is not None else "")
        if self.normalize is None:
            self.normalize = bool(saved is not None and saved.normalize)
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling must be {' or '.join(POOLINGS)}, got {self.pooling!r}"
                              f"{where}")
        self.prompts = st.read_prompts(self.model_dir)
        self.default_prompt_name = st.read_default_prompt_name(self.model_dir)
        self.matryoshka_dims = st.read_matryoshka_dims(self.model_dir)
        hidden = self.config.hidden_size
        if self.matryoshka_dims is not None and max(self.matryoshka_dims) > hidden:
            raise ConfigError(f"{self.model_dir / st.ST_CONFIG}: {st.MATRYOSHKA_KEY} "
                              f"{self.matryoshka_dims} go past the model's hidden size "
                              f"{hidden}; keep sizes from 1 to {hidden}")

    def prompt(self, name: Any) -> str:
        """The text of saved prompt ``name`` (None: the default prompt's, else none)."""
        if name is None:
            return self.prompts.get(self.default_prompt_name or "", "")
        if not isinstance(name, str):
            raise InputError("prompt_name", f"must be a string, got {json_kind(name)}")
        if name not in self.prompts:
            saved = (f"its prompts: {', '.join(self.prompts)}" if self.prompts else
                     "it has none (config_sentence_transformers.json lists no prompts)")
            raise InputError("prompt_name", f"{name!r} is not a prompt of this model; "
                             f"{saved}")
        return self.prompts[name]

    def parse(self, item: Mapping[str, Any]) -> EmbedRequest:
        item = _fields(item, self.fields)
        text = _text(item, "text")
        # The prompt is part of the input, as sentence-transformers prepends it: it takes
        # tokens of max_length and is pooled with the text.
        prompt = self.prompt(item.get("prompt_name"))
        dims = check_dimensions(item.get("dimensions"), self.config.hidden_size,
                                self.matryoshka_dims)
        window, cut, windows = encode_chunked(self, prompt + text, None, _flag(item, "truncate"),
                                              prefix=len(prompt))
        return EmbedRequest(text, window, cut, windows=windows,
                            normalize=_flag(item, "normalize"), dimensions=dims)

    def vectors(self, requests: Sequence[TextRequest]) -> list[torch.Tensor]:
        """Each request's vector, pooled (a chunked text's: the mean of its windows'), cut to
        its ``dimensions`` and normalized as it asks (else as the pipeline does): (dims,) fp32
        tensors on the CPU."""
        if not requests:
            return []
        parts, counts = run_windows(self, requests, self.pooled)
        vectors = []
        for r, row in zip(requests, per_input(torch.cat(parts), counts)):
            wanted = getattr(r, "normalize", None)
            vectors.append(finish(row[None], self.normalize if wanted is None else wanted,
                                  getattr(r, "dimensions", None))[0])
        return vectors

    def pooled(self, windows: Sequence[Window]) -> torch.Tensor:
        """(N, H) pooled vectors of ``windows`` run as one padded batch, on the CPU."""
        inputs = self.pad(windows)
        out = self.forward(inputs)
        hidden = out if torch.is_tensor(out) or isinstance(out, np.ndarray) else (
            out.last_hidden_state)  # (N, S, H)
        # Pooled in fp32 where the model ran (autocast's bf16 upcast on its device; an ONNX
        # backend's numpy on the CPU): only the (N, H) vectors come back to the host.
        hidden = hidden.float() if torch.is_tensor(hidden) else torch.from_numpy(
            _logits(hidden))
        mask = inputs["attention_mask"].to(hidden.device)  # (N, S)
        return pool(hidden, mask, self.pooling).cpu()

    def run(self, requests: Sequence[TextRequest]) -> list[dict]:
        return [self.mark({"embedding": vector.tolist(), "pooling": self.pooling}, r)
                for r, vector in zip(requests, self.vectors(requests))]

    def describe(self) -> dict:
        return {**super().describe(), "pooling": self.pooling, "normalize": self.normalize,
                "dimensions": self.config.hidden_size, "matryoshka_dims": self.matryoshka_dims,
                "prompts": dict(self.prompts), "default_prompt_name": self.default_prompt_name,
                **chunk_description(self)}

    def example(self) -> dict:
        return {"text": "A sentence to embed."}

    def format_line(self, result: dict) -> str:
        vector = result["embedding"]
        shown = ", ".join(f"{x:.4f}" for x in vector[:6])
        return f"[{shown}, ...] ({len(vector)} dimensions, {result['pooling']} pooling)"


__all__ = ["EmbedRequest", "FeatureExtractionPipeline", "check_dimensions"]
