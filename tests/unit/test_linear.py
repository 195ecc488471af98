"""``bertforge.ops.linear.Linear``: oneDNN's fused bias + activation in CPU inference, plain
``nn.Linear`` + activation wherever autograd, autocast or a tracer could notice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from bertforge.ops import linear as linear_module
from bertforge.ops.linear import ACTIVATIONS, Linear, cast_linears

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


FUSED_BF16 = linear_module._fused_available(torch.bfloat16)


@pytest.mark.skipif(not FUSED_BF16, reason="this PyTorch/CPU has no bf16 oneDNN linear operator")
def test_bf16_weights_under_bf16_autocast_take_the_fused_operator() -> None:
    torch.manual_seed(0)
    layer, x = Linear(16, 24), torch.randn(5, 16)
    want = F.gelu(F.linear(x, layer.weight, layer.bias))
    layer.to(torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert "mkldnn::_linear_pointwise" in ops_run(lambda: layer(x, "gelu"))
        got = layer(x, "gelu")
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    with torch.no_grad():  # bf16 weights without autocast: nn.Linear's dtype rules, unfused
        assert "mkldnn::_linear_pointwise" not in ops_run(lambda: layer(x.bfloat16(), "gelu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autograd records: unfused
        assert "mkldnn::_linear_pointwise" not in ops_run(lambda: layer(x, "gelu"))


def test_cast_linears_rounds_as_autocast_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear weights stored in bf16 give exactly what autocast computes from fp32 weights (the
    fused operator, whose one rounding differs, switched off here); a decoder tied to the word
    embeddings and every other parameter keep fp32."""
    from bertforge.models import BertConfig, BertForMaskedLM

    monkeypatch.setattr(linear_module, "_fused_dtype", lambda *args: None)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.from_preset("bert-tiny", vocab_size=50,
                                                   max_position_embeddings=16)).eval()
    ids = torch.randint(5, 50, (2, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(input_ids=ids).logits
        cast_linears(model, torch.bfloat16)
        got = model(input_ids=ids).logits
    assert torch.equal(got, want)
    dtypes = {name: p.dtype for name, p in model.named_parameters(remove_duplicate=False)}
    assert dtypes["bert.encoder.layer.0.intermediate.dense.weight"] == torch.bfloat16
    assert dtypes["bert.encoder.layer.0.attention.output.LayerNorm.weight"] == torch.float32
    assert dtypes["bert.embeddings.word_embeddings.weight"] == torch.float32
    assert dtypes["cls.predictions.decoder.weight"] == torch.float32  # tied to the embeddings
