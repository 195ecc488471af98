"""Replicas: one server, several copies of the model, one queue.

``bertforge serve --replicas N`` (or ``--device cuda:0,cuda:1``) starts one worker process per
model copy, each loading its own pipeline (on its own GPU, or pinned to a share of the CPU
cores: :func:`~bertforge.runtime.cpu.split_cores`), behind the single port and the single
dynamic batcher of the main process. The main process still parses and tokenizes every
request (with a pipeline whose model is a weightless stand-in: config
and tokenizer only), forms the batches, and sends each to a free replica over a pipe; the replica
runs it and sends the results back. Processes rather than threads: PyTorch holds the GIL in
parts of every forward pass, and a CUDA context must not be shared across a fork, hence the
``spawn`` start method.

What the server relies on:

* Same answers: the requests a replica runs are the ones the main process parsed, run by the
  same pipeline code a single-process server calls.
* No hang, no lost replica: a replica that dies or misses a batch's deadline fails that batch
  with a JSON 503 and is restarted with back-off, a bounded number of times, while the others
  keep serving (:mod:`bertforge.serve.replica_pool`, which also says how replicas stop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from bertforge.core.numbers import whole_number
from bertforge.errors import ConfigError
from bertforge.runtime.cpu import core_ids, split_cores
from bertforge.serve.replica_pool import ReplicaDied, ReplicaPool
from bertforge.serve.replica_worker import ReplicaSpec, load_pipelines
from bertforge.serve.settings import ServeSettings


# ---------------------------------------------------------------------------- planning


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _count(replicas: int | str | None) -> int | str | None:
    """``replicas`` as a count >= 1, "auto", or None as given."""
    if replicas is None:
        return None
    return whole_number(replicas, "--replicas", minimum=1, words=("auto",))


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
    i-th of those devices in turn (several replicas may share a GPU; CPU replicas split the
    cores, each pinned to its own share: :class:`ReplicaPool`). More CPU replicas than cores
    is a ConfigError here, before anything loads.
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
    planned = [devices[i % len(devices)] for i in range(count)]
    split_cores(core_ids(), max(1, planned.count("cpu")))  # the error, if too few cores
    return planned


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
        # The batch's tokens set its deadline (ReplicaPool.deadline).
        return self.pool.run(self.kind, requests, sum(self.parser.cost(r) for r in requests))

    __call__ = run

    def __getattr__(self, name: str) -> Any:
        if name == "parser":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.parser, name)


def start_replicas(model_dir: Path, spec: ReplicaSpec, devices: Sequence[str],
                   settings: ServeSettings = ServeSettings()
                   ) -> tuple[ReplicaPool, ReplicaPipeline, ReplicaPipeline | None]:
    """Check the model and options here (parse-only pipelines), then start the replicas (with
    the deadline and restarts of ``settings``); the pool and the pipelines to serve (the second
    None without embeddings). On any failure, SIGTERM included, the replicas already started
    are stopped."""
    parser, extractor = load_parsers(model_dir, spec.task, spec.backend, spec.truncation,
                                     spec.embeddings)
    pool = ReplicaPool(spec, devices, timeout=settings.replica_timeout,
                       restarts=settings.replica_restarts, threads=settings.model_threads)
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
