"""Summarization with the model's generation settings and per-request overrides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from bertforge.config import GenerationOptions
from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import (InputError, Pipeline, _fields, _number, _text)

# --- summarization -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryRequest:
    ids: np.ndarray       # (S,) encoded article, <s> ... </s>
    settings: Any         # GenerationConfig: the model's, with this request's overrides
    truncated: bool


# The request fields are the generation options of every command (one definition); their ranges
# are GenerationConfig's, checked when the settings are built.
_GENERATION_FIELDS = GenerationOptions.request_kinds()


def _setting(item: Mapping[str, Any], name: str, kind: type | None) -> Any:
    """A number field (``kind``), or early_stopping as given (GenerationConfig checks it)."""
    return _number(item, name, kind) if kind is not None else item.get(name)


@dataclass
class SummarizationPipeline(Pipeline):
    """Abstractive summaries by BART with the model's generation_config.json and per-request
    overrides. Requests with the same settings share a batch."""

    fields: ClassVar[tuple[str, ...]] = ("text", *_GENERATION_FIELDS)
    default_truncation: ClassVar[str] = "truncate"
    decodes: ClassVar[bool] = True

    def parse(self, item: Mapping[str, Any]) -> SummaryRequest:
        from bertforge.inference.generate import generation_settings

        item = _fields(item, self.fields)
        text = _text(item, "text")
        overrides = {name: value for name, kind in _GENERATION_FIELDS.items()
                     if (value := _setting(item, name, kind)) is not None}
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

    def run(self, requests: Sequence[SummaryRequest]) -> list[dict]:
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

    def format_line(self, result: dict) -> str:
        return result["summary"]


