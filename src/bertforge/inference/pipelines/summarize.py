"""Summarization with the model's generation settings and per-request overrides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from bertforge.config import GenerationOptions
from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import (InputError, Pipeline, _fields, _flag, _number,
                                                _text, too_long)
from bertforge.tokenization.prefix import encode_ids_capped

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
    overrides. Requests with the same settings share a batch. An item may ask for its own
    ``truncate``."""

    fields: ClassVar[tuple[str, ...]] = ("text", "truncate", *_GENERATION_FIELDS)
    default_truncation: ClassVar[str] = "truncate"
    decodes: ClassVar[bool] = True

    def parse(self, item: Mapping[str, Any]) -> SummaryRequest:
        from bertforge.models.generation.texts import generation_settings

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
        capped = encode_ids_capped(self.tokenizer, text, self.max_length)  # a prefix only
        truncate = _flag(item, "truncate")
        refuses = self.truncation == "error" if truncate is None else not truncate
        over = capped.length > self.max_length
        if over and refuses:
            raise too_long(capped.length, self.max_length, pair=False, counted=capped.counted)
        return SummaryRequest(np.asarray(capped.tokens, np.int64), settings, over)

    def cost(self, request: SummaryRequest) -> int:
        return len(request.ids) * request.settings.num_beams  # beams repeat the encoder rows

    def run(self, requests: Sequence[SummaryRequest]) -> list[dict]:
        from bertforge.models.generation.texts import generate_texts

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


