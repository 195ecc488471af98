"""``bertforge serve``: load a model, bind a socket, run the app under uvicorn, stop cleanly.

The socket is bound here rather than by uvicorn so that a busy port is a one-line user error and
``port=0`` picks a free port, printed on the ``listening on`` line (scripts and tests read it).
SIGTERM (and Ctrl-C) start uvicorn's graceful shutdown: the listening socket closes, the app
stops admitting requests (503), the requests it holds are answered until ``--drain-timeout``
and refused with a 503 after it (:class:`bertforge.serve.protocol.DrainingServer`,
:mod:`bertforge.serve.admission`); the command then returns 0. uvicorn re-raises the signal
once it is done, and :func:`raise_on_stop` turns that into an exception we catch instead of a
death by signal. With replicas
(:mod:`bertforge.serve.replicas`) the replica processes are stopped last, once the queue is
drained, whatever ends the server.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from bertforge.errors import ConfigError, UserError
from bertforge.core.signals import Stopped, raise_on_stop
from bertforge.serve.execution import set_model_threads, thread_counts
from bertforge.serve.replicas import ReplicaSpec, load_pipelines, plan_replicas, start_replicas
from bertforge.serve.settings import SETTING_NAMES, ServeSettings
from bertforge.serve.startup_checks import generation_warnings

log = logging.getLogger("bertforge.serve")

API_KEY_ENV = "BERTFORGE_API_KEY"
BACKENDS = ("torch", "onnx", "onnx-int8")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host} cannot be resolved: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another "
                          "--port (or --host)") from None
    sock.listen(2048)
    return sock


def _log_config(level: str) -> dict:
    """uvicorn's logging setup plus the ``bertforge`` logger on the same stderr handler."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["bertforge"] = {"handlers": ["default"], "level": level.upper(),
                                      "propagate": False}
    return config


_load = load_pipelines  # the in-process loader (tests and tools know it by this name)
SHUTDOWN_GRACE_S = 2.0
"""Seconds past the drain timeout uvicorn waits for requests in flight before it cancels them."""


def uvicorn_config(app: Any, settings: ServeSettings, log_level: str = "info", *,
                   configure_logging: bool = True) -> Any:
    """The uvicorn configuration ``serve`` runs ``app`` with: the guarded h11 protocol (header
    timeout, head limit, lingering closes, JSON 4xx; :mod:`bertforge.serve.protocol`), the
    keep-alive timeout, no WebSocket upgrades and no ``server`` header. The app answers or
    refuses what it holds within ``drain_timeout`` of a shutdown; uvicorn cancels whatever is
    still running :data:`SHUTDOWN_GRACE_S` later (a backstop: nothing should be).
    ``configure_logging=False`` leaves the process's logging as it is (an application
    embedding the server configures its own)."""
    import uvicorn

    from bertforge.serve.protocol import guarded_protocol

    return uvicorn.Config(app, http=guarded_protocol(settings.header_timeout,
                                                     settings.body_timeout), ws="none",
                          timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
                          timeout_graceful_shutdown=settings.drain_timeout + SHUTDOWN_GRACE_S,
                          log_config=_log_config(log_level) if configure_logging else None,
                          log_level=log_level, access_log=log_level == "debug",
                          server_header=False)


def serve(model_dir: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8000,
          task: str | None = None, backend: str = "torch", api_key: str | None = None,
          truncation: str | None = None, device: str = "auto", embeddings: bool = True,
          log_level: str = "info", replicas: int | str | None = None, precision: str = "auto",
          **limits: Any) -> int:
    """Serve the model in ``model_dir`` over HTTP until SIGTERM or Ctrl-C; returns the exit code.

    Options (CLI flag = the name with dashes):

    * ``host`` (127.0.0.1): the address to listen on; the default is reachable only from this
      machine. Use 0.0.0.0 to accept other machines (then set an API key).
    * ``port`` (8000): the TCP port; 0 picks a free one (printed on the ``listening on`` line).
    * ``task`` (from the model's config.json): question-answering, text-classification,
      token-classification, fill-mask, summarization or feature-extraction; the endpoint is
      ``POST /v1/<task>`` (``/v1/embeddings`` for feature-extraction).
    * ``backend`` (torch): ``torch`` runs the PyTorch model; ``onnx`` runs ``model.onnx`` and
      ``onnx-int8`` runs ``model.int8.onnx`` of a ``bertforge export onnx`` directory with
      onnxruntime (``/v1/embeddings`` then answers a JSON 404: the export holds the task's head
      only).
    * ``api_key`` (env BERTFORGE_API_KEY, else none): when set, ``/v1/*`` and ``/metrics`` answer
      401 without ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``; ``/health``, ``/``,
      ``/docs`` and ``/openapi.json`` stay open.
    * ``truncation`` (the pipeline's default: ``error`` for classification, tagging and
      embeddings): ``error`` answers 422 for an input over the model's maximum length,
      ``truncate`` cuts it and says so in the result, ``chunk`` (embeddings and
      classification, ``/v1/embeddings`` included) splits it into overlapping windows whose
      results are averaged and says ``"chunks": N`` (a request's ``"truncate": true`` still
      cuts); question answering always splits long contexts into windows, summarization cuts
      the article to the model's positions (neither takes ``chunk``).
    * ``device`` (auto): ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``. With
      an ONNX backend it picks onnxruntime's execution provider: ``cuda`` needs the
      ``onnxruntime-gpu`` wheel (a one-line error otherwise), ``auto`` uses CUDA when both torch
      and onnxruntime can; ``/health`` shows the device the session really runs on. A comma
      list (``cuda:0,cuda:1``) serves one replica per device.
    * ``replicas`` (one per ``device`` listed, so 1): model copies in worker processes behind the
      one port and queue (:func:`bertforge.serve.replicas.plan_replicas`): N, or ``auto`` (one
      per visible GPU; 1 on a CPU). With 1 the model runs in this process, as without the option.
    * ``precision`` (auto): the torch backend's numerics (``bertforge.runtime.guard``):
      ``auto`` (on a CPU the fastest of bf16 and int8 its units run whose outputs hold the
      quality guard, else fp32; on a GPU bf16 where supported), ``fp32``, ``bf16``, ``int8``
      (CPU) or ``fp16``; ``/health`` shows the choice and its reason. ONNX backends run their
      export as it is (fp32 or int8) and accept only ``auto`` and ``fp32``.
    * ``embeddings`` (true): also serve ``/v1/embeddings`` from the model's encoder (torch
      backend; loads the weights a second time, as a feature-extraction pipeline).
    * ``log_level`` (info): critical, error, warning, info or debug; internal errors are logged
      with their traceback at error level.
    * ``limits``: the batching budget, size limits and timeouts, the replicas' deadline and
      restarts, what clients may see of paths, each a field of
      :class:`~bertforge.serve.settings.ServeSettings` (``max_batch_tokens``,
      ``max_body_bytes``, ``max_num_beams``, ``header_timeout``, ``replica_timeout``,
      ``replica_restarts``, ``expose_paths``, ...), which documents them and their defaults.
      A summarization model whose saved generation settings exceed these limits is reported
      at start-up, one warning line per setting.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    if backend != "torch" and precision not in ("auto", "fp32"):
        raise ConfigError(f"--precision {precision}: the {backend} backend runs its export as "
                          "it is; use --backend torch for another precision")
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)} (got "
                          f"{log_level!r})")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535 (got {port})")
    unknown = sorted(set(limits) - set(SETTING_NAMES))
    if unknown:
        raise TypeError(f"serve() got unknown settings {', '.join(unknown)}")
    settings = ServeSettings(**limits, api_key=api_key if api_key is not None
                             else os.environ.get(API_KEY_ENV) or None)
    try:  # the serve extra, checked before any loading
        import uvicorn  # noqa: F401

        import bertforge.serve.app  # noqa: F401
    except ImportError as exc:
        raise UserError(f"bertforge serve needs {exc.name}: pip install 'bertforge[serve]'"
                        ) from None
    model_dir = Path(model_dir)
    devices = plan_replicas(replicas, device)
    pool, counts = None, None
    with raise_on_stop((signal.SIGTERM,)):
        if devices is None:  # the model in this process: its threads leave a core to HTTP,
            # or, when automatic, each batch takes the count it measures fastest with
            counts = thread_counts(settings.model_threads)
            settings = dataclasses.replace(settings,
                                           model_threads=set_model_threads(settings.model_threads))
            pipeline, extractor = _load(model_dir, task, backend, device, truncation, embeddings,
                                        settings.model_threads, precision=precision)
        else:
            spec = ReplicaSpec(str(model_dir), task, backend, truncation, embeddings, precision)
            pool, pipeline, extractor = start_replicas(model_dir, spec, devices, settings)
    try:
        return _run(model_dir, pipeline, extractor, settings, backend, embeddings, host, port,
                    log_level, pool, counts)
    finally:
        if pool is not None:
            pool.close()


def _run(model_dir: Path, pipeline: Any, extractor: Any, settings: ServeSettings, backend: str,
         embeddings: bool, host: str, port: int, log_level: str, pool: Any,
         counts: tuple[int, int] | None) -> int:
    """Bind, build the app and serve it until stopped; the exit code. ``counts``: the thread
    counts each batch picks between (automatic threads), else None."""
    from bertforge.serve.app import EMBEDDINGS_PATH, create_app
    from bertforge.serve.protocol import DrainingServer

    unavailable = {}
    if embeddings and extractor is None and pipeline.task != "feature-extraction":
        unavailable[EMBEDDINGS_PATH] = (
            f"embeddings are not served with the {backend} backend (an ONNX export holds the "
            "task's head only); serve the PyTorch model directory with --backend torch for "
            f"{EMBEDDINGS_PATH}")
    for line in generation_warnings(pipeline, settings):
        log.warning("%s", line)
    sock = _bind(host, port)
    app = create_app(pipeline, settings, embeddings=extractor, unavailable=unavailable,
                     replicas=pool, thread_counts=counts)
    server = DrainingServer(uvicorn_config(app, settings, log_level))
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    copies = f", {pool.size} replicas on {','.join(pool.devices)}" if pool is not None else ""
    print(f"bertforge serve: listening on http://{shown}:{bound_port} ({pipeline.task}, "
          f"{model_dir}{copies})", file=sys.stderr, flush=True)
    try:
        with raise_on_stop((signal.SIGTERM,)):
            server.run(sockets=[sock])
    except (Stopped, KeyboardInterrupt):
        pass  # uvicorn re-raises the signal after its graceful shutdown: a clean stop
    finally:
        sock.close()
    return 0 if server.started else 1


__all__ = ["API_KEY_ENV", "serve", "uvicorn_config"]
