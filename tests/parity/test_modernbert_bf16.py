"""ModernBERT in bfloat16 by the error-budget rule (as tests/parity/test_bf16_budget.py for BERT):
bertforge's bf16 logits, padded and unpadded (the blocked window attention; on CUDA also
flash-attn's window kernel when it is installed), must be within twice the error of transformers'
bf16 run against a float64 reference of the same weights, plus a small floor. The batch is longer
than the sliding window and padded, so local and global layers both matter."""

from __future__ import annotations

import pytest
import torch

from bertforge.models import ModernBertForMaskedLM

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=99, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=96, max_position_embeddings=128, local_attention=8,
             global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             cls_token_id=1, sep_token_id=2)
FLOOR = 1e-3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(3)
    model = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**SHAPE))
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # O(0.1) weights, norms near 1: activations large enough to lose bits
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)
    path = tmp_path_factory.mktemp("modernbert-bf16")
    model.save_pretrained(path)
    return path


def batch(device: str = "cpu"):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, SHAPE["vocab_size"], (3, 40), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 27:] = 0
    mask[2, 13:] = 0
    return (ids * mask).to(device), mask.to(device)


def check(checkpoint, device: str) -> None:
    ids, mask = batch(device)
    valid = mask.bool()
    reference = ModernBertForMaskedLM.from_pretrained(checkpoint).double().to(device).eval()
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(
        checkpoint, attn_implementation="sdpa").to(device).eval()
    with torch.no_grad():
        ref = reference(ids, attention_mask=mask).logits[valid]
        with torch.autocast(device, dtype=torch.bfloat16):
            hf_err = (theirs(input_ids=ids, attention_mask=mask).logits[valid].double()
                      - ref).abs().max().item()
    assert hf_err > 0  # the budget means something only if bf16 lost precision
    for unpad in (False, True):
        ours = ModernBertForMaskedLM.from_pretrained(checkpoint).to(device).eval()
        ours.model.unpad = unpad
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            err = (ours(ids, attention_mask=mask).logits[valid].double() - ref).abs().max().item()
        assert err <= 2 * hf_err + FLOOR, f"unpad={unpad}: bf16 error {err:.3g} vs {hf_err:.3g}"


def test_bf16_error_within_twice_transformers(checkpoint) -> None:
    check(checkpoint, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_error_budget_on_gpu(checkpoint) -> None:
    """On CUDA: SDPA's fused kernels for the global layers, and flash-attn's window kernel for
    the local ones when the package is installed (else the blocked window attention)."""
    check(checkpoint, "cuda")
