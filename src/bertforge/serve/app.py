"""The HTTP API of ``bertforge serve``: a FastAPI app around one inference pipeline.

Routes (``TASK`` is the pipeline's task, e.g. ``question-answering``):

* ``POST /v1/TASK`` and ``POST /v1/embeddings``: one JSON item (``{"question": ..., "context":
  ...}``) answered by one result object, or ``{"inputs": [item, ...]}`` answered by
  ``{"outputs": [result, ...]}`` in the same order. Every item goes through the dynamic batcher on
  its own, so items of one request and of concurrent requests share model calls.
* ``GET /health``: ready flag and the model's description; ``GET /metrics``: Prometheus text;
  ``GET /openapi.json`` and ``GET /docs``: FastAPI's schema and its browsable page; ``GET /``: a
  page to try the model (see :mod:`bertforge.serve.page`).

Errors are JSON, ``{"error": {"field": NAME or null, "message": TEXT}}``: 400 malformed JSON; 401
missing or wrong API key; 404/405 unknown route or method; 413 anything over a size limit (body
bytes, items per request, characters per text field); 422 an item the pipeline rejects (missing,
wrong type, empty, over the model's length under ``truncation="error"``); 500 an internal failure
of that request only (the traceback goes to the server log, the client gets a generic message);
503 while shutting down.

With an API key, ``/v1/*`` and ``/metrics`` need ``Authorization: Bearer KEY`` or ``X-API-Key:
KEY``; ``/health`` (load balancers probe it), ``/``, ``/docs`` and ``/openapi.json`` (static, no
model output) stay open. The page sends the key the user types into it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertforge.tasks.registry import get_task
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import InputError, Pipeline
from bertforge.serve.batching import BatcherClosed, DynamicBatcher
from bertforge.serve.metrics import CONTENT_TYPE, ServerMetrics
from bertforge.serve.page import PAGE_HTML

log = logging.getLogger("bertforge.serve")

EMBEDDINGS_PATH = get_task("feature-extraction").serving.route

@dataclass(frozen=True)
class ServeSettings:
    """The server's limits and batching budget (the pipeline holds the model's own settings)."""

    max_batch_tokens: int = 8192
    """Token budget of one model call: the sum of its items' costs (padded tokens)."""
    max_batch_items: int = 32
    """Items per model call, and the most items one ``{"inputs": [...]}`` request may hold."""
    max_wait_ms: float = 5.0
    """How long the oldest queued item waits for others to join its batch."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted (413 beyond)."""
    max_text_chars: int = 100_000
    """Longest string accepted in any item field (413 beyond); token limits are the pipeline's."""
    api_key: str | None = None
    """When set, ``/v1/*`` and ``/metrics`` require it (Bearer or X-API-Key)."""

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_items", "max_body_bytes", "max_text_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got "
                                  f"{getattr(self, name)})")
        if self.max_wait_ms < 0:
            raise ConfigError(f"--max-wait-ms must be >= 0 (got {self.max_wait_ms})")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key is empty; pass a non-empty key or leave it unset")


class ApiError(Exception):
    """A request answered with ``status`` and the JSON error body."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def _error(status: int, message: str, field: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "message": message}}, status_code=status,
                        headers=dict(headers or {}))


def create_app(pipeline: Pipeline, settings: ServeSettings, *,
               embeddings: Pipeline | None = None) -> FastAPI:
    """The ASGI app serving ``pipeline`` at its task's route (the task registry's: ``/v1/<task>``,
    ``/v1/embeddings`` for feature extraction), plus ``embeddings`` at ``/v1/embeddings`` when
    given."""
    served = {get_task(pipeline.task).serving.route: pipeline}
    if embeddings is not None:
        if EMBEDDINGS_PATH in served:
            raise ValueError("embeddings given twice: the pipeline already extracts features")
        served[EMBEDDINGS_PATH] = embeddings
    metrics = ServerMetrics()
    batchers = {path: DynamicBatcher(
        p, max_batch_tokens=settings.max_batch_tokens, max_batch_items=settings.max_batch_items,
        max_wait_ms=settings.max_wait_ms,
        on_batch=lambda stats, task=p.task: metrics.observe_batch(task, stats))
        for path, p in served.items()}
    description = {path: p.describe() for path, p in served.items()}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for batcher in batchers.values():
            await batcher.start()
        yield
        # uvicorn calls this after the in-flight requests are answered; close() drains the rest.
        for batcher in batchers.values():
            await batcher.close()

    app = FastAPI(title="bertforge serve", version="1", lifespan=lifespan,
                  description=f"Serving a {pipeline.task} model with dynamic batching.")
    protect = [Depends(_key_check(settings.api_key))] if settings.api_key else []

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _error(exc.status, exc.message, exc.field, headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.middleware("http")
    async def observe(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        metrics.in_flight.inc()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            metrics.in_flight.dec()
            route = request.scope.get("route")
            metrics.observe_request(getattr(route, "path", "other"), status,
                                    time.perf_counter() - started)

    for path, served_pipeline in served.items():
        _add_task_route(app, path, served_pipeline, batchers[path], settings, protect)

    @app.get("/health", summary="Readiness and the served model")
    async def health() -> dict:
        return {"status": "ok", "ready": True, "task": pipeline.task,
                "endpoints": {path: {"task": served[path].task,
                                     "form": get_task(served[path].task).serving.form,
                                     "model": description[path]}
                              for path in served},
                "limits": {"max_batch_tokens": settings.max_batch_tokens,
                           "max_batch_items": settings.max_batch_items,
                           "max_wait_ms": settings.max_wait_ms,
                           "max_body_bytes": settings.max_body_bytes,
                           "max_text_chars": settings.max_text_chars},
                "auth": settings.api_key is not None}

    @app.get("/metrics", summary="Prometheus metrics", dependencies=protect,
             response_class=Response)
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE_HTML)

    return app


def _key_check(api_key: str) -> Any:
    """A dependency that raises 401 unless the request carries ``api_key`` (Bearer or
    X-API-Key). Declared through FastAPI's security classes so ``/docs`` offers to send it."""
    bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY")
    header = APIKeyHeader(name="X-API-Key", auto_error=False)
    expected = api_key.encode()

    async def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
                    key: str | None = Depends(header)) -> None:
        given = credentials.credentials if credentials is not None else key
        # compare_digest: the time taken does not reveal how much of a guess was right.
        if given is None or not hmac.compare_digest(given.encode(), expected):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' or "
                                "'X-API-Key: KEY'", "Authorization")

    return check


async def _read_json(request: Request, limit: int) -> Any:
    """The request body parsed as JSON; 413 beyond ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {limit} "
                            "(--max-body-bytes)", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes "
                                "(--max-body-bytes)", "body")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", "body") from None


def _items(body: Any, settings: ServeSettings
           ) -> tuple[list[tuple[str | None, Mapping[str, Any]]], bool]:
    """``[(field prefix, item)]`` of a body (prefix ``inputs[i]``, None for a single item) and
    whether it was a ``{"inputs": [...]}`` batch."""
    if not isinstance(body, dict):
        raise ApiError(422, 'the body must be a JSON object: one item, or {"inputs": [items]}',
                       "body")
    if "inputs" not in body:
        items, batched = [(None, body)], False
    else:
        inputs = body["inputs"]
        if not isinstance(inputs, list) or not inputs:
            raise ApiError(422, "inputs must be a non-empty list of objects", "inputs")
        if len(inputs) > settings.max_batch_items:
            raise ApiError(413, f"inputs holds {len(inputs)} items; the limit is "
                                f"{settings.max_batch_items} per request (--max-batch-items)",
                           "inputs")
        for i, item in enumerate(inputs):
            if not isinstance(item, dict):
                raise ApiError(422, f"inputs[{i}] must be a JSON object", f"inputs[{i}]")
        items, batched = [(f"inputs[{i}]", item) for i, item in enumerate(inputs)], True
    for prefix, item in items:
        for key, value in item.items():
            if isinstance(value, str) and len(value) > settings.max_text_chars:
                name = f"{prefix}.{key}" if prefix else key
                raise ApiError(413, f"{name} is {len(value)} characters; the limit is "
                                    f"{settings.max_text_chars} (--max-text-chars)", name)
    return items, batched


def _input_error(exc: InputError, prefix: str | None) -> ApiError:
    """A pipeline's InputError as a 422, its field inside ``inputs[i]`` for batch items."""
    if prefix is not None:
        exc = exc.within(prefix)
    return ApiError(422, str(exc), exc.field)


def _parse_all(pipeline: Pipeline, items: list[tuple[str | None, Mapping[str, Any]]]
               ) -> list[tuple[Any, int]]:
    """``(request, cost)`` of every item; the first bad item raises its 422."""
    parsed = []
    for prefix, item in items:
        try:
            request = pipeline.parse(item)
        except InputError as exc:
            raise _input_error(exc, prefix) from None
        parsed.append((request, pipeline.cost(request)))
    return parsed


def _add_task_route(app: FastAPI, path: str, pipeline: Pipeline, batcher: DynamicBatcher,
                    settings: ServeSettings, protect: list) -> None:
    """Register ``POST path`` answering items of ``pipeline`` through ``batcher``."""

    async def predict(request: Request) -> JSONResponse:
        items, batched = _items(await _read_json(request, settings.max_body_bytes), settings)
        try:
            parsed = await batcher.in_worker(_parse_all, pipeline, items)
        except BatcherClosed:
            raise ApiError(503, "the server is shutting down; retry on another instance") from None
        answers = await asyncio.gather(*(batcher.submit(r, cost) for r, cost in parsed),
                                       return_exceptions=True)
        for (prefix, _), answer in zip(items, answers):
            if isinstance(answer, InputError):
                raise _input_error(answer, prefix)
            if isinstance(answer, BatcherClosed):
                raise ApiError(503, "the server is shutting down; retry on another instance")
            if isinstance(answer, BaseException):
                log.error("%s failed on an item", path, exc_info=answer)
                raise ApiError(500, "internal error while running the model on this request; "
                                    "the server log has the details")
        return JSONResponse({"outputs": answers} if batched else answers[0])

    example = pipeline.describe().get("example", {})
    item_schema = {"type": "object", "example": example}
    app.add_api_route(
        path, predict, methods=["POST"], dependencies=protect, summary=f"{pipeline.task}",
        description="One item, or {\"inputs\": [items]} (at most "
                    f"{settings.max_batch_items}) answered by {{\"outputs\": [results]}}.",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"oneOf": [item_schema, {
                "type": "object", "required": ["inputs"],
                "properties": {"inputs": {"type": "array", "items": item_schema, "minItems": 1,
                                          "maxItems": settings.max_batch_items}}}]},
            "example": example}}}},
        responses={code: {"description": what} for code, what in (
            (400, "malformed JSON"), (401, "API key missing or wrong"),
            (413, "body, item count or text over a limit"), (422, "invalid item field"),
            (500, "internal error (this request only)"), (503, "shutting down"))})


__all__ = ["EMBEDDINGS_PATH", "ApiError", "ServeSettings", "create_app"]
