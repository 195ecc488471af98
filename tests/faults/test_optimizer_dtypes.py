"""Every optimizer takes every floating dtype torch.optim takes (Lamb used to crash on float64:
``_foreach_norm(..., dtype=float32)`` refuses to narrow)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bertforge.optim import build_optimizer, clip_grad_norm_, global_grad_norm

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def model_of(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3)).to(dtype)


def train(model: nn.Module, name: str, steps: int = 5) -> list[torch.Tensor]:
    """A few steps on a fixed regression problem; gradients come from a float64 loss."""
    opt = build_optimizer(model, name, lr=1e-2, weight_decay=0.01, max_grad_norm=1.0)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 6, generator=gen), torch.randn(16, 3, generator=gen)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        opt.zero_grad()
        loss = (model(x.to(dtype)).double() - y.double()).pow(2).mean()
        loss.backward()
        opt.step()
    return [p.detach().double() for p in model.parameters()]


@pytest.mark.parametrize("name", ["lamb", "adamw"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_floating_dtype_is_accepted(name: str, dtype: torch.dtype) -> None:
    reference = train(model_of(torch.float32), name)
    got = train(model_of(dtype), name)
    assert all(torch.isfinite(g).all() for g in got)
    if dtype == torch.float16:
        # Taken and finite, but not compared: Adam-style second moments underflow float16 (for
        # torch's AdamW as much as for Lamb), which is why mixed precision keeps fp32 weights.
        return
    # Same steps in another precision: as close to the float32 result as the dtype resolves.
    tol = {torch.bfloat16: 5e-2, torch.float32: 0.0, torch.float64: 1e-5}[dtype]
    for g, r in zip(got, reference, strict=True):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


def test_float64_norms_are_taken_in_float64() -> None:
    grads = [torch.full((3,), 1e-200, dtype=torch.float64), torch.tensor([3.0, 4.0],
                                                                           dtype=torch.float64)]
    norm = global_grad_norm(grads)
    assert norm.dtype == torch.float64 and norm.item() == 5.0  # 1e-200 squared is not lost as
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]  # an error, it is just tiny
    for p, g in zip(params, grads):
        p.grad = g.clone()
    assert clip_grad_norm_(params, 1.0).item() == 5.0
    assert params[1].grad.tolist() == pytest.approx([0.6, 0.8], rel=1e-15)
    # Mixed dtypes: the global norm takes the widest.
    assert global_grad_norm([torch.ones(4, dtype=torch.float16), grads[1]]).dtype == torch.float64
