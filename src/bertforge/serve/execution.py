"""How the server runs its model: how many CPU threads a forward pass takes, and which
batches run on their real tokens only.

**Threads.** A forward pass of a small encoder does not scale across cores the way training steps do, and on
a small machine the server's other work (the event loop's HTTP, the tokenizer thread) needs a
core too: when torch's intra-op threads take every core, each parallel region of a pass waits
for the thread the event loop displaced, and a pass can take ten times as long (measured on 2
shared cores: docs/serving.md). :func:`model_threads` therefore leaves one core free unless told
otherwise. Replicas split the cores among themselves instead (:mod:`bertforge.serve.replicas`).

**Unpadded batches.** The PyTorch pipelines run their encoders on the real tokens of a batch
(``unpad``, set when they load): a batch of questions and paragraphs of 40 to 380 tokens then
costs what its items cost, where a padded one computes every row at the longest width (twice
the work, measured). A lone sequence has no padding to remove, only the gathers and scatters
around every layer: :class:`BatchRunner` runs it padded (about 15% faster for a sentence and
up to a third for a paragraph on the development CPU), so batching costs nothing at batch 1.
Outputs agree to float32 rounding either way.

**Padded batches on a CPU.** Other backends (ONNX) pad every row of a batch to its longest; on
a CPU a padded token costs what a real one does, so a batch saves only the fixed cost of one
call (:data:`CPU_CALL_TOKENS`). :attr:`BatchRunner.call_overhead_tokens` tells the dynamic
batcher that cost, and the batcher bounds padding with it (``bertforge.serve.batching``;
measured in docs/serving.md).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

CPU_CALL_TOKENS = 16
"""The fixed cost of one padded model call on a CPU, in tokens of its forward pass: MiniLM-L6
under onnxruntime on one core took 4.2 ms for 8 tokens and about 0.21 ms per token beyond
(1-thread measurements on the development CPU, docs/serving.md), so a call costs ~12 tokens
before its first; rounded up, since a bigger value only lets a batch pad a little more."""


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def model_threads(requested: int = 0) -> int:
    """The intra-op threads of a forward pass: ``requested``, else ``OMP_NUM_THREADS`` when it
    is set to a whole number, else every core but one (at least 1)."""
    if requested > 0:
        return requested
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, cores() - 1)


def set_model_threads(requested: int = 0) -> int:
    """Apply :func:`model_threads` to torch in this process and return the count."""
    import torch

    threads = model_threads(requested)
    torch.set_num_threads(threads)
    return threads


def _rows(request: Any) -> int:
    """Padded rows a parsed request takes: its windows (question answering), else one."""
    features = getattr(request, "features", None)
    return int(features.attention_mask.shape[0]) if features is not None else 1


class BatchRunner:
    """Calls ``pipeline`` on a batch of parsed requests; a batch of a single row runs padded
    when the pipeline's encoder runs on real tokens (its ``unpad`` flags), any other batch as
    the pipeline runs it. The callable the dynamic batcher runs, on its one model thread."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        model = getattr(pipeline, "model", None)
        modules = model.modules() if callable(getattr(model, "modules", None)) else ()
        self._unpadded = [m for m in modules if getattr(m, "unpad", False) is True]

    @property
    def unpadded(self) -> bool:
        """Whether batches of several rows run on their real tokens (their cost is the sum of
        their tokens, not rows x the longest row)."""
        return bool(self._unpadded)

    @property
    def call_overhead_tokens(self) -> int | None:
        """The fixed cost of a call in tokens (:data:`CPU_CALL_TOKENS`) when the batches are
        padded, run on a CPU and gain nothing else from batching (not a decoding loop, which
        shares each step's cost); else None: padding is then bounded by the token budget alone
        (a GPU, where a call's fixed cost dwarfs the padding; a replicated route, whose devices
        this process does not see)."""
        # Imported here: the command line imports this module and must not import torch.
        from bertforge.inference.pipelines.base import Pipeline

        pipeline = self.pipeline
        if self.unpadded or not isinstance(pipeline, Pipeline) or pipeline.decodes:
            return None
        return CPU_CALL_TOKENS if pipeline.device.type == "cpu" else None

    def __call__(self, requests: Sequence[Any]) -> list[Any]:
        if self._unpadded:
            several = len(requests) > 1 or _rows(requests[0]) > 1
            for module in self._unpadded:
                module.unpad = several
        return self.pipeline(requests)


__all__ = ["BatchRunner", "CPU_CALL_TOKENS", "cores", "model_threads", "set_model_threads"]
