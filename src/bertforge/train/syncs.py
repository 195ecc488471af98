"""Counting host-device synchronisations: the operations that make the CPU wait for the GPU.

A training step should queue its kernels and move on; each op whose *result size or value the
host must read* stalls it until the GPU has caught up. :class:`SyncCounter` counts those ops as
they are dispatched, on any device (on a CPU nothing actually waits, which is what makes the
count testable in CI): reading a value (``.item()``, ``bool(t)``, ``int(t)``, Python ``if`` on
a tensor), ops whose output size depends on the data (``nonzero``, boolean-mask indexing and
assignment, ``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``), and
copies from a GPU to the host. On a GPU, :func:`cuda_sync_warnings` cross-checks the count
with CUDA's own sync debug mode.

The documented syncs of a bertforge training step (docs/performance.md): one per optimizer step
(the non-finite guard, ``train.loop.train_step``), and none inside the model and loss on the
unpadded path when the batch comes from the loader (it ships the token layout and the MLM
positions).
"""

from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_ALWAYS = {
    _aten._local_scalar_dense.default: "read a value (.item(), bool(), int())",
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten.equal.default: "torch.equal",
    _aten.is_nonzero.default: "is_nonzero",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique_consecutive",
    _aten.bincount.default: "bincount",
}


def _is_bool(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.bool


def _why(func, args: tuple, kwargs: dict) -> str | None:
    """Why ``func(*args, **kwargs)`` needs the host to wait for the device, or None."""
    if func in _ALWAYS:
        return _ALWAYS[func]
    if func in (_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
                _aten._index_put_impl_.default):
        if any(_is_bool(i) for i in args[1]):
            return "boolean-mask indexing"
    if func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "repeat_interleave without output_size"
    if func in (_aten._to_copy.default, _aten.copy_.default):
        source = args[1] if func is _aten.copy_.default else args[0]
        target = args[0].device if func is _aten.copy_.default else kwargs.get("device")
        if (isinstance(source, torch.Tensor) and source.device.type != "cpu"
                and target is not None and torch.device(target).type == "cpu"):
            return "copy to the host"
    return None


class SyncCounter(TorchDispatchMode):
    """Context manager: ``counts`` maps each reason to how often it happened inside.

    Args:
        device: the device being trained on. On a GPU, ops on CPU tensors never wait for it.
        host_tensors: tensors that live on the host by design even when ``device`` is a CPU
            (an optimizer's step counters, the batch's ``HOST_KEYS``): reading them is free on
            a GPU, so they are not counted on a CPU either.
    """

    def __init__(self, device: torch.device | str = "cpu",
                 host_tensors: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.device = torch.device(device)
        self._host = {id(t) for t in host_tensors}
        self.counts: Counter[str] = Counter()
        self._paused = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing in the body (work that is not the step's: a data loader's)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def exempt(self, host_tensors: Iterable[torch.Tensor]) -> None:
        """Add tensors that live on the host by design (as ``host_tensors`` above), e.g. those
        of a batch that arrives while the counter runs."""
        self._host.update(id(t) for t in host_tensors)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _on_host(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and (
            id(t) in self._host or (self.device.type != "cpu" and t.device.type == "cpu"))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _why(func, args, kwargs)
        if why is not None and not self._paused and not (args and self._on_host(args[0])):
            self.counts[why] += 1
        return func(*args, **kwargs)


def host_resident(optimizer: torch.optim.Optimizer | None,
                  batches: Iterable[dict]) -> list[torch.Tensor]:
    """The tensors of a training step that stay on the host by design: the optimizer's step
    counters (as in torch's own optimizers unless ``capturable``) and the batches' ``HOST_KEYS``."""
    from bertforge.data.batch import HOST_KEYS

    out = [b[k] for b in batches for k in HOST_KEYS if k in b]
    for state in (optimizer.state.values() if optimizer is not None else ()):
        step = state.get("step")
        if isinstance(step, torch.Tensor) and step.device.type == "cpu":
            out.append(step)
    return out


@contextmanager
def cuda_sync_warnings() -> Iterator[list]:
    """CUDA's sync debug mode for the body: yields the list of warnings it raised (one per
    synchronising call). CUDA only."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(previous)


__all__ = ["SyncCounter", "cuda_sync_warnings", "host_resident"]
