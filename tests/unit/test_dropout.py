"""The CPU dropout of ``bertforge.ops.dropout`` and the attention math that uses it in training."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.ops.attention import _cpu_dropout_attention, sdpa
from bertforge.ops.dropout import Dropout, _quantised, dropout, keep_mask


def test_rate_is_p_rounded_to_1_in_65536_and_the_scale_restores_the_mean() -> None:
    threshold, scale = _quantised(0.1)
    assert threshold == 6554 - 32768                     # round(0.1 * 65536) slices dropped
    assert scale == pytest.approx(65536 / (65536 - 6554), rel=1e-15)
    n = 4_000_000
    torch.manual_seed(0)
    kept = keep_mask((n,), 0.1).double().mean().item()
    expected = 1 - 6554 / 65536
    assert abs(kept - expected) < 5 * math.sqrt(expected * (1 - expected) / n)  # 5 sigma


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
def test_every_slice_of_a_word_is_dropped_at_the_rate_and_independently(p: float) -> None:
    torch.manual_seed(1)
    n = 1 << 20
    drop = ~keep_mask((n // 4, 4), p)           # column j: slice j of each random word
    q = round(p * 65536) / 65536
    sigma = math.sqrt(q * (1 - q) / (n // 4))
    rates = drop.double().mean(0)
    assert torch.all((rates - q).abs() < 5 * sigma), rates
    both = (drop[:, 0] & drop[:, 3]).double().mean().item()  # lowest and highest slice together
    assert abs(both - q * q) < 5 * math.sqrt(q * q * (1 - q * q) / (n // 4))


def test_forward_and_backward_scale_the_kept_elements_only() -> None:
    x = torch.randn(3, 1000, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(2)
    out = dropout(x, 0.2)
    torch.manual_seed(2)
    keep = keep_mask(x.shape, 0.2)
    _, scale = _quantised(0.2)
    torch.testing.assert_close(out, torch.where(keep, x * scale, 0.0), rtol=0, atol=0)
    grad = torch.randn_like(x)
    out.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(keep, grad * scale, 0.0), rtol=0, atol=0)


def test_same_seed_same_mask_and_dtype_kept() -> None:
    x = torch.randn(64, 33, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = dropout(x, 0.1)
    torch.manual_seed(3)
    b = dropout(x, 0.1)
    c = dropout(x, 0.1)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b) and not torch.equal(a, c)


def test_identity_outside_training_and_at_zero_and_zeros_at_one() -> None:
    x = torch.randn(10, 7)
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    layer = Dropout(0.3).eval()
    assert torch.equal(layer(x), x)
    assert layer.state_dict() == {} and isinstance(layer, torch.nn.Dropout)
    layer.train()
    torch.manual_seed(4)
    y = layer(x)
    assert 0 < int((y == 0).sum()) < x.numel()


def _attention_inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(5)
    return tuple(torch.randn(3, 4, 9, 8, dtype=dtype, requires_grad=True) for _ in range(3))


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_attention_math_matches_sdpa_without_dropout(mask_kind: str) -> None:
    q, k, v = _attention_inputs()
    keep = torch.rand(3, 1, 1, 9) > 0.4
    keep[..., 0] = True
    mask = {"none": None, "bool": keep, "causal": None,
            "float": torch.where(keep, 0.0, -1e4).double()}[mask_kind]
    causal = mask_kind == "causal"
    ours = _cpu_dropout_attention(q, k, v, mask, 0.0, causal)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(ours.sum(), (q, k, v))
    expected = torch.autograd.grad(theirs.sum(), (q, k, v))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def test_attention_dropout_drops_probabilities_with_the_ops_mask() -> None:
    q, k, v = _attention_inputs()
    keep = torch.rand(3, 1, 1, 9) > 0.4
    keep[..., 0] = True
    torch.manual_seed(6)
    ours = sdpa(q, k, v, keep, 0.25)  # the CPU training path
    probs = ((q @ k.transpose(-1, -2)) / math.sqrt(8)).masked_fill(~keep, -math.inf).softmax(-1)
    torch.manual_seed(6)
    drop = keep_mask(probs.shape, 0.25)
    _, scale = _quantised(0.25)
    torch.testing.assert_close(ours, torch.where(drop, probs * scale, 0.0) @ v, rtol=1e-12,
                               atol=1e-12)


def test_half_precision_attention_with_dropout_returns_its_dtype() -> None:
    q, k, v = (x.detach().bfloat16().requires_grad_() for x in _attention_inputs())
    out = sdpa(q, k, v, None, 0.1, is_causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16
