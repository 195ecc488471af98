"""Linear layers whose CPU inference runs the activation inside the matrix product.

``torch.nn.Linear`` on a CPU computes ``addmm`` (the bias copied into every output row, then the
product added to it), and an activation that follows is one more pass over the output. oneDNN,
which PyTorch's CPU matrix products use, can apply the bias and GELU/ReLU as post-operations of
the product itself (``torch.ops.mkldnn._linear_pointwise``, the operator ``torch.compile`` emits
for the same pattern on CPUs). Measured on one core of the Xeon VM at a MiniLM evaluation batch
(3,600 tokens, fp32, medians of 77 interleaved calls): 384 -> 1,536 + GELU 34.6 ms against 54.3
ms. Without an activation the two are equal (8.3 against 8.5 ms at 384 -> 384, 30.7 against
30.9 at 1,536 -> 384), so only layers with an activation take the fused path. The results are
the same to float rounding.

:class:`Linear` takes that path only where nothing else can notice: a CPU tensor in fp32, no
autograd (evaluation, prediction, serving), no autocast, not while ``torch.compile``,
``torch.export`` or the TorchScript exporter trace the model, and a PyTorch built with oneDNN.
Everywhere else it is ``nn.Linear`` followed by the activation. Parameter names and the state
dict are ``nn.Linear``'s.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"gelu": (F.gelu, ("gelu", "none")),
               "gelu_new": (lambda x: F.gelu(x, approximate="tanh"), ("gelu", "tanh")),
               "relu": (F.relu, ("relu", ""))}
"""Activation name -> (the function, oneDNN's post-op name and its algorithm argument)."""


@functools.lru_cache(maxsize=None)
def _fused_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w = torch.ones(2, 4), torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 4)
        with torch.no_grad():
            out = torch.ops.mkldnn._linear_pointwise(x, w, torch.zeros(3), "relu", [], "")
        return bool(torch.equal(out, torch.tensor([[4.0, 0.0, 2.0]] * 2)))
    except (AttributeError, RuntimeError):  # an operator this build lacks or refuses
        return False


def _fused_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
            and not torch.jit.is_scripting() and _fused_available())


class Linear(nn.Linear):
    """``nn.Linear`` with an optional activation applied to its output (``forward(x, act)``),
    fused with the bias into oneDNN's matrix product in CPU inference (see the module
    docstring)."""

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        """(..., in_features) -> (..., out_features), then ``activation`` (``ACTIVATIONS``)."""
        if activation is not None and _fused_ok(x, self.weight):
            name, algorithm = ACTIVATIONS[activation][1]
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, name, [],
                                                      algorithm)
        out = F.linear(x, self.weight, self.bias)
        return out if activation is None else ACTIVATIONS[activation][0](out)


__all__ = ["ACTIVATIONS", "Linear"]
