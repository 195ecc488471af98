"""ModernBERT without transformers: config reading and checks, presets and registry records,
the rotary and sliding-window kernels against dense references, training-mode behaviour."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.errors import CheckpointError, ConfigError
from bertforge.models.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertModel,
    apply_rotary,
    rotary_tables,
)
from bertforge.models.modernbert_config import ModernBertConfig
from bertforge.models.registry import (
    MODERNBERT,
    family_of_architecture,
    family_of_type,
    preset_family,
    resolve_config,
)
from bertforge.ops.attention import WindowPlan, attend, band_keep_mask, blocked_window_attention
from bertforge.ops.unpad import token_layout

TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=3,
            num_attention_heads=2, local_attention=6, pad_token_id=0, bos_token_id=1,
            cls_token_id=1, eos_token_id=2, sep_token_id=2)


# ---------------------------------------------------------------------------------- config
def test_presets_and_registry():
    base = ModernBertConfig.from_preset("modernbert-base")
    large = ModernBertConfig.from_preset("modernbert-large")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size,
            base.num_attention_heads) == (22, 768, 1152, 12)
    assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size,
            large.num_attention_heads) == (28, 1024, 2624, 16)
    for cfg in (base, large):
        assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.local_attention) == (50368, 8192, 128)
        assert (cfg.global_rope_theta, cfg.local_rope_theta) == (160000.0, 10000.0)
        assert cfg.resolved_layer_types()[:4] == ["full_attention", "sliding_attention",
                                                  "sliding_attention", "full_attention"]
    assert 145e6 < base.num_parameters() < 155e6   # ModernBERT-base: 149M
    assert preset_family("modernbert-tiny") is MODERNBERT
    assert family_of_type("modernbert") is MODERNBERT
    assert family_of_architecture("ModernBertForMaskedLM") == (MODERNBERT, "masked-lm")
    family, cfg = resolve_config("modernbert-tiny")
    assert family is MODERNBERT and isinstance(cfg, ModernBertConfig)
    assert MODERNBERT.inputs == ("input_ids", "attention_mask")
    assert MODERNBERT.tokenizer == "modernbert"  # what `bertforge vocab --type` trains


def test_num_parameters_counts_the_model():
    for extra in ({}, {"norm_bias": True, "attention_bias": True, "mlp_bias": True,
                       "classifier_bias": True, "decoder_bias": False}):
        model = ModernBertForMaskedLM(ModernBertConfig(**TINY, **extra))
        assert sum(p.numel() for p in model.parameters()) == model.config.num_parameters()


def test_transformers5_keys_are_translated():
    data = {"model_type": "modernbert", **TINY,
            "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 9.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 7.0}}}
    cfg = ModernBertConfig.from_dict(data)
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (9.0, 7.0)
    assert cfg.layer_types is None    # the every-3rd pattern: kept as global_attn_every_n_layers
    written = cfg.to_dict()
    assert written["layer_types"] == data["layer_types"]
    assert written["rope_parameters"]["sliding_attention"]["rope_theta"] == 7.0
    assert ModernBertConfig.from_dict(written) == cfg


@pytest.mark.parametrize("bad,message", [
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}}, "yarn"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"head_dim": 4}, "head_dim"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"hidden_activation": "swish2"}, "hidden_activation"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"num_attention_heads": 3}, "divisible"),
    ({"pad_token_id": 64}, "outside the vocabulary"),
])
def test_config_errors(bad, message):
    with pytest.raises(ConfigError, match=message):
        ModernBertConfig.from_dict({"model_type": "modernbert", **TINY, **bad})


def test_unknown_hand_written_key_is_an_error():
    with pytest.raises(ConfigError, match="global_attn_every_n_layers"):
        ModernBertConfig.from_dict({**TINY, "global_attn_every_n_layer": 2})


# ---------------------------------------------------------------------------------- kernels
def test_rotary_is_relative():
    """Scores of rotated queries and keys depend on the distance only."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 8, generator=gen)
    def score(i: int, j: int) -> float:
        cos, sin = rotary_tables(torch.tensor([i, j]), 8, 100.0, torch.float32)
        rq = apply_rotary(q[None].expand(2, 1, 8), cos, sin)[0]
        rk = apply_rotary(k[None].expand(2, 1, 8), cos, sin)[1]
        return float((rq * rk).sum())
    assert math.isclose(score(3, 7), score(10, 14), rel_tol=1e-5)
    assert not math.isclose(score(3, 7), score(3, 8), rel_tol=1e-3)


def _dense_window(q, k, v, sequence, window):
    """Reference: full (T, T) mask, same sequence and |i - j| <= window."""
    t = q.shape[0]
    idx = torch.arange(t)
    keep = (sequence[:, None] == sequence[None, :]) & ((idx[:, None] - idx[None, :]).abs() <= window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=keep[None])
    return out.transpose(0, 1)


@pytest.mark.parametrize("window,block", [(1, None), (4, None), (4, 3), (16, 8), (64, None)])
def test_blocked_window_attention_matches_dense(window, block):
    gen = torch.Generator().manual_seed(window)
    lengths = torch.tensor([1, 37, 5, 70, 16, 2])
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    q, k, v = torch.randn(3, int(lengths.sum()), 2, 8, generator=gen)
    got = blocked_window_attention(q, k, v, sequence, window, block=block)
    assert torch.allclose(got, _dense_window(q, k, v, sequence, window), atol=1e-5)


def test_attend_window_padded_equals_unpadded():
    gen = torch.Generator().manual_seed(1)
    mask = (torch.arange(30)[None, :] < torch.tensor([30, 12, 25])[:, None]).long()
    q, k, v = torch.randn(3, 3, 30, 2, 8, generator=gen)
    keep = band_keep_mask(mask.bool()[:, None, None, :], 30, 3)
    padded = attend(q, k, v, keep)
    layout = token_layout(mask)
    flat = attend(*(layout.unpad(x) for x in (q, k, v)), WindowPlan(layout, 3))
    assert torch.allclose(layout.unpad(padded), flat, atol=1e-5)
    assert band_keep_mask(None, 4, 3) is None      # the band covers every pair: no mask


# ---------------------------------------------------------------------------------- models
def test_unpadded_training_step_matches_padded():
    """Gradients of the unpadded pass equal the padded pass's (dropout off)."""
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY))
    ids = torch.randint(3, 64, (3, 20))
    mask = (torch.arange(20)[None, :] < torch.tensor([20, 9, 14])[:, None]).long()
    grads = []
    for unpad in (False, True):
        model.zero_grad()
        model.model.unpad = unpad
        model.train()(ids, mask, masked_positions=mask.bool()).logits.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_gradient_checkpointing_and_layers():
    model = ModernBertModel(ModernBertConfig(**TINY)).train()
    assert len(model.transformer_layers()) == 3
    model.gradient_checkpointing = True
    out = model(torch.randint(3, 64, (2, 12))).last_hidden_state
    out.sum().backward()
    assert model.layers[0].attn.Wqkv.weight.grad is not None


def test_initialisation():
    cfg = ModernBertConfig(**{**TINY, "hidden_size": 64, "intermediate_size": 128,
                              "num_attention_heads": 4})
    model = ModernBertForMaskedLM(cfg).requires_grad_(False)
    emb = model.model.embeddings.tok_embeddings.weight
    assert model.decoder.weight is emb
    assert float(emb[0].abs().max()) == 0.0            # padding row
    bound = cfg.initializer_cutoff_factor * cfg.initializer_range
    assert float(model.model.layers[1].attn.Wqkv.weight.abs().max()) <= bound
    out_std = float(model.model.layers[1].mlp.Wo.weight.std())
    assert out_std < cfg.initializer_range / math.sqrt(2 * cfg.num_hidden_layers) * 1.2
    assert float(model.decoder.bias.abs().max()) == 0.0


def test_too_long_input_is_a_data_error():
    from bertforge.errors import DataError

    model = ModernBertModel(ModernBertConfig(**TINY, max_position_embeddings=16))
    with pytest.raises(DataError, match="max_position_embeddings"):
        model(torch.ones(1, 17, dtype=torch.long))


def test_save_load_round_trip(tmp_path):
    model = ModernBertForQuestionAnswering(ModernBertConfig(**TINY, num_labels=5)).eval()
    assert model.config.num_labels == 2          # transformers sizes the QA layer by it
    model.save_pretrained(tmp_path)
    loaded = ModernBertForQuestionAnswering.from_pretrained(tmp_path)
    ids = torch.randint(3, 64, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(ids).start_logits, loaded(ids).start_logits)
    # an MLM checkpoint starts a QA model: the classifier starts fresh, the decoder is dropped
    mlm = ModernBertForMaskedLM(ModernBertConfig(**TINY))
    report = ModernBertForQuestionAnswering(mlm.config).load_hf_state_dict(mlm.hf_state_dict())
    assert report.initialized == ["classifier.weight", "classifier.bias"]
    assert report.dropped == ["decoder.bias"]
    # a body of another shape is refused, naming the weights
    with pytest.raises(CheckpointError, match="Wqkv"):
        ModernBertModel(ModernBertConfig(**{**TINY, "num_hidden_layers": 2, "hidden_size": 32})
                        ).load_hf_state_dict(mlm.hf_state_dict())
