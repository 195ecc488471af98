"""``ServeSettings``: every limit, timeout and batching budget of the server, in one place.

The command's options (``bertforge serve --max-num-beams ...``) take their defaults from here,
``/health`` reports them, and :mod:`bertforge.serve.limits` and :mod:`bertforge.serve.protocol`
enforce them. Plain data: importing it pulls in neither FastAPI nor uvicorn.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from bertforge.errors import ConfigError


@dataclass(frozen=True)
class ServeSettings:
    """The server's limits and batching budget (the pipeline holds the model's own settings).

    Requests over a size limit are answered 413, a client too slow to send its request 408;
    both name the option to change."""

    max_batch_tokens: int = 8192
    """Token budget of one model call: the sum of its items' tokens when the model runs a
    batch on its real tokens only (the PyTorch pipelines), else its rows times its longest row
    (a padded batch, as ONNX runs it)."""
    max_batch_items: int = 32
    """Items per model call, and the most items one ``{"inputs": [...]}`` request may hold."""
    max_queue: int = 0
    """Request items the server holds at once: admitted and not answered yet (being tokenized,
    queued or in a model call). A request that does not fit is answered 503 with Retry-After at
    once, before its text is tokenized. 0: automatic, ``max_batch_tokens // 16`` (512 at the
    default budget: one token budget's worth of 16-token sentences), at least
    ``max_batch_items``."""
    max_wait_ms: float = 5.0
    """The most a request waits for others to join its batch; it waits only while more are
    known to be coming (see :mod:`bertforge.serve.batching`), never when it is alone."""
    model_threads: int = 0
    """CPU threads of one forward pass (intra-op) when the model runs in the server process;
    0: ``OMP_NUM_THREADS`` when set, else every core but one (at least 1), which is left to
    HTTP and tokenization (:func:`bertforge.serve.execution.model_threads`), and a PyTorch
    model on 2 or more cores runs each batch with every core instead where its size measured
    faster that way (:class:`bertforge.serve.execution.ThreadChoice`). With CPU replicas:
    each replica's threads; 0: one per core of its own share of the cores, which it is pinned
    to (:class:`bertforge.serve.replica_pool.ReplicaPool`)."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted, with or without Content-Length (413 beyond)."""
    max_text_chars: int = 100_000
    """Longest string accepted in any item field (413 beyond); token limits are the pipeline's."""
    max_json_depth: int = 32
    """Deepest nesting of arrays and objects in a request body (413 beyond)."""
    max_number_digits: int = 100
    """Longest number, in characters, in a request body (413 beyond)."""
    max_num_beams: int = 8
    """Summarization: most beams a request (or the model's default) may search with."""
    max_generation_length: int = 1024
    """Summarization: longest output, in tokens, a request may ask for (its max_length, or the
    model's generation_config.json)."""
    max_generation_tokens: int = 65536
    """Summarization: num_beams x output length, summed over the items of one request: the
    decoding work one request may ask for."""
    header_timeout: float = 10.0
    """Seconds a client has, from its first byte (or from connecting), to send a request's
    headers; the connection is then closed (with a 408 when part of a request came)."""
    body_timeout: float = 30.0
    """Seconds a client has to send a request's body once its headers came (408 beyond)."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle keep-alive connection stays open between requests."""
    drain_timeout: float = 20.0
    """On SIGTERM: seconds the server keeps answering the requests it has already admitted
    (new ones get a 503); whatever is still unanswered then gets a 503 and the server exits.
    Under Kubernetes' default grace period of 30 s, with time left to stop."""
    replica_timeout: float = 0.0
    """Replicas only: seconds a replica has to answer one batch before it is killed (its
    requests get a 503) and restarted; 0: automatic, from the batches answered so far
    (:meth:`bertforge.serve.replicas.ReplicaPool.deadline`)."""
    replica_restarts: int = 5
    """Replicas only: how many times each replica that died or missed its deadline is
    restarted (after 1, 2, 4 ... s, at most a minute) before it is left down; 0: never."""
    expose_paths: bool = False
    """Show the model directory's path in ``/info`` and ``/health`` (otherwise only its name:
    clients without the API key read both)."""
    api_key: str | None = None
    """When set, ``/v1/*`` and ``/metrics`` require it (Bearer or X-API-Key)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                # inf would disable the limit or the timeout (a drain that never ends), nan every
                # comparison with it: neither is a setting anyone means
                raise ConfigError(f"{option(f.name)} must be a finite number (got {value}); for "
                                  "a very long wait or a very large limit give a large number")
            if f.name.startswith("max_") and f.name not in ("max_wait_ms", "max_queue") \
                    and value < 1:
                raise ConfigError(f"{option(f.name)} must be at least 1 (got {value})")
            if f.name.endswith("_timeout") and not value > 0 and f.name != "replica_timeout":
                raise ConfigError(f"{option(f.name)} must be > 0 seconds (got {value})")
        if not self.replica_timeout >= 0:
            raise ConfigError(f"--replica-timeout must be >= 0 seconds, 0 for automatic (got "
                              f"{self.replica_timeout})")
        if isinstance(self.replica_restarts, bool) or not isinstance(self.replica_restarts, int) \
                or self.replica_restarts < 0:
            raise ConfigError(f"--replica-restarts must be a whole number >= 0 (got "
                              f"{self.replica_restarts!r})")
        if isinstance(self.max_queue, bool) or not isinstance(self.max_queue, int) \
                or self.max_queue < 0 or 0 < self.max_queue < self.max_batch_items:
            raise ConfigError(f"--max-queue must be 0 (automatic) or a whole number at least "
                              f"--max-batch-items ({self.max_batch_items}), so that a request "
                              f"of that many items fits (got {self.max_queue!r})")
        if self.max_wait_ms < 0:
            raise ConfigError(f"--max-wait-ms must be >= 0 (got {self.max_wait_ms})")
        if isinstance(self.model_threads, bool) or not isinstance(self.model_threads, int) \
                or self.model_threads < 0:
            raise ConfigError(f"--model-threads must be a whole number >= 0, 0 for automatic "
                              f"(got {self.model_threads!r})")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key is empty; pass a non-empty key or leave it unset")

    @property
    def queue_limit(self) -> int:
        """``max_queue``, or the automatic one when it is 0 (see the field)."""
        return self.max_queue or max(self.max_batch_items, self.max_batch_tokens // 16)

    def limits(self) -> dict[str, float]:
        """Every setting but the API key, for ``/health`` (``max_queue`` as it applies)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "api_key"} | {"max_queue": self.queue_limit}


def option(name: str) -> str:
    """The command-line flag of a setting: ``max_num_beams`` -> ``--max-num-beams``."""
    return "--" + name.replace("_", "-")


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(ServeSettings) if f.name != "api_key")
"""The settings ``serve()`` takes as keyword arguments (the API key has its own handling)."""

__all__ = ["SETTING_NAMES", "ServeSettings", "option"]
