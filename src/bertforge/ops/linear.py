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
Pipelines in bf16 take it too: their linear weights are stored in bf16
(:func:`cast_linears`) and they run under CPU autocast to bf16, which
would compute the product in bf16 anyway; fused, the bias and GELU are applied before the one
rounding to bf16 (1,400 tokens, 384 -> 1,536 + GELU: 14.1 ms against 18.9 ms, one core).
Everywhere else it is ``nn.Linear`` followed by the activation. Parameter names and the state
dict are ``nn.Linear``'s.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"gelu": (F.gelu, ("gelu", "none")),
               "gelu_new": (lambda x: F.gelu(x, approximate="tanh"), ("gelu", "tanh")),
               "relu": (F.relu, ("relu", ""))}
"""Activation name -> (the function, oneDNN's post-op name and its algorithm argument)."""


@functools.lru_cache(maxsize=None)
def _fused_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this PyTorch build (and CPU) runs the fused operator in ``dtype``."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w = torch.ones(2, 4, dtype=dtype), torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 4)
        with torch.no_grad():
            out = torch.ops.mkldnn._linear_pointwise(x, w.to(dtype), torch.zeros(3, dtype=dtype),
                                                     "relu", [], "")
        return bool(torch.equal(out.float(), torch.tensor([[4.0, 0.0, 2.0]] * 2)))
    except (AttributeError, RuntimeError):  # an operator this build lacks or refuses
        return False


def _fused_dtype(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.dtype | None:
    """The dtype the fused path computes in here, or None where it does not apply: fp32 without
    autocast, or bf16 weights (:func:`cast_linears`) under CPU autocast
    to bf16, which would compute this layer in bf16 too."""
    if (x.device.type != "cpu" or torch.is_grad_enabled() or torch.compiler.is_compiling()
            or torch.jit.is_tracing() or torch.jit.is_scripting()
            or (bias is not None and bias.dtype != weight.dtype)):
        return None
    autocast = torch.is_autocast_enabled("cpu")
    if weight.dtype == torch.float32 and x.dtype == torch.float32 and not autocast:
        dtype = torch.float32
    elif (weight.dtype == torch.bfloat16 and autocast and x.dtype in (torch.float32, weight.dtype)
          and torch.get_autocast_dtype("cpu") == torch.bfloat16):
        dtype = torch.bfloat16
    else:
        return None
    return dtype if _fused_available(dtype) else None


class Linear(nn.Linear):
    """``nn.Linear`` with an optional activation applied to its output (``forward(x, act)``),
    fused with the bias into oneDNN's matrix product in CPU inference (see the module
    docstring)."""

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        """(..., in_features) -> (..., out_features), then ``activation`` (``ACTIVATIONS``)."""
        dtype = None if activation is None else _fused_dtype(x, self.weight, self.bias)
        if dtype is not None:
            name, algorithm = ACTIVATIONS[activation][1]
            return torch.ops.mkldnn._linear_pointwise(x.to(dtype), self.weight, self.bias, name,
                                                      [], algorithm)
        out = F.linear(x, self.weight, self.bias)
        return out if activation is None else ACTIVATIONS[activation][0](out)


def cast_linears(model: nn.Module, dtype: torch.dtype) -> None:
    """Store the weights and biases of ``model``'s linear layers in ``dtype`` (bf16 / fp16), for
    a model that only ever runs under autocast to ``dtype``. Autocast casts them from fp32 at
    every forward pass; cast once, they round to the same values, so the outputs are the same
    and each pass skips reading every weight in fp32 and writing its copy (on one core, a bf16
    classification pass over 8 question-paragraph pairs took 184 instead of 197 ms, medians of
    32). A parameter another module shares (a decoder tied to the word embeddings) keeps its
    dtype."""
    uses: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            uses[id(param)] = uses.get(id(param), 0) + 1
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        for param in (module.weight, module.bias):
            if param is not None and param.dtype == torch.float32 and uses[id(param)] == 1:
                param.data = param.data.to(dtype)


class Int8Linear(nn.Module):
    """A linear layer of an int8 inference model: weights quantized once, per output channel
    (symmetric, scale = the row's largest magnitude / 127), inputs quantized per call from their
    own range (dynamic quantization), the product in int8 with int32 sums, on VNNI or AMX units
    where the CPU has them (PyTorch's quantized linear operator: fbgemm or oneDNN). The output
    and everything around it (attention, softmax, LayerNorm, residuals) stay fp32. Inference
    only: it has no gradient and no state dict of its own (the model it came from has).

    ``reduce_range``: quantize the inputs to 7 bits, for CPUs without VNNI, whose 8-bit
    multiply-add (AVX2's ``vpmaddubsw``) saturates its 16-bit sums at the full range."""

    def __init__(self, linear: nn.Linear, reduce_range: bool = False) -> None:
        super().__init__()
        self.reduce_range = reduce_range
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127).double()
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        bias = None if linear.bias is None else linear.bias.detach().float()
        with warnings.catch_warnings():
            # PyTorch marks its quantized tensor types deprecated in favour of torchao; the
            # operators they feed are still PyTorch's int8 CPU path (docs/decisions.md)
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        """(..., in_features) -> (..., out_features) fp32, then ``activation``."""
        shape = x.shape
        out = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).float().contiguous(),
                                                 self._packed, self.reduce_range)
        out = out.reshape(*shape[:-1], self.out_features)
        return out if activation is None else ACTIVATIONS[activation][0](out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(model: nn.Module, reduce_range: bool = False
                     ) -> list[tuple[nn.Module, str, nn.Linear]]:
    """Replace ``model``'s linear layers by :class:`Int8Linear` in place, for a model that
    only ever runs inference; returns the swaps made, (parent, attribute, the fp32 layer), which
    ``setattr`` undoes. A layer whose weight another module shares
    (a decoder tied to the word embeddings) keeps its fp32 weights, as in
    :func:`cast_linears`: the embedding lookup reads them too. ``reduce_range``: as
    :class:`Int8Linear`'s."""
    uses: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            uses[id(param)] = uses.get(id(param), 0) + 1
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children()
             if isinstance(child, nn.Linear) and uses[id(child.weight)] == 1]
    for parent, name, child in swaps:
        setattr(parent, name, Int8Linear(child, reduce_range))
    return swaps


__all__ = ["ACTIVATIONS", "Int8Linear", "Linear", "cast_linears", "quantize_linears"]
