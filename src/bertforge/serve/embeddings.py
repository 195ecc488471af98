"""Embeddings in the shapes clients already speak: OpenAI's ``POST /v1/embeddings`` and
text-embeddings-inference's (TEI) ``POST /embed``, ``/rerank``, ``/tokenize`` and ``GET /info``.

Every text is one item of the feature-extraction pipeline (or, for a cross-encoder's rerank, of
the text-classification pipeline) submitted to that pipeline's dynamic batcher, exactly as the
``/v1/<task>`` routes do; only the request and response shapes differ. Errors use the server's
one schema with the field named as the client wrote it (``input[2]``, ``texts[0]``).

OpenAI: ``{"input": "text" | ["a", "b"], "model"?, "encoding_format"?: "float" | "base64",
"dimensions"?, "user"?, "normalize"?, "truncate"?, "prompt_name"?}`` -> ``{"object": "list",
"data": [{"object": "embedding", "index": i, "embedding": [...] | base64}], "model", "usage":
{"prompt_tokens", "total_tokens"}}``. ``model`` is accepted and not checked (clients send their
own default names); base64 is the little-endian float32 bytes, as OpenAI sends them.
``dimensions``: for a Matryoshka model (sizes saved with it) any size from 1 to the hidden
size, the vectors cut to it and then normalized when normalizing; for any other model only the
hidden size. ``normalize`` defaults to the pipeline's (the model's saved sentence-transformers
setting, else off), ``truncate`` to the server's ``--truncation``, ``prompt_name`` (bertforge's,
as TEI's: a saved prompt such as "query" put before every input) to the saved default prompt,
usually none.

TEI's ``/embed`` takes ``inputs``, ``normalize`` (default true), ``truncate``,
``truncation_direction`` ("right" only), ``prompt_name`` and ``dimensions``, with the same
meanings.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Mapping

import numpy as np

from bertforge.core.kinds import json_kind
from bertforge.inference.pipelines import InputError, Pipeline
from bertforge.inference.pipelines.features import check_dimensions
from bertforge.serve.answering import answer_items
from bertforge.serve.batching import DynamicBatcher
from bertforge.serve.disclosure import model_name
from bertforge.serve.limits import ApiError
from bertforge.serve.settings import ServeSettings

OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user", "normalize",
                 "truncate", "prompt_name")
EMBED_FIELDS = ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name",
                "dimensions")
# The item fields a request sets for all its texts, named as the request names them.
_REQUEST_OPTIONS = {"normalize": "normalize", "truncate": "truncate",
                    "prompt_name": "prompt_name", "dimensions": "dimensions"}
ENCODINGS = ("float", "base64")


# --- request fields ------------------------------------------------------------------------------


def got(value: Any) -> str:
    """``json_kind`` of ``value`` with the value itself when it is short, for messages."""
    kind = json_kind(value)
    if isinstance(value, (list, dict)):
        return kind
    shown = repr(value) if isinstance(value, str) else json.dumps(value)
    return kind if len(shown) > 40 or value is None else f"{kind} {shown}"


def _token_ids(value: list) -> bool:
    """Whether ``value`` is what OpenAI's route also takes and this server does not: token
    ids (a list of integers, or a list of such lists)."""
    def ids(row: Any) -> bool:
        return (isinstance(row, list) and bool(row)
                and all(isinstance(i, int) and not isinstance(i, bool) for i in row))
    return ids(value) or all(ids(row) for row in value)


def check_fields(body: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """``body`` as an object whose keys are all in ``allowed`` (422 naming the first other)."""
    if not isinstance(body, dict):
        raise ApiError(422, f"the body must be a JSON object with {', '.join(allowed)}, got "
                            f"{json_kind(body)}", "body")
    for key in body:
        if key not in allowed:
            raise ApiError(422, f"{key} is not a field of this request; fields: "
                                f"{', '.join(allowed)}", key)
    return body


def texts_field(body: Mapping[str, Any], key: str, settings: ServeSettings, *,
                single: bool = True) -> tuple[list[tuple[str, str]], bool]:
    """The strings of ``body[key]`` (one string when ``single``, or a list of them) as
    ``[(field name, text)]`` (``key`` for a lone string, ``key[i]`` in a list) and whether it
    was a list. 422 for anything else, naming what arrived and where (``key``, ``key[2]``)
    and what is accepted; token ids (what OpenAI's route also takes) are told apart from
    other numbers. 413 over ``--max-batch-items`` or ``--max-text-chars``."""
    value = body.get(key)
    accepted = "a string or a list of strings" if single else "a list of strings"
    if value is None:
        raise ApiError(422, f"{key} is required: {accepted}", key)
    if isinstance(value, str) and single:
        named = [(key, value)]
    elif not isinstance(value, list) or not value:
        raise ApiError(422, f"{key} is {json_kind(value)}; send {accepted}", key)
    elif _token_ids(value):
        raise ApiError(422, f"{key} is {json_kind(value)}: token ids; this server embeds text, "
                            f"not token ids: send {accepted} (a client that tokenizes first, "
                            "as LangChain's OpenAIEmbeddings does, must send the text: "
                            "check_embedding_ctx_length=False)", key)
    else:
        named = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
        bad = next(((name, v) for name, v in named if not isinstance(v, str)), None)
        if bad is not None:
            raise ApiError(422, f"{bad[0]} is {json_kind(bad[1])}; each item of {key} must be "
                                f"a string ({key}: {accepted})", bad[0])
    if len(named) > settings.max_batch_items:
        raise ApiError(413, f"{key} holds {len(named)} texts; the limit is "
                            f"{settings.max_batch_items} per request (--max-batch-items)", key)
    for name, text in named:
        if len(text) > settings.max_text_chars:
            raise ApiError(413, f"{name} is {len(text)} characters; the limit is "
                                f"{settings.max_text_chars} (--max-text-chars)", name)
    return named, isinstance(value, list)


def flag(body: Mapping[str, Any], name: str, default: bool | None) -> bool | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(422, f"{name} must be true or false, got {got(value)}", name)
    return value


def check_direction(body: Mapping[str, Any]) -> None:
    """TEI's ``truncation_direction``: only "right" (the end of a long text is cut)."""
    value = body.get("truncation_direction")
    if value is not None and (not isinstance(value, str) or value.lower() != "right"):
        raise ApiError(422, "truncation_direction must be \"right\": this server cuts the end "
                            "of a long text", "truncation_direction")


def item_options(body: Mapping[str, Any], normalize: bool | None) -> dict[str, Any]:
    """The feature-extraction item fields a request sets (absent: the pipeline's defaults);
    ``prompt_name`` is checked by the pipeline, against the model's saved prompts."""
    options = {"normalize": normalize, "truncate": flag(body, "truncate", None),
               "prompt_name": body.get("prompt_name")}
    return {k: v for k, v in options.items() if v is not None}


def check_size(body: Mapping[str, Any], described: Mapping[str, Any]) -> int | None:
    """The request's ``dimensions`` (None: absent), by the rule of the served extractor
    (``described``: its ``describe()``): 1 to the hidden size for a Matryoshka model, else the
    hidden size only; a 422 naming ``dimensions`` otherwise."""
    value = body.get("dimensions")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(422, f"dimensions must be a whole number, got {got(value)}",
                       "dimensions")
    try:
        check_dimensions(value, described.get("dimensions"), described.get("matryoshka_dims"))
    except InputError as exc:
        raise ApiError(422, f"dimensions {exc.message}", "dimensions") from None
    return value


# --- the routes' work ----------------------------------------------------------------------------


class EmbeddingApi:
    """The OpenAI and TEI embedding answers of one served feature-extraction pipeline."""

    def __init__(self, extractor: Pipeline, batcher: DynamicBatcher,
                 settings: ServeSettings) -> None:
        self.extractor, self.batcher, self.settings = extractor, batcher, settings
        self.described = extractor.describe()
        self.prompts = self.described.get("prompts") or {}
        self.model_name = model_name(self.described.get("model", "model"))

    async def vectors(self, texts: list[tuple[str, str]],
                      options: Mapping[str, Any] | list[Mapping[str, Any]],
                      route: str) -> tuple[list[list[float]], int]:
        """The embedding of every ``(field name, text)`` and the tokens they took; ``options``
        are the item fields of every text, or a list of each text's own."""
        each = options if isinstance(options, list) else [options] * len(texts)
        items = [(name, {"text": text, **own}) for (name, text), own in zip(texts, each)]
        # A text is the request's value itself: an error names it as sent ("input[1]"); an
        # option is the request's own field ("prompt_name").
        results, costs = await answer_items(self.extractor, self.batcher, items, self.settings,
                                            True, route=route,
                                            names={"text": None, **_REQUEST_OPTIONS})
        return [r["embedding"] for r in results], sum(costs)

    async def openai(self, body: Any) -> dict:
        """``POST /v1/embeddings`` in OpenAI's request and response shape."""
        body = check_fields(body, OPENAI_FIELDS)
        texts, _ = texts_field(body, "input", self.settings)
        for name in ("model", "user"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise ApiError(422, f"{name} must be a string, got {got(body[name])}", name)
        encoding = body.get("encoding_format")
        encoding = "float" if encoding is None else encoding
        if not isinstance(encoding, str) or encoding not in ENCODINGS:
            raise ApiError(422, f"encoding_format must be float or base64, got {got(encoding)}",
                           "encoding_format")
        options = self.options(body, flag(body, "normalize", None))
        vectors, tokens = await self.vectors(texts, options, "/v1/embeddings")
        data = [{"object": "embedding", "index": i,
                 "embedding": _base64(v) if encoding == "base64" else v}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": self.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def embed(self, body: Any) -> list[list[float]]:
        """TEI's ``POST /embed``: one vector per input, normalized unless told otherwise."""
        body = check_fields(body, EMBED_FIELDS)
        check_direction(body)
        texts, _ = texts_field(body, "inputs", self.settings)
        options = self.options(body, flag(body, "normalize", True))
        vectors, _ = await self.vectors(texts, options, "/embed")
        return vectors

    def options(self, body: Mapping[str, Any], normalize: bool | None) -> dict[str, Any]:
        """``item_options`` with the request's checked ``dimensions``."""
        size = check_size(body, self.described)
        return {**item_options(body, normalize), **({"dimensions": size} if size else {})}


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the vector's little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


__all__ = ["EmbeddingApi", "check_fields", "check_size", "got", "item_options", "texts_field"]
