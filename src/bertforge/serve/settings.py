"""``ServeSettings``: every limit, timeout and batching budget of the server, in one place.

The command's options (``bertforge serve --max-num-beams ...``) take their defaults from here,
``/health`` reports them, and :mod:`bertforge.serve.limits` and :mod:`bertforge.serve.protocol`
enforce them. Plain data: importing it pulls in neither FastAPI nor uvicorn.
"""

from __future__ import annotations

import dataclasses
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
    max_wait_ms: float = 5.0
    """The most a request waits for others to join its batch; it waits only while more are
    known to be coming (see :mod:`bertforge.serve.batching`), never when it is alone."""
    model_threads: int = 0
    """CPU threads of one forward pass (intra-op) when the model runs in the server process;
    0: ``OMP_NUM_THREADS`` when set, else every core but one (at least 1), which is left to
    HTTP and tokenization (:func:`bertforge.serve.execution.model_threads`), and a PyTorch
    model on 2 or more cores runs each batch with every core instead where its size measured
    faster that way (:class:`bertforge.serve.execution.ThreadChoice`)."""
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
    api_key: str | None = None
    """When set, ``/v1/*`` and ``/metrics`` require it (Bearer or X-API-Key)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("max_") and f.name != "max_wait_ms" and value < 1:
                raise ConfigError(f"{option(f.name)} must be at least 1 (got {value})")
            if f.name.endswith("_timeout") and not value > 0:
                raise ConfigError(f"{option(f.name)} must be > 0 seconds (got {value})")
        if self.max_wait_ms < 0:
            raise ConfigError(f"--max-wait-ms must be >= 0 (got {self.max_wait_ms})")
        if isinstance(self.model_threads, bool) or not isinstance(self.model_threads, int) \
                or self.model_threads < 0:
            raise ConfigError(f"--model-threads must be a whole number >= 0, 0 for automatic "
                              f"(got {self.model_threads!r})")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key is empty; pass a non-empty key or leave it unset")

    def limits(self) -> dict[str, float]:
        """Every setting but the API key, for ``/health``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "api_key"}


def option(name: str) -> str:
    """The command-line flag of a setting: ``max_num_beams`` -> ``--max-num-beams``."""
    return "--" + name.replace("_", "-")


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(ServeSettings) if f.name != "api_key")
"""The settings ``serve()`` takes as keyword arguments (the API key has its own handling)."""

__all__ = ["SETTING_NAMES", "ServeSettings", "option"]
