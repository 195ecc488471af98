"""text-embeddings-inference's (TEI) ``/rerank``, ``/tokenize`` and ``/info`` on top of the served
pipelines (``/embed`` is :class:`bertforge.serve.embeddings.EmbeddingApi`'s).

``POST /rerank`` ``{"query", "texts": [...], "raw_scores"?: false, "return_text"?: false,
"truncate"?}`` -> ``[{"index", "score", "text"?}]``, best first. How a pair is scored depends
on the served model (``GET /info`` says which, under ``rerank``):

* ``cross-encoder``: the model is a reranker (a text-ranking model, ``finetuning_task``
  "text-ranking") or a text-classification model with one output, scored ``sigmoid(logit)``
  as sentence-transformers' ``CrossEncoder.predict`` (``raw_scores``: the logit), or a
  two-class classifier fine-tuned on a GLUE
  sentence-pair task (mrpc, qqp, qnli, rte, wnli; config.json's ``finetuning_task``), scored by
  the probability of its matching class (equivalent, duplicate, entailment; ``raw_scores``: that
  class's logit minus the other's). The pair ``(query, text)`` runs through the classifier.
* ``bi-encoder``: any other model with embeddings served: the cosine similarity of the query's
  and the text's vectors (``raw_scores`` changes nothing), each with its saved prompt when the
  model has them ("query", "document": as sentence-transformers' ``encode_query`` and
  ``encode_document``).

``POST /tokenize`` ``{"inputs": str | [str], "add_special_tokens"?: true}`` -> per input a list
of ``{"id", "text", "special", "start", "stop"}``: ``start``/``stop`` are character offsets in
the input (TEI's are bytes; the same for ASCII), null for special tokens, whose ``text`` is the
token itself. One request answers at most ``--max-batch-tokens`` tokens in all (a 413 naming
the text that goes past them): about 60 bytes of JSON a token, so a megabyte of text would
otherwise ask for some 30 MB of answer.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Mapping

from fastapi import FastAPI, Request
from fastapi.responses import Response

from bertforge.inference.pipelines import Pipeline
from bertforge.serve.answering import answer_items, answer_request
from bertforge.serve.batching import BatcherClosed, DynamicBatcher
from bertforge.serve.disclosure import PathFilter, model_name
from bertforge.serve.embeddings import (EmbeddingApi, check_direction, check_fields, flag, got,
                                        item_options, texts_field)
from bertforge.serve.limits import ApiError, shutting_down
from bertforge.serve.settings import ServeSettings
from bertforge.tasks.registry import get_task
from bertforge.tokenization.prefix import FIRST_CHARS_PER_TOKEN, GROWTH, text_prefix

RERANK_FIELDS = ("query", "texts", "raw_scores", "return_text", "truncate",
                 "truncation_direction")
TOKENIZE_FIELDS = ("inputs", "add_special_tokens")
MATCHING_LABELS = ("1", "equivalent", "duplicate", "entailment")
"""Class names that say "the pair matches" in the two-class GLUE pair tasks."""


def pair_label(pipeline: Pipeline) -> str | None:
    """The matching class of a two-class classifier fine-tuned on a GLUE sentence-pair task
    (from config.json's ``finetuning_task``, e.g. ``glue/mrpc``), else None."""
    from bertforge.data.finetuning.glue import GLUE_TASKS

    described = pipeline.describe()
    labels = described.get("labels") or []
    finetuned = str(getattr(getattr(pipeline, "config", None), "finetuning_task", None) or "")
    name = finetuned.rsplit("/", 1)[-1].lower().replace("-", "").replace("_", "")
    glue = GLUE_TASKS.get(name)
    if glue is None or len(labels) != 2 or not all(len(c) == 2 for c in glue.text_columns):
        return None
    return next((label for label in labels if label in MATCHING_LABELS), None)


def rerank_mode(pipeline: Pipeline, embeddings: EmbeddingApi | None) -> tuple[str | None, str]:
    """``("cross-encoder" | "bi-encoder" | None, how pairs are scored)`` for the served task
    pipeline and embeddings (see the module notes)."""
    described = pipeline.describe()
    if described.get("task") == "text-ranking":
        return "cross-encoder", "sigmoid of the reranker's score for (query, text)"
    if described.get("task") == "text-classification":
        if described.get("regression"):
            return "cross-encoder", "sigmoid of the classifier's one output for (query, text)"
        label = pair_label(pipeline)
        if label is not None:
            return "cross-encoder", (f"probability of class {label!r} of the pair classifier "
                                     "for (query, text)")
    if embeddings is not None:
        return "bi-encoder", "cosine similarity of the query's and the text's embeddings"
    return None, ("this server has no reranker: the model is not a cross-encoder and "
                  "/v1/embeddings is not served (--no-embeddings, or an ONNX backend)")


class TeiApi:
    """The answers of ``/rerank`` and ``/tokenize`` and the ``/info`` document."""

    def __init__(self, pipeline: Pipeline, batcher: DynamicBatcher,
                 embeddings: EmbeddingApi | None, settings: ServeSettings) -> None:
        self.pipeline, self.batcher, self.embeddings = pipeline, batcher, embeddings
        self.settings = settings
        self.mode, self.scoring = rerank_mode(pipeline, embeddings)
        self.label = pair_label(pipeline) if self.mode == "cross-encoder" else None

    async def rerank(self, body: Any) -> list[dict]:
        body = check_fields(body, RERANK_FIELDS)
        check_direction(body)
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            what = "" if query is None else f", got {got(query)}"
            raise ApiError(422, f"query is required: a non-empty string{what}", "query")
        if len(query) > self.settings.max_text_chars:
            raise ApiError(413, f"query is {len(query)} characters; the limit is "
                                f"{self.settings.max_text_chars} (--max-text-chars)", "query")
        texts, _ = texts_field(body, "texts", self.settings, single=False)
        raw, with_text = flag(body, "raw_scores", False), flag(body, "return_text", False)
        if self.mode == "cross-encoder":
            scores = await self._cross_scores(query, texts, flag(body, "truncate", None), raw)
        elif self.mode == "bi-encoder":
            scores = await self._cosines(query, texts, body)
        else:
            raise ApiError(404, self.scoring)
        ranked = [{"index": i, "score": s} for i, s in enumerate(scores)]
        if with_text:
            for entry, (_, text) in zip(ranked, texts):
                entry["text"] = text
        return sorted(ranked, key=lambda entry: -entry["score"])

    async def _cross_scores(self, query: str, texts: list[tuple[str, str]],
                            truncate: bool | None, raw: bool) -> list[float]:
        cut = {} if truncate is None else {"truncate": truncate}
        items = [(name, {"text": query, "text_pair": text, **cut}) for name, text in texts]
        # The pipeline's pair is (text, text_pair); the client sent (query, texts[i]).
        results, _ = await answer_items(self.pipeline, self.batcher, items, self.settings, True,
                                        route="/rerank", names={"text": "query",
                                                                "text_pair": None})
        if "logit" in results[0]:  # a reranker: score = sigmoid(logit)
            return [r["logit"] if raw else r["score"] for r in results]
        if self.label is None:  # one output: its logit
            return [r["score"] if raw else _sigmoid(r["score"]) for r in results]
        scores = []
        for r in results:
            matching = r["scores"][self.label]
            other = next(p for name, p in r["scores"].items() if name != self.label)
            scores.append(math.log(max(matching, 1e-300)) - math.log(max(other, 1e-300))
                          if raw else matching)
        return scores

    async def _cosines(self, query: str, texts: list[tuple[str, str]],
                       body: Mapping[str, Any]) -> list[float]:
        assert self.embeddings is not None
        options = item_options(body, True)
        prompts = self.embeddings.prompts
        # The query and the texts, each as the model was trained to read them (its prompts).
        each = [{**options, **_prompt(prompts, "query")},
                *[{**options, **_prompt(prompts, "document")}] * len(texts)]
        vectors, _ = await self.embeddings.vectors([("query", query), *texts], each, "/rerank")
        first = vectors[0]
        return [float(sum(a * b for a, b in zip(first, v))) for v in vectors[1:]]

    async def tokenize(self, body: Any) -> list[list[dict]]:
        """The tokens of every text, at most ``max_batch_tokens`` of them in all (413 beyond,
        found by tokenizing no more than that many: :func:`_tokens`); each text is its own
        turn on the parsing thread, as the items of the model routes are."""
        body = check_fields(body, TOKENIZE_FIELDS)
        texts, _ = texts_field(body, "inputs", self.settings)
        special = flag(body, "add_special_tokens", True)
        tokenizer, budget = self.pipeline.tokenizer, self.settings.max_batch_tokens
        admission = self.batcher.admission
        out: list[list[dict]] = []
        with admission.hold(len(texts)) if admission is not None else contextlib.nullcontext():
            for name, text in texts:
                try:
                    out.append(await self.batcher.parse(_tokens, tokenizer, name, text, special,
                                                        budget - sum(map(len, out)), budget))
                except BatcherClosed:
                    raise shutting_down() from None
        return out

    def info(self, endpoints: list[str]) -> dict:
        """TEI's ``/info`` fields plus bertforge's: what is served and how."""
        from bertforge import __version__

        described = self.pipeline.describe()
        extractor = (self.embeddings.extractor.describe() if self.embeddings is not None
                     else {})
        model_path = str(described.get("model", ""))
        return {
            "model_id": model_name(model_path),
            "model_path": model_path if self.settings.expose_paths else None,
            "model_sha": None, "model_dtype": described.get("precision"),
            "model_type": self._model_type(described, extractor),
            "task": described.get("task"), "pooling": extractor.get("pooling"),
            "normalize": extractor.get("normalize"), "dimensions": extractor.get("dimensions"),
            "matryoshka_dims": extractor.get("matryoshka_dims"),
            "prompts": extractor.get("prompts"),
            "rerank": self.mode, "rerank_scoring": self.scoring,
            "max_input_length": described.get("max_length"),
            "truncation": described.get("truncation"),
            "max_batch_tokens": self.settings.max_batch_tokens,
            "max_batch_requests": self.settings.max_batch_items,
            "max_client_batch_size": self.settings.max_batch_items,
            "max_wait_ms": self.settings.max_wait_ms, "backend": described.get("backend"),
            "device": described.get("device"), "version": __version__,
            "endpoints": endpoints}

    def _model_type(self, described: Mapping[str, Any], extractor: Mapping[str, Any]) -> dict:
        """TEI's ``model_type`` of the served task, as the task registry names it (whatever the
        backend, and whatever else the server offers): a reranker or another classifier, an
        embedder, or the task itself where TEI has no kind for it (``{"fill-mask": {}}``)."""
        spec = get_task(str(described.get("task")))
        kind = (spec.serving.tei_kind if spec.serving is not None else None) or spec.name
        if kind in ("classifier", "reranker"):
            labels = described.get("labels") or ["LABEL_0"]
            kind = "reranker" if self.mode == "cross-encoder" else "classifier"
            return {kind: {"id2label": {str(i): n for i, n in enumerate(labels)},
                           "label2id": {n: i for i, n in enumerate(labels)}}}
        if kind == "embedding":
            return {kind: {"pooling": extractor.get("pooling", described.get("pooling"))}}
        return {kind: {}}


def add_tei_routes(app: FastAPI, api: TeiApi, protect: list, embed_unavailable: str | None,
                   paths: PathFilter) -> None:
    """Register ``POST /embed``, ``/rerank``, ``/tokenize`` (behind the API key) and ``GET
    /info`` (open, like /health, its body passed through ``paths``) on ``app``. Without served
    embeddings ``/embed`` answers a JSON 404 saying why (``embed_unavailable``, else
    --no-embeddings)."""
    settings = api.settings

    def route(answer: Any) -> Any:
        async def handle(request: Request) -> Response:
            return await answer_request(request, settings, api.batcher.admission, answer)
        return handle

    async def no_embed(request: Request) -> None:
        raise ApiError(404, embed_unavailable or "/embed needs embeddings, which this server "
                            "does not serve (started with --no-embeddings)")

    embeddings = api.embeddings
    for path, answer, summary in (
            ("/embed", embeddings.embed if embeddings is not None else None,
             "TEI: one vector per input"),
            ("/rerank", api.rerank, f"TEI: texts ranked by relevance to a query ({api.mode})"),
            ("/tokenize", api.tokenize, "TEI: the tokens of each input")):
        app.add_api_route(path, route(answer) if answer is not None else no_embed,
                          methods=["POST"], dependencies=protect, summary=summary,
                          include_in_schema=answer is not None)

    @app.get("/info", summary="TEI: the served model and the server's batching settings")
    async def info() -> dict:
        return paths.public(api.info(sorted({r.path for r in app.routes if "POST" in getattr(
            r, "methods", ()) and r.path.startswith(("/v1/", "/embed", "/rerank", "/tok"))})))


def _prompt(prompts: Mapping[str, str], name: str) -> dict[str, str]:
    """The item field asking for saved prompt ``name``, when the model has one."""
    return {"prompt_name": name} if name in prompts else {}


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _tokens(tokenizer: Any, name: str, text: str, special: bool, left: int,
            budget: int) -> list[dict]:
    """TEI's token list of ``text`` (see the module notes); a 413 naming ``name`` when it
    takes the request past ``left`` of its ``budget`` tokens, found on a prefix of the text
    (:func:`~bertforge.tokenization.prefix.text_prefix`): the answer, about 60 bytes a token,
    and the work are bounded by the budget, not by the text."""
    chars = max(left, 1) * FIRST_CHARS_PER_TOKEN
    while True:
        part = text_prefix(text, chars)
        encoding = tokenizer.backend.encode(part, add_special_tokens=special)
        if len(encoding.ids) > left:
            raise ApiError(413, f"{name} takes this request past {budget} tokens, the most one "
                                "/tokenize request answers (--max-batch-tokens); send less text "
                                "per request", name)
        if len(part) == len(text):
            break
        chars *= GROWTH
    tokens = []
    for token_id, token, (start, stop), is_special in zip(
            encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask):
        if is_special:
            tokens.append({"id": token_id, "text": token, "special": True, "start": None,
                           "stop": None})
        else:
            tokens.append({"id": token_id, "text": text[start:stop], "special": False,
                           "start": start, "stop": stop})
    return tokens


__all__ = ["TeiApi", "add_tei_routes", "pair_label", "rerank_mode"]
