"""fp32 parity of bertforge's unpadded BART training step with transformers' padded one.

The same weights (bertforge's model directory loaded by transformers), variable-length pairs
from bertforge's collate: bertforge's ``seq2seq_loss`` with ``unpad`` on (encoder on the real
source tokens, decoder through each target, vocabulary projection at the targets only) against
transformers' forward with ``labels``. The loss and the gradient of every weight agree, for
BART (post-LN) and mBART (bertforge's Pre-LN layout), with and without label smoothing.
"""

from __future__ import annotations

import pytest
import torch

from bertforge.data.collate.seq2seq import collate_seq2seq
from bertforge.models.bart import BartConfig, BartForConditionalGeneration
from bertforge.tasks.denoise import seq2seq_loss
from bertforge.speed import set_unpadding

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=1e-4)


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Every weight random with a large spread (LayerNorm scales around 1), so a weight used in
    the wrong place changes the result."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            noise = torch.randn(tensor.shape, generator=gen)
            is_scale = ("layer_norm" in name or "layernorm" in name) and name.endswith("weight")
            tensor.copy_(1.0 + 0.2 * noise if is_scale else 0.15 * noise)


@pytest.mark.parametrize("pre_ln", [False, True])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_unpadded_loss_and_gradients_equal_transformers(tmp_path, pre_ln, label_smoothing):
    torch.manual_seed(0)
    config = BartConfig(vocab_size=97, d_model=32, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                        decoder_ffn_dim=40, max_position_embeddings=80, dropout=0.0,
                        normalize_before=pre_ln)
    ours = BartForConditionalGeneration(config)
    randomize_(ours, seed=1)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path),
                                                                 attn_implementation="sdpa")
    set_unpadding(ours, True)
    gen = torch.Generator().manual_seed(2)
    sources = [torch.randint(4, 97, (n,), generator=gen).numpy() for n in (70, 6, 40, 33, 1)]
    targets = [torch.randint(4, 97, (n,), generator=gen).numpy() for n in (50, 3, 33, 64, 1)]
    batch = collate_seq2seq(sources, targets, pad_id=config.pad_token_id,
                            decoder_start_id=config.decoder_start_token_id)

    loss = seq2seq_loss(ours, batch, label_smoothing).loss
    loss.backward()
    out = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 decoder_input_ids=batch["decoder_input_ids"])
    expected = torch.nn.functional.cross_entropy(
        out.logits.flatten(0, 1), batch["labels"].flatten(), label_smoothing=label_smoothing)
    expected.backward()
    torch.testing.assert_close(loss, expected, **TOL)
    their_grads = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, their_grads[name].grad, **TOL, msg=name)
