"""Replicas: one server, several copies of the model, one queue.

``bertforge serve --replicas N`` (or ``--device cuda:0,cuda:1``) starts one worker process per
model copy, each loading its own pipeline (on its own GPU, or on a share of the CPU cores), behind
the single port and the single dynamic batcher of the main process. The main process still
parses and tokenizes every request (with a pipeline whose model is a weightless stand-in: config
and tokenizer only), forms the batches, and sends each to a free replica over a pipe; the replica
runs it and sends the results back. Processes rather than threads: PyTorch holds the GIL in
parts of every forward pass, and a CUDA context must not be shared across a fork, hence the
``spawn`` start method.

What the server relies on:

* Same answers: the requests a replica runs are the ones the main process parsed, run by the
  same pipeline code a single-process server calls.
* A replica that dies (killed, out of memory, a crash in native code) fails the batch it held
  with :class:`ReplicaDied` (a JSON 503), never a hang: the pool waits on the pipe and on the
  process's sentinel together. The replica is reported in ``/health`` and ``/metrics`` and not
  used again; the others keep serving. Its requests are not retried elsewhere, so a request that
  crashes a replica cannot crash the others in turn.
* Replicas ignore SIGINT and SIGTERM: the main process decides when to stop, drains its queue
  (which needs them), then :meth:`ReplicaPool.close` tells each to exit and kills stragglers.
  A replica also exits within a second of the main process's death however it ended (it polls
  its parent), so no replica outlives the server.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Sequence

from bertforge.errors import ConfigError, UserError
from bertforge.serve.batching import BatchLost
from bertforge.serve.execution import cores as _cores
from bertforge.serve.replica_worker import ReplicaSpec, load_pipelines, replica_main

log = logging.getLogger("bertforge.serve")

STOP_GRACE_S = 10.0  # how long close() waits for replicas to exit before killing them


class ReplicaDied(BatchLost):
    """The replica running a batch ended before answering it (or none is left)."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a replica, attached as its ``__cause__`` so the
    server log shows where in the replica it happened."""

    def __init__(self, text: str) -> None:
        super().__init__(f"\n--- in the replica ---\n{text.rstrip()}")


# ---------------------------------------------------------------------------- planning


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _count(replicas: int | str | None) -> int | str | None:
    """``replicas`` as a count >= 1, or None / "auto" as given."""
    if replicas is None or replicas == "auto":
        return replicas
    text = str(replicas).strip()
    if isinstance(replicas, bool) or not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--replicas must be a whole number >= 1 or auto (got {replicas!r})")
    return int(text)


def _expand(name: str) -> list[str]:
    """The devices one ``--device`` entry stands for: every visible GPU for ``cuda`` (and for
    ``auto`` on a GPU machine, the CPU on another), else the entry itself."""
    if name == "auto":
        return [f"cuda:{i}" for i in range(_gpus())] or ["cpu"]
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {name!r} is not a device; use auto, cpu, cuda, cuda:N or a "
                          "comma list such as cuda:0,cuda:1") from None
    if device.type != "cuda":
        return [name]
    gpus = _gpus()
    if gpus == 0:
        raise ConfigError(f"--device {name} was asked for but no CUDA GPU is available; use cpu")
    if device.index is None:
        return [f"cuda:{i}" for i in range(gpus)]
    if device.index >= gpus:
        raise ConfigError(f"--device {name}: this machine has {gpus} CUDA GPU(s), cuda:0 to "
                          f"cuda:{gpus - 1}")
    return [name]


def plan_replicas(replicas: int | str | None, device: str) -> list[str] | None:
    """The device of each replica, or None to serve in this process as always (one copy on one
    device: no worker process at all).

    ``device`` is one device or a comma list (``cuda:0,cuda:1``). ``replicas``: None gives one
    replica per listed device (so none for a single device); ``auto`` one per listed device, one
    per visible GPU for ``auto``/``cuda``, one on a CPU; N gives N replicas, replica i on the
    i-th of those devices in turn (several replicas may share a GPU; CPU replicas share the
    cores, ``cores // N`` torch threads each).
    """
    names = [name.strip() for name in str(device).split(",")]
    if not all(names):
        raise ConfigError(f"--device {device!r} has an empty entry; give e.g. cuda:0,cuda:1")
    count = _count(replicas)
    if len(names) == 1 and (count is None or count == 1):
        return None
    if isinstance(count, int) and count < len(names):
        raise ConfigError(f"--replicas {count} is fewer than the {len(names)} devices of --device "
                          f"{device}; give --replicas {len(names)} (or auto), or fewer devices")
    devices = [d for name in names for d in _expand(name)]
    if count in (None, "auto"):
        count = len(devices)
    if count == 1:
        return None
    return [devices[i % len(devices)] for i in range(count)]


# ---------------------------------------------------------------------------- parse-only loading


class _NoWeights:
    """The model of a parse-only pipeline (the main process of a replicated server): what
    ``parse`` reads of a model (its config and generation settings), never the weights."""

    device = "cpu"

    def __init__(self, model_dir: Path) -> None:
        from bertforge.models.generation import GENERATION_CONFIG_NAME, GenerationConfig
        from bertforge.models.loading import model_directory, open_model

        directory = model_directory(model_dir)
        self.source = open_model(directory)
        self.config = self.source.config
        saved = directory / GENERATION_CONFIG_NAME
        self.generation_config = GenerationConfig.load(saved) if saved.is_file() else None

    def __call__(self, **inputs: Any) -> Any:
        raise RuntimeError("this pipeline only parses requests; the replicas run the model")


def load_parsers(model_dir: Path, task: str | None, backend: str, truncation: str | None,
                 embeddings: bool) -> tuple[Any, Any]:
    """:func:`load_pipelines`'s pipelines without weights, for parsing in the main process (the
    model directory, task and options are checked here, before any replica starts)."""
    from bertforge.inference.pipelines import load_pipeline

    stand_in = _NoWeights(model_dir)
    parser = load_pipeline(model_dir, task, backend=stand_in, truncation=truncation)
    if not embeddings or parser.task == "feature-extraction" or backend != "torch":
        return parser, None
    return parser, load_pipeline(model_dir, "feature-extraction", backend=stand_in,
                                 truncation=truncation)


# ---------------------------------------------------------------------------- the pool


class _Replica:
    """The main process's handle on one replica, with its counts for /health and /metrics."""

    def __init__(self, index: int, device: str, process: Any, conn: Connection) -> None:
        self.index, self.device, self.process, self.conn = index, device, process, conn
        self.state = "starting"  # then idle <-> busy, and dead once its process ended
        self.exit_code: int | None = None
        self.batches = self.items = self.errors = 0
        self.busy_seconds = 0.0
        self.turn = -1  # when it last took a batch (a count of batches sent)

    def row(self) -> dict[str, Any]:
        return {"replica": self.index, "device": self.device, "pid": self.process.pid,
                "state": self.state, "exit_code": self.exit_code, "batches": self.batches,
                "items": self.items, "busy_seconds": round(self.busy_seconds, 6),
                "errors": self.errors}


class ReplicaPool:
    """Replica processes of one model; :meth:`run` sends a batch to the free one that has waited
    longest, so the work spreads over all of them even under light load (thread-safe: the
    batcher calls it from one thread per replica)."""

    def __init__(self, spec: ReplicaSpec, devices: Sequence[str]) -> None:
        self.spec, self.devices = spec, list(devices)
        self.descriptions: dict[str, dict] = {}  # describe() of replica 0's pipelines
        self._replicas: list[_Replica] = []
        self._changed = threading.Condition()
        self._closed = False
        self._turns = 0

    @property
    def size(self) -> int:
        return len(self.devices)

    def start(self) -> None:
        """Start every replica (they load in parallel) and wait until each is ready; a replica
        that fails to load is a one-line ``UserError`` (call :meth:`close` in any case)."""
        context = multiprocessing.get_context("spawn")
        on_cpu = sum(device == "cpu" for device in self.devices)
        threads = max(1, _cores() // on_cpu) if on_cpu else None
        for index, device in enumerate(self.devices):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=replica_main, name=f"bertforge-replica-{index}", daemon=True,
                args=(self.spec, device, threads if device == "cpu" else None, theirs,
                      os.getpid()))
            process.start()
            theirs.close()
            self._replicas.append(_Replica(index, device, process, mine))
        for replica in self._replicas:
            self._await_ready(replica)

    def _await_ready(self, replica: _Replica) -> None:
        message = None
        if replica.conn in wait([replica.conn, replica.process.sentinel]):
            try:
                message = replica.conn.recv()
            except (EOFError, OSError):
                pass
        if message is None or message[0] != "ready":
            replica.process.join(5.0)
            why = message[1] if message is not None else (
                f"its process ended (exit code {replica.process.exitcode}) while loading the "
                "model; the log above may say why")
            raise UserError(f"replica {replica.index} ({replica.device}) did not start: {why}")
        if replica.index == 0:
            self.descriptions = message[1]
        replica.state = "idle"

    def run(self, kind: str, requests: Sequence[Any]) -> list[Any]:
        """The results of ``requests`` run as one batch by the ``kind`` pipeline ("task" or
        "embeddings") of a free replica; blocks while all are busy. Raises what the pipeline
        raised, or :class:`ReplicaDied`."""
        replica = self._acquire()
        started = time.monotonic()
        answered = False
        try:
            reply = self._exchange(replica, (kind, list(requests)))
            if reply[0] == "ok":
                answered = True
                return reply[1]
            cause = RemoteTraceback(reply[2]) if reply[2] else None
            if reply[0] == "input":
                from bertforge.inference.pipelines import InputError

                raise InputError(*reply[1]) from cause
            raise reply[1] from cause
        finally:
            self._release(replica, len(requests), time.monotonic() - started, answered)

    def _acquire(self) -> _Replica:
        with self._changed:
            while True:
                if self._closed:
                    raise ReplicaDied("the server is shutting down; retry on another instance")
                self._reap()
                idle = [r for r in self._replicas if r.state == "idle"]
                if idle:
                    replica = min(idle, key=lambda r: r.turn)  # ties: the lowest index
                    replica.state, replica.turn = "busy", self._turns
                    self._turns += 1
                    return replica
                if all(r.state == "dead" for r in self._replicas):
                    raise ReplicaDied("every replica of this server has stopped (see /health); "
                                      "restart the server")
                self._changed.wait()

    def _exchange(self, replica: _Replica, message: tuple) -> tuple:
        """Send a batch and wait for its answer, or for the replica's death."""
        try:
            replica.conn.send(message)
            if replica.conn in wait([replica.conn, replica.process.sentinel]):
                return replica.conn.recv()
        except (EOFError, OSError):
            pass
        replica.process.join(1.0)
        with self._changed:
            self._bury(replica)
            alive = sum(r.state != "dead" for r in self._replicas)
        return ("error", ReplicaDied(
            f"replica {replica.index} ({replica.device}) stopped (exit code "
            f"{replica.exit_code}) while running this request; {alive} of {self.size} "
            "replicas keep serving: retry"), "")

    def _release(self, replica: _Replica, items: int, seconds: float, answered: bool) -> None:
        with self._changed:
            replica.busy_seconds += seconds
            if answered:
                replica.batches += 1
                replica.items += items
            else:
                replica.errors += 1
            if replica.state == "busy":
                replica.state = "idle"
            self._changed.notify_all()

    def _bury(self, replica: _Replica) -> None:
        """Mark a replica whose process ended as dead (called holding the lock)."""
        if replica.state == "dead":
            return
        replica.state, replica.exit_code = "dead", replica.process.exitcode
        log.error("replica %d (%s, pid %s) stopped with exit code %s; it is not used again",
                  replica.index, replica.device, replica.process.pid, replica.exit_code)
        self._changed.notify_all()

    def _reap(self) -> None:
        """Notice idle replicas whose process ended (busy ones are noticed by their caller)."""
        for replica in self._replicas:
            if replica.state == "idle" and replica.process.exitcode is not None:
                self._bury(replica)

    def snapshot(self) -> list[dict[str, Any]]:
        """One row per replica: replica (its index), device, pid, state (idle, busy, dead), exit code, and the
        batches, items, busy seconds and errors so far."""
        with self._changed:
            self._reap()
            return [replica.row() for replica in self._replicas]

    def health(self) -> dict[str, Any]:
        """What ``/health`` adds: ``status`` ok, degraded (a replica died) or down (all did),
        ``ready`` (any replica alive) and the replicas' rows."""
        rows = self.snapshot()
        alive = sum(row["state"] != "dead" for row in rows)
        status = "ok" if alive == len(rows) else "degraded" if alive else "down"
        return {"status": status, "ready": alive > 0, "replicas": rows}

    def close(self, grace: float = STOP_GRACE_S) -> None:
        """Tell every replica to exit, wait up to ``grace`` seconds, then kill what is left."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        for replica in self._replicas:
            try:
                replica.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for replica in self._replicas:
            replica.process.join(max(0.0, deadline - time.monotonic()))
        for replica in self._replicas:
            if replica.process.is_alive():
                log.warning("replica %d (pid %s) did not exit within %.0f s; killing it",
                            replica.index, replica.process.pid, grace)
                replica.process.kill()
                replica.process.join(5.0)
            replica.conn.close()


class ReplicaPipeline:
    """One route of a replicated server, as the app sees a pipeline: ``parse`` and ``cost``
    (and any other attribute) from the parse-only pipeline of this process, ``describe()`` from
    the replicas' own pipeline, and a call runs the batch on a free replica."""

    def __init__(self, parser: Any, pool: ReplicaPool, kind: str) -> None:
        self.parser, self.pool, self.kind = parser, pool, kind
        self.task = parser.task

    def parse(self, item: Any) -> Any:
        return self.parser.parse(item)

    def cost(self, request: Any) -> int:
        return self.parser.cost(request)

    def describe(self) -> dict:
        described = dict(self.pool.descriptions.get(self.kind) or self.parser.describe())
        described["device"] = ",".join(dict.fromkeys(self.pool.devices))
        described["replicas"] = self.pool.size
        return described

    def run(self, requests: Sequence[Any]) -> list[Any]:
        return self.pool.run(self.kind, requests)

    __call__ = run

    def __getattr__(self, name: str) -> Any:
        if name == "parser":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.parser, name)


def start_replicas(model_dir: Path, spec: ReplicaSpec, devices: Sequence[str]
                   ) -> tuple[ReplicaPool, ReplicaPipeline, ReplicaPipeline | None]:
    """Check the model and options here (parse-only pipelines), then start the replicas; the
    pool and the pipelines to serve (the second None without embeddings). On any failure,
    SIGTERM included, the replicas already started are stopped."""
    parser, extractor = load_parsers(model_dir, spec.task, spec.backend, spec.truncation,
                                     spec.embeddings)
    pool = ReplicaPool(spec, devices)
    try:
        pool.start()
    except BaseException:
        pool.close(grace=2.0)
        raise
    served = ReplicaPipeline(parser, pool, "task")
    return pool, served, (None if extractor is None else
                          ReplicaPipeline(extractor, pool, "embeddings"))


__all__ = ["ReplicaDied", "ReplicaPipeline", "ReplicaPool", "ReplicaSpec", "load_parsers",
           "load_pipelines", "plan_replicas", "start_replicas"]
