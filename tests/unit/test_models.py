"""Model behaviour that has no transformers counterpart: masked-position MLM, pre-LN, gradient
checkpointing, padding invariance, initialisation and input checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.errors import DataError
from bertforge.models import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertModel,
)

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def config(**kw) -> BertConfig:
    return BertConfig(**{**TINY, **kw})


def spread_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial values for every parameter (zero biases would hide mistakes); padded rows stay 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.2 * noise if "LayerNorm" in name and name.endswith("weight") else 0.2 * noise)
        model.word_embeddings().weight[model.config.vocab_size :] = 0
    return model.eval()


def batch(b: int = 3, s: int = 12):
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([s, s - 5, 3, s - 2])[:b]
    mask = (torch.arange(s)[None] < lengths[:, None]).long()
    ids = torch.randint(1, 99, (b, s), generator=gen) * mask
    types = ((torch.arange(s)[None] >= lengths[:, None] // 2) & mask.bool()).long()
    return ids, mask, types


@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
def test_masked_positions_equal_full_head_indexed(cls) -> None:
    model = spread_(cls(config()))
    ids, mask, types = batch()
    positions = torch.zeros_like(mask, dtype=torch.bool)
    positions[0, [1, 4, 11]] = True
    positions[2, 2] = True
    with torch.no_grad():
        full = model(ids, mask, types)
        part = model(ids, mask, types, masked_positions=positions)
    full_logits, part_logits = (full.mlm_logits, part.mlm_logits) if cls is BertForPreTraining else (full.logits, part.logits)
    assert full_logits.shape == (3, 12, 99) and part_logits.shape == (4, 99)
    assert torch.allclose(part_logits, full_logits[positions], atol=1e-6, rtol=0)
    if cls is BertForPreTraining:
        assert torch.equal(part.nsp_logits, full.nsp_logits)
    flat = positions.flatten().nonzero().squeeze(1)  # the same positions as row * S + column
    by_index = model(ids, mask, types, masked_positions=flat)
    by_index = by_index.mlm_logits if cls is BertForPreTraining else by_index.logits
    assert torch.equal(by_index, part_logits)
    with pytest.raises(ValueError, match="masked_positions must be a \\(B, S\\) bool mask or"):
        model(ids, mask, types, masked_positions=positions.long())
    with pytest.raises(ValueError, match="bool tensor of shape \\(3, 12\\)"):
        model(ids, mask, types, masked_positions=positions[:, :5])


def test_logits_cover_real_vocab_only_and_padding_rows_are_zero() -> None:
    model = BertForPreTraining(config())
    assert model.config.padded_vocab_size == 104
    emb = model.bert.embeddings.word_embeddings.weight
    assert emb.shape == (104, 32) and model.cls.predictions.decoder.weight is emb
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    assert emb[99:].abs().sum() == 0 and emb[0].abs().sum() == 0  # padding rows and [PAD]
    assert model(torch.tensor([[5, 6, 7]])).mlm_logits.shape == (1, 3, 99)


def test_initialisation_follows_bert() -> None:
    torch.manual_seed(0)
    model = BertForPreTraining(config(hidden_size=64, num_attention_heads=4, intermediate_size=256,
                                      initializer_range=0.05))
    for name, p in model.named_parameters():
        if "LayerNorm" in name:
            expected = torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)
            assert torch.equal(p, expected), name
        elif name.endswith("bias"):
            assert p.abs().sum() == 0, name
        elif name.endswith("word_embeddings.weight"):
            assert abs(p[1:99].std().item() - 0.05) < 0.005
        else:
            assert abs(p.std().item() - 0.05) < 0.01, name


def reference_encoder(model: BertModel, ids, mask, types) -> torch.Tensor:
    """float64 BERT written out op by op from the parameters, for post-LN and pre-LN layouts."""
    c = model.config
    p = {k: v.double() for k, v in model.state_dict().items()}
    ln = lambda x, pre: F.layer_norm(x, (c.hidden_size,), p[pre + ".weight"], p[pre + ".bias"], c.layer_norm_eps)
    lin = lambda x, pre: x @ p[pre + ".weight"].T + p[pre + ".bias"]
    s = ids.shape[1]
    x = p["embeddings.word_embeddings.weight"][ids] + p["embeddings.position_embeddings.weight"][:s]
    x = ln(x + p["embeddings.token_type_embeddings.weight"][types], "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :].double()) * -1e9  # (B, 1, 1, S)
    heads, d = c.num_attention_heads, c.head_dim
    for i in range(c.num_hidden_layers):
        pre = f"encoder.layer.{i}."
        a_in = ln(x, pre + "attention.output.LayerNorm") if c.pre_layernorm else x
        q, k, v = (lin(a_in, pre + "attention.self." + n).view(*ids.shape, heads, d).transpose(1, 2)
                   for n in ("query", "key", "value"))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(*ids.shape, -1)
        x = x + lin(ctx, pre + "attention.output.dense")
        if not c.pre_layernorm:
            x = ln(x, pre + "attention.output.LayerNorm")
        f_in = ln(x, pre + "output.LayerNorm") if c.pre_layernorm else x
        x = x + lin(F.gelu(lin(f_in, pre + "intermediate.dense")), pre + "output.dense")
        if not c.pre_layernorm:
            x = ln(x, pre + "output.LayerNorm")
    return ln(x, "encoder.final_layer_norm") if c.pre_layernorm else x


@pytest.mark.parametrize("pre_layernorm", [False, True])
def test_encoder_matches_float64_reference(pre_layernorm: bool) -> None:
    model = spread_(BertModel(config(pre_layernorm=pre_layernorm)))
    assert hasattr(model.encoder, "final_layer_norm") == pre_layernorm
    assert any("final_layer_norm" in k for k in model.state_dict()) == pre_layernorm
    ids, mask, types = batch()
    with torch.no_grad():
        ours = model(ids, mask, types).last_hidden_state.double()
    ref = reference_encoder(model, ids, mask, types)
    valid = mask.bool()
    assert (ours[valid] - ref[valid]).abs().max().item() < 1e-5


def test_padding_does_not_change_real_tokens() -> None:
    model = spread_(BertModel(config()))
    ids, mask, types = batch()
    with torch.no_grad():
        padded = model(ids, mask, types).last_hidden_state
        alone = model(ids[1:2, :7], None, types[1:2, :7]).last_hidden_state  # row 1 has 7 real tokens
        all_ones = model(ids, torch.ones_like(mask), types).last_hidden_state
        no_mask = model(ids, None, types).last_hidden_state
    assert (padded[1, :7] - alone[0]).abs().max().item() < 1e-5
    assert torch.equal(all_ones, no_mask)  # an all-ones mask takes the unmasked (fused-kernel) path
    # A sequence that is all padding stays finite instead of producing NaN.
    mask[2] = 0
    with torch.no_grad():
        assert torch.isfinite(model(ids, mask, types).last_hidden_state).all()


def test_gradient_checkpointing_gives_same_values_and_grads() -> None:
    torch.manual_seed(0)
    model = spread_(BertForPreTraining(config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))).train()
    ids, mask, types = batch()

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(123)  # same dropout masks in both runs
        model.zero_grad()
        out = model(ids, mask, types)
        loss = out.mlm_logits.float().pow(2).mean() + out.nsp_logits.pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss_plain, grads_plain = run()
    model.bert.encoder.gradient_checkpointing = True
    loss_ckpt, grads_ckpt = run()
    assert torch.allclose(loss_plain, loss_ckpt, rtol=1e-6, atol=0)
    for a, b in zip(grads_plain, grads_ckpt):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_dropout_only_in_training_mode() -> None:
    model = BertModel(config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    ids, mask, types = batch()
    model.eval()
    assert torch.equal(model(ids, mask, types).last_hidden_state, model(ids, mask, types).last_hidden_state)
    model.train()
    assert not torch.equal(model(ids, mask, types).last_hidden_state, model(ids, mask, types).last_hidden_state)


def test_multiple_choice_scores_each_choice_independently() -> None:
    model = spread_(BertForMultipleChoice(config()))
    ids, mask, types = batch(b=4)
    ids, mask, types = (t.view(2, 2, 12) for t in (ids, mask, types))
    with torch.no_grad():
        logits = model(ids, mask, types).logits
        single = model(ids[1:, :1], mask[1:, :1], types[1:, :1]).logits
    assert logits.shape == (2, 2) and single.shape == (1, 1)
    assert abs(logits[1, 0].item() - single[0, 0].item()) < 1e-5


def test_too_long_input_is_a_user_error() -> None:
    model = BertModel(config())
    with pytest.raises(DataError, match="input has 17 tokens .* max_position_embeddings is 16: truncate"):
        model(torch.ones(1, 17, dtype=torch.long))
