"""The replica process of a replicated server (:mod:`bertforge.serve.replicas` starts and
drives it): load the pipelines, say ready, then run each batch received and send back its results
or its error, until told to stop or until the server process is gone.

Kept apart from the pool so that a spawned replica imports little before it loads the model.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bertforge.core.signals import ignore_stop_signals
from bertforge.errors import UserError

PARENT_POLL_S = 0.5  # how often a replica checks that the server process is still there


def load_pipelines(model_dir: Path, task: str | None, backend: str, device: str,
                   truncation: str | None, embeddings: bool,
                   threads: int | None = None, precision: str = "auto") -> tuple[Any, Any]:
    """The task pipeline and, unless it already is one, a feature-extraction pipeline for
    ``/v1/embeddings`` (``None`` when ``embeddings`` is false or the backend is ONNX).
    ``threads``: onnxruntime's intra-op threads (None: its default, every core); ``precision``:
    the torch backend's (``load_pipeline``'s)."""
    from bertforge.inference.pipelines import load_pipeline

    options: dict = {"device": device, "truncation": truncation, "precision": precision}
    if backend != "torch":
        from bertforge.export.runtime import OnnxModel

        # The device picks onnxruntime's providers; the pipeline then reports (and feeds) the
        # device the session really runs on, the CPU if onnxruntime dropped CUDA.
        options["backend"] = OnnxModel(model_dir, quantized=backend == "onnx-int8", device=device,
                                       threads=threads)
    pipeline = load_pipeline(model_dir, task, **options)
    if not embeddings or pipeline.task == "feature-extraction" or backend != "torch":
        return pipeline, None
    return pipeline, load_pipeline(model_dir, "feature-extraction", **options)


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica loads: the ``serve`` options that shape its pipelines."""

    model_dir: str
    task: str | None
    backend: str
    truncation: str | None
    embeddings: bool
    precision: str = "auto"


def _exit_with_parent(parent_pid: int) -> None:
    """End this process soon after the server process is gone (even by SIGKILL): an orphan is
    adopted by another process, so ``getppid()`` changes."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _error_reply(exc: Exception) -> tuple:
    """The reply for a batch that raised ``exc`` (in the ``except`` block): the exception
    itself when it survives pickling (an ``InputError`` does whole, template and all, so the
    server can still put its client's names in), else a RuntimeError naming its type; with
    its traceback."""
    text = traceback.format_exc()
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    return ("error", exc, text)


def _send(conn: Connection, reply: tuple) -> None:
    """Send a reply; results that cannot be pickled become an error reply."""
    try:
        conn.send(reply)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        conn.send(("error", RuntimeError(f"the replica could not send its answer: {exc}"),
                   traceback.format_exc()))


def _answer(conn: Connection, pipelines: dict[str, Any]) -> None:
    """Run each batch received until told to stop (None) or the server is gone."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        kind, requests = message
        try:
            reply: tuple = ("ok", pipelines[kind](requests))
        except Exception as exc:
            reply = _error_reply(exc)
        try:
            _send(conn, reply)
        except OSError:
            return


def take_cores(cores: list[int] | None, threads: int | None) -> None:
    """A CPU replica's start: pin this process to ``cores`` (its share; None: not pinned) and
    run ``threads`` intra-op threads (torch's; ``OMP_NUM_THREADS`` for every OpenMP library
    loaded later), before any pool of threads exists, so that the pools start on those cores.
    Tokenizers' threads stay off: the server process tokenizes."""
    from bertforge.runtime.cpu import use_cores

    if threads is not None:  # before torch loads OpenMP
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    use_cores(cores, threads)


def replica_main(spec: ReplicaSpec, device: str, cores: list[int] | None, threads: int | None,
                 conn: Connection, parent_pid: int) -> None:
    """A replica process: take its cores (CPU replicas), load the pipelines, say ready (with
    their descriptions), answer."""
    ignore_stop_signals()  # the server process decides when replicas stop
    _exit_with_parent(parent_pid)
    try:
        take_cores(cores, threads)
        import torch

        if device.startswith("cuda:"):  # no stray context (and memory) on GPU 0 from any replica
            torch.cuda.set_device(torch.device(device))
        pipeline, extractor = load_pipelines(Path(spec.model_dir), spec.task, spec.backend,
                                             device, spec.truncation, spec.embeddings,
                                             threads, precision=spec.precision)
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0]
        conn.send(("failed", first if isinstance(exc, UserError) else
                   f"{type(exc).__name__}: {first}"))
        return
    from bertforge.serve.execution import BatchRunner

    pipelines = {"task": pipeline, "embeddings": extractor}
    conn.send(("ready", {kind: p.describe() for kind, p in pipelines.items() if p is not None}))
    _answer(conn, {kind: BatchRunner(p) for kind, p in pipelines.items() if p is not None})


__all__ = ["ReplicaSpec", "load_pipelines", "replica_main", "take_cores"]
