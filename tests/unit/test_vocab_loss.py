"""The chunked vocabulary cross-entropy (bertforge.ops.loss) against PyTorch's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertforge.ops import loss as loss_module
from bertforge.ops.loss import vocab_cross_entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_bytes", [64, 4 << 20])  # many chunks (one row each), one chunk
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_accuracy_and_gradient_match_pytorch(dtype, chunk_bytes, smoothing,
                                                  monkeypatch) -> None:
    monkeypatch.setattr(loss_module, "_CHUNK_BYTES", chunk_bytes)
    torch.manual_seed(0)
    base = (torch.randn(37, 101) * 3).to(dtype)
    target = torch.randint(101, (37,))
    target[:5] = base[:5].float().argmax(-1)  # some rows predicted right
    ours = base.clone().requires_grad_()
    ref = base.clone().requires_grad_()
    loss, nll, correct = vocab_cross_entropy(ours, target, smoothing)
    want = F.cross_entropy(ref.float(), target, label_smoothing=smoothing)
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(nll, F.cross_entropy(base.float(), target), rtol=1e-6, atol=1e-6)
    assert not nll.requires_grad and not correct.requires_grad
    scores = base.float()
    best = scores.gather(1, target[:, None]) >= scores.amax(-1, keepdim=True)
    assert int(correct) == int(best.sum())  # ties with the best count as correct
    assert torch.equal(ours.detach(), base)  # the logits are read, never written
    (2.5 * loss).backward()
    (2.5 * want).backward()
    assert ours.grad.dtype == dtype
    tol = {"rtol": 0, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-5}
    torch.testing.assert_close(ours.grad, ref.grad, **tol)


def test_fp16_logits_keep_small_gradients_under_a_loss_scale() -> None:
    """fp16 training scales the loss (2**16) so that small gradients survive in fp16; the scale
    reaches the loss only in backward, where it must not overflow fp16 (65536 > 65504) nor meet
    an unscaled gradient already flushed to zero."""
    torch.manual_seed(2)
    base = (torch.randn(4, 3000) * 4).half()
    target = torch.randint(3000, (4,))
    ours = base.clone().requires_grad_()
    ref = base.clone().requires_grad_()
    (vocab_cross_entropy(ours, target)[0] * 2.0**16).backward()
    (F.cross_entropy(ref.float(), target) * 2.0**16).backward()
    assert ours.grad.dtype == torch.float16 and torch.isfinite(ours.grad).all()
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-3, atol=1e-3)
    assert int(ours.grad.ne(0).sum()) == int(ref.grad.ne(0).sum())


def test_bf16_gradient_takes_an_accumulation_factor_in_fp32() -> None:
    """A factor like 1/3 (gradient accumulation) scales the kept bf16 gradient in fp32."""
    torch.manual_seed(3)
    base = torch.randn(8, 50).bfloat16()
    target = torch.randint(50, (8,))
    ours = base.clone().requires_grad_()
    ref = base.clone().requires_grad_()
    (vocab_cross_entropy(ours, target)[0] / 3).backward()
    (F.cross_entropy(ref.float(), target) / 3).backward()
    torch.testing.assert_close(ours.grad.float(), ref.grad.float(), rtol=8e-3, atol=1e-6)


def test_a_view_of_padded_logits_and_no_gradient() -> None:
    """The head pads its vocabulary; the loss reads the sliced view as it is, and a call under
    no_grad keeps no gradient."""
    torch.manual_seed(1)
    padded = torch.randn(6, 16)
    target = torch.randint(13, (6,))
    with torch.no_grad():
        loss, _, _ = vocab_cross_entropy(padded[:, :13], target)
    torch.testing.assert_close(loss, F.cross_entropy(padded[:, :13], target))


def test_wrong_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\(N, V\) logits"):
        vocab_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


def test_a_second_backward_is_refused() -> None:
    """The saved gradient is scaled in place (no second (N, V) buffer), so a retained graph
    cannot run backward through the loss twice: autograd's version check makes that an error,
    not a wrong gradient."""
    logits = torch.randn(4, 9, requires_grad=True)
    loss = vocab_cross_entropy(logits, torch.randint(9, (4,)))[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
