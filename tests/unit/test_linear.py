"""``bertforge.ops.linear.Linear``: oneDNN's fused bias + activation in CPU inference, plain
``nn.Linear`` + activation wherever autograd, autocast or a tracer could notice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bertforge.ops import linear as linear_module
from bertforge.ops.linear import ACTIVATIONS, Linear

FUSED = linear_module._fused_available()


def ops_run(fn) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("activation", [None, *ACTIVATIONS])
@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 16), (0, 16)])
def test_inference_equals_linear_then_activation(activation, shape) -> None:
    torch.manual_seed(0)
    layer = Linear(16, 24)
    x = torch.randn(*shape)
    want = F.linear(x, layer.weight, layer.bias)
    if activation is not None:
        want = ACTIVATIONS[activation][0](want)
    with torch.no_grad():
        got = layer(x, activation)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.shape == (*shape[:-1], 24)


@pytest.mark.skipif(not FUSED, reason="this PyTorch has no oneDNN linear operator")
def test_the_fused_operator_runs_only_without_autograd_and_autocast() -> None:
    layer, x = Linear(16, 24), torch.randn(5, 16)
    with torch.no_grad():
        assert "mkldnn::_linear_pointwise" in ops_run(lambda: layer(x, "gelu"))
        assert "mkldnn::_linear_pointwise" not in ops_run(lambda: layer(x))  # no gain there
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.bfloat16  # autocast's linear, not the fused one
    names = ops_run(lambda: layer(x, "gelu").sum().backward())
    assert "mkldnn::_linear_pointwise" not in names and "aten::addmm" in names
    assert layer.weight.grad is not None


def test_state_dict_is_nn_linears() -> None:
    assert set(Linear(4, 3).state_dict()) == set(torch.nn.Linear(4, 3).state_dict())
    assert set(Linear(4, 3, bias=False).state_dict()) == {"weight"}
