"""bfloat16 accuracy by the error-budget rule.

Absolute tolerances for low precision are either too loose to catch bugs or flaky. Instead we
measure the error of transformers' bf16 run against a float64 reference of the same weights and
require ours to be within twice that (plus a tiny floor), in both ways a user runs bf16: weights cast
to bf16, and fp32 weights under autocast.
"""

from __future__ import annotations

import pytest
import torch

import bertforge.models as bf

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=64)
FLOOR = 1e-3


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """O(0.1) weights and biases, LayerNorm scales near 1: activations large enough to lose bits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.2 * noise if "LayerNorm" in name and name.endswith("weight") else 0.15 * noise)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = transformers.BertForPreTraining(transformers.BertConfig(**SHAPE, attn_implementation="sdpa"))
    randomize_(model, seed=11)
    path = tmp_path_factory.mktemp("bf16")
    model.save_pretrained(path)
    return path


def batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, SHAPE["vocab_size"], (4, 32), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    mask[3, 9:] = 0
    types = torch.zeros_like(ids)
    types[:, 16:] = 1
    return ids * mask, mask, types


def errors(ours_out, hf_out, ref_out, valid) -> list[tuple[float, float]]:
    pairs = [(ours_out.mlm_logits[valid], hf_out.prediction_logits[valid], ref_out.mlm_logits[valid]),
             (ours_out.nsp_logits, hf_out.seq_relationship_logits, ref_out.nsp_logits)]
    return [((a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()) for a, b, r in pairs]


@pytest.mark.parametrize("mode", ["cast", "autocast"])
def test_bf16_error_within_twice_transformers(checkpoint, mode: str) -> None:
    ids, mask, types = batch()
    reference = bf.BertForPreTraining.from_pretrained(checkpoint).double()
    ours = bf.BertForPreTraining.from_pretrained(checkpoint)
    theirs = transformers.BertForPreTraining.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    with torch.no_grad():
        ref_out = reference(ids, mask, types)
        if mode == "cast":
            ours_out = ours.to(torch.bfloat16)(ids, mask, types)
            hf_out = theirs.to(torch.bfloat16)(input_ids=ids, attention_mask=mask, token_type_ids=types)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                ours_out = ours(ids, mask, types)
                hf_out = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert ours_out.mlm_logits.dtype == torch.bfloat16
    for ours_err, hf_err in errors(ours_out, hf_out, ref_out, mask.bool()):
        assert hf_err > 0  # the budget is meaningful only if bf16 actually lost precision
        assert ours_err <= 2 * hf_err + FLOOR, f"bf16 error {ours_err:.3g} vs transformers {hf_err:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_error_budget_on_gpu(checkpoint) -> None:
    """Same budget on CUDA, where SDPA uses fused kernels (flash for the unpadded batch)."""
    ids, mask, types = (t.cuda() for t in batch())
    reference = bf.BertForPreTraining.from_pretrained(checkpoint).double().cuda()
    ours = bf.BertForPreTraining.from_pretrained(checkpoint).cuda()
    theirs = transformers.BertForPreTraining.from_pretrained(checkpoint, attn_implementation="sdpa").eval().cuda()
    for m in (mask, torch.ones_like(mask)):
        with torch.no_grad():
            ref_out = reference(ids, m, types)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                ours_out = ours(ids, m, types)
                hf_out = theirs(input_ids=ids, attention_mask=m, token_type_ids=types)
        for ours_err, hf_err in errors(ours_out, hf_out, ref_out, m.bool()):
            assert ours_err <= 2 * hf_err + FLOOR, f"bf16 error {ours_err:.3g} vs transformers {hf_err:.3g}"
