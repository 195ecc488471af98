"""The HTTP API of ``bertforge serve``: a FastAPI app around one inference pipeline.

Routes (``TASK`` is the pipeline's task, e.g. ``question-answering``):

* ``POST /v1/TASK`` and ``POST /v1/embeddings``: one JSON item (``{"question": ..., "context":
  ...}``) answered by one result object, or ``{"inputs": [item, ...]}`` answered by
  ``{"outputs": [result, ...]}`` in the same order. Every item goes through the dynamic batcher on
  its own, so items of one request and of concurrent requests share model calls.
  ``/v1/embeddings`` also takes OpenAI's shape (a body with ``input``;
  :mod:`bertforge.serve.embeddings`).
* ``POST /embed``, ``/rerank``, ``/tokenize`` and ``GET /info``: text-embeddings-inference's
  routes (:mod:`bertforge.serve.tei`), through the same batchers.
* ``GET /health``: ready flag and the model's description (503 while no replica is ready, and
  from the start of a shutdown: ``"status": "draining"``);
  ``GET /metrics``: Prometheus text; ``GET /openapi.json``: FastAPI's schema; ``GET /docs``: the
  schema as a page rendered here, with no CDN (:mod:`bertforge.serve.docs_page`); ``GET /``: a
  page to try the model (see :mod:`bertforge.serve.page`).

Errors are JSON, ``{"error": {"field": NAME or null, "message": TEXT}}``, whatever goes wrong:
400 malformed JSON (or bytes that are not HTTP, answered by :mod:`bertforge.serve.protocol`); 401
missing or wrong API key; 404/405 unknown route or method; 408 a client too slow to send its
request; 413 anything over a size limit (body bytes, JSON nesting and number length, items per
request, characters per text field, a summary's beams, length and decoding work); 422 an item the
pipeline rejects (missing, wrong type, empty, not valid Unicode, over the model's length under
``truncation="error"``); 500 an internal failure of that request only (the traceback goes to the
server log, the client gets a generic message); 503 when the queue is full (with
Retry-After, :mod:`bertforge.serve.admission`), when the replica running a request was lost
(:mod:`bertforge.serve.replica_pool`) or while shutting down; 415 a body in an
encoding or media type the server does not read; 431 a request head over 16 KiB (answered by
:mod:`bertforge.serve.protocol`). The limits are
:class:`~bertforge.serve.settings.ServeSettings`, checked by :mod:`bertforge.serve.limits`
before any work is queued.

With an API key, ``/v1/*``, the TEI routes but ``/info``, and ``/metrics`` need ``Authorization:
Bearer KEY`` or ``X-API-Key: KEY``; ``/health`` and ``/info`` (load balancers and TEI clients
probe them), ``/``, ``/docs`` and ``/openapi.json`` (static, no model output) stay open. The page
sends the key the user types into it. No answer shows the model directory's path, only its name,
unless ``expose_paths`` (:mod:`bertforge.serve.disclosure`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertforge.tasks.registry import get_task
from bertforge.inference.pipelines import Pipeline
from bertforge.serve.admission import Admission
from bertforge.serve.answering import answer_items, answer_request
from bertforge.serve.batching import BatchStats, DynamicBatcher
from bertforge.serve.disclosure import PathFilter
from bertforge.serve.embeddings import EmbeddingApi
from bertforge.serve.execution import BatchRunner
from bertforge.serve.limits import ApiError, body_items, error_body
from bertforge.serve.metrics import CONTENT_TYPE, ServerMetrics
from bertforge.serve.docs_page import docs_html
from bertforge.serve.page import PAGE_HTML
from bertforge.serve.settings import ServeSettings
from bertforge.serve.tei import TeiApi, add_tei_routes

log = logging.getLogger("bertforge.serve")

EMBEDDINGS_PATH = get_task("feature-extraction").serving.route


def _error(status: int, message: str, field: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, field), status_code=status,
                        headers=dict(headers or {}))


def create_app(pipeline: Pipeline, settings: ServeSettings, *,
               embeddings: Pipeline | None = None,
               unavailable: Mapping[str, str] | None = None, replicas: Any = None,
               thread_counts: tuple[int, int] | None = None) -> FastAPI:
    """The ASGI app serving ``pipeline`` at its task's route (the task registry's: ``/v1/<task>``,
    ``/v1/embeddings`` for feature extraction), plus ``embeddings`` at ``/v1/embeddings`` when
    given. ``unavailable`` maps routes this server could serve but does not (``/v1/embeddings``
    on an ONNX backend) to the reason, answered as a JSON 404. ``replicas``: the
    :class:`~bertforge.serve.replicas.ReplicaPool` running the batches (one batch per replica
    at a time; its state joins /health and /metrics). ``thread_counts``: the torch thread
    counts each batch of an in-process PyTorch model picks between
    (:class:`~bertforge.serve.execution.ThreadChoice`; its preferences join /health)."""
    served = {get_task(pipeline.task).serving.route: pipeline}
    if embeddings is not None:
        if EMBEDDINGS_PATH in served:
            raise ValueError("embeddings given twice: the pipeline already extracts features")
        served[EMBEDDINGS_PATH] = embeddings
    metrics = ServerMetrics()
    if replicas is not None:
        metrics.add_replicas(replicas.snapshot)
    # Tokenization runs off the model's thread: each route parses with a copy of its pipeline
    # that has its own tokenizer (a wrapper the server cannot copy parses between batches).
    parsers = {path: p.parsing_copy() if isinstance(p, Pipeline) else p
               for path, p in served.items()}
    admission = Admission(settings.queue_limit)
    # What the server holds besides a batch is its load, which thread choices group by.
    runners = {path: BatchRunner(p, thread_counts, held=lambda: admission.admitted)
               for path, p in served.items()}
    metrics.add_admission(admission)
    batchers = _batchers(served, parsers, runners, settings, metrics, admission,
                         replicas.size if replicas else 1)
    drain = _Drain(admission, list(batchers.values()), settings.drain_timeout)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for batcher in batchers.values():
            await batcher.start()
        yield
        # uvicorn calls this after the in-flight requests are answered; close() drains the rest.
        drain.stop()
        for batcher in batchers.values():
            await batcher.close()

    # docs_url=None: FastAPI's page loads Swagger UI from a CDN; ours is rendered here, offline.
    app = FastAPI(title="bertforge serve", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  description=f"Serving a {pipeline.task} model with dynamic batching.")
    app.state.begin_drain = drain.begin  # bertforge.serve.protocol.DrainingServer calls it
    protect = [Depends(_key_check(settings.api_key))] if settings.api_key else []
    paths = PathFilter([str(p.describe().get("model", "")) for p in served.values()],
                       settings.expose_paths)
    _add_error_handlers(app, paths)

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

    extractor = parsers.get(EMBEDDINGS_PATH)
    embedding_api = (EmbeddingApi(extractor, batchers[EMBEDDINGS_PATH], settings)
                     if extractor is not None else None)
    for path, parser in parsers.items():
        _add_task_route(app, path, parser, batchers[path], settings, protect,
                        openai=embedding_api.openai if path == EMBEDDINGS_PATH and
                        embedding_api is not None else None)
    for path, reason in (unavailable or {}).items():
        _add_unavailable_route(app, path, reason)
    own = get_task(pipeline.task).serving.route
    add_tei_routes(app, TeiApi(parsers[own], batchers[own], embedding_api, settings), protect,
                   (unavailable or {}).get(EMBEDDINGS_PATH), paths)
    threads = {path: r.threads for path, r in runners.items() if r.threads is not None}
    _add_info_routes(app, pipeline.task, served, settings, metrics, protect, replicas, threads,
                     paths, admission)
    return app


def _batchers(served: Mapping[str, Any], parsers: Mapping[str, Any],
              runners: Mapping[str, BatchRunner], settings: ServeSettings,
              metrics: ServerMetrics, admission: Admission,
              concurrency: int) -> dict[str, DynamicBatcher]:
    """One dynamic batcher per served route, all holding their items in ``admission``."""
    def observe(task: str, stats: BatchStats) -> None:
        metrics.observe_batch(task, stats)
        admission.observe(stats.items, stats.run_seconds)

    return {path: DynamicBatcher(
        runners[path], max_batch_tokens=settings.max_batch_tokens,
        max_batch_items=settings.max_batch_items, max_wait_ms=settings.max_wait_ms,
        concurrency=concurrency, parse_apart=parsers[path] is not p,
        padded=not runners[path].unpadded,
        call_overhead_tokens=runners[path].call_overhead_tokens,
        on_batch=lambda stats, task=p.task: observe(task, stats), admission=admission)
        for path, p in served.items()}


class _Drain:
    """The server's shutdown (SIGTERM): refuse new requests at once (and /health says
    ``draining``, a 503), answer those admitted for ``timeout`` seconds, then refuse them too
    (each batcher's ``expire``), so that the server exits within ``timeout`` however much was
    queued."""

    def __init__(self, admission: Admission, batchers: list[DynamicBatcher],
                 timeout: float) -> None:
        self.admission, self.batchers, self.timeout = admission, batchers, timeout
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        """Start draining (in the event loop; again: nothing more)."""
        if self.admission.closing:
            return
        self.admission.close()
        self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)

    def _expire(self) -> None:
        for batcher in self.batchers:
            batcher.expire()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _add_error_handlers(app: FastAPI, paths: PathFilter) -> None:
    """Every error the app answers in the one JSON schema: ours, Starlette's (404, 405, ...),
    FastAPI's validation errors and any unexpected exception (a generic 500); none quotes the
    model's path (``paths``)."""

    def error(status: int, message: str, field: str | None = None,
              headers: Mapping[str, str] | None = None) -> JSONResponse:
        return _error(status, paths.hide(message), field, headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        if exc.close:  # the body was not read to its end: the connection cannot be reused
            headers["Connection"] = "close"
        if exc.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return error(exc.status, exc.message, exc.field, headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = (f"{request.method} {request.url.path} is not a route of this server; "
                       "/docs lists them")
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{request.url.path} does not take {request.method}; it takes {allowed}"
        return error(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = (exc.errors() or [{}])[0]
        field = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error(422, str(first.get("msg", "invalid request")), field)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises the exception once this answer is sent: uvicorn logs its traceback.
        return error(500, "internal error while answering this request; the server log has "
                          "the details")


def _add_unavailable_route(app: FastAPI, path: str, reason: str) -> None:
    async def absent() -> None:
        raise ApiError(404, reason)

    app.add_api_route(path, absent, methods=["POST"], include_in_schema=False)


def _add_info_routes(app: FastAPI, task: str, served: Mapping[str, Pipeline],
                     settings: ServeSettings, metrics: ServerMetrics, protect: list,
                     replicas: Any = None, threads: Mapping[str, Any] | None = None,
                     paths: PathFilter | None = None, admission: Admission | None = None
                     ) -> None:
    """``/health``, ``/metrics`` and the page at ``/``. ``threads``: each route's
    :class:`~bertforge.serve.execution.ThreadChoice`, where batches pick their threads;
    ``paths``: what their bodies may show of the model's location (every string of them
    passes it: a replica's failure quotes the loader); ``admission``: the server's, whose
    closing (a shutdown) makes /health say ``draining``."""
    paths = paths or PathFilter((), settings.expose_paths)
    description = {path: paths.describe(p.describe()) for path, p in served.items()}

    @app.get("/health", summary="Readiness and the served model",
             description="200 while the server can answer; 503 (same body, ready: false) "
                         "when every model replica is gone (status down) or the server is "
                         "shutting down (status draining), so that a load balancer stops "
                         "sending requests here.")
    async def health() -> JSONResponse:
        body = {"status": "ok", "ready": True, "task": task,
                "endpoints": {path: {"task": served[path].task,
                                     "form": get_task(served[path].task).serving.form,
                                     "model": description[path]}
                              for path in served},
                "limits": settings.limits(),
                "auth": settings.api_key is not None,
                **({"model_threads": {path: {"counts": list(choice.counts),
                                             "preferred": choice.preferred()}
                                      for path, choice in threads.items()}} if threads else {}),
                **(replicas.health() if replicas is not None else {})}
        if admission is not None and admission.closing:
            # Every request now gets the shutting-down 503: a balancer must route elsewhere.
            body.update(status="draining", ready=False)
        return JSONResponse(paths.public(body), status_code=200 if body["ready"] else 503)

    @app.get("/metrics", summary="Prometheus metrics", dependencies=protect,
             response_class=Response)
    async def prometheus() -> Response:
        return Response(paths.hide(metrics.exposition().decode()), media_type=CONTENT_TYPE)

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_html(app.openapi()))

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE_HTML)


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


def _add_task_route(app: FastAPI, path: str, pipeline: Pipeline, batcher: DynamicBatcher,
                    settings: ServeSettings, protect: list, openai: Any = None) -> None:
    """Register ``POST path`` answering items parsed by ``pipeline`` through ``batcher``; with
    ``openai`` (``/v1/embeddings``), a body with OpenAI's ``input`` field is answered by it."""

    async def answer(body: Any) -> Any:
        if openai is not None and isinstance(body, dict) and "input" in body:
            return await openai(body)
        items, batched = body_items(body, settings)
        answers, _ = await answer_items(pipeline, batcher, items, settings, batched, route=path)
        return {"outputs": answers} if batched else answers[0]

    async def predict(request: Request) -> Response:
        return await answer_request(request, settings, batcher.admission, answer)

    example = pipeline.describe().get("example", {})
    item_schema = {"type": "object", "example": example}
    shapes = [item_schema, {
        "type": "object", "required": ["inputs"],
        "properties": {"inputs": {"type": "array", "items": item_schema, "minItems": 1,
                                  "maxItems": settings.max_batch_items}}}]
    description = ("One item, or {\"inputs\": [items]} (at most "
                   f"{settings.max_batch_items}) answered by {{\"outputs\": [results]}}.")
    if openai is not None:
        shapes.append({"type": "object", "required": ["input"], "properties": {
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {
                "type": "string"}}]},
            "model": {"type": "string"}, "encoding_format": {"enum": ["float", "base64"]},
            "dimensions": {"type": "integer"}, "normalize": {"type": "boolean"},
            "truncate": {"type": "boolean"}}})
        description += (" Or OpenAI's {\"input\": text or [texts], ...} answered by "
                        "{\"object\": \"list\", \"data\": [...], \"usage\": ...}.")
    app.add_api_route(
        path, predict, methods=["POST"], dependencies=protect, summary=f"{pipeline.task}",
        description=description,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"oneOf": shapes}, "example": example}}}},
        responses={code: {"description": what} for code, what in (
            (400, "malformed JSON"), (401, "API key missing or wrong"),
            (408, "request sent too slowly"),
            (413, "body, JSON shape, item count, text or generation over a limit"),
            (422, "invalid item field"),
            (415, "Content-Encoding or Content-Type not supported (send plain JSON)"),
            (500, "internal error (this request only)"),
            (503, "queue full (Retry-After) or shutting down"))})


__all__ = ["EMBEDDINGS_PATH", "ApiError", "ServeSettings", "create_app"]
