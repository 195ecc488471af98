"""BartConfig and the BART modules without transformers: shapes, options, loading rules, errors."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.errors import CheckpointError, ConfigError, DataError
from bertforge.models.bart import (BartConfig, BartForConditionalGeneration,
                                   BartForSequenceClassification, BartModel, shift_tokens_right)
from bertforge.speed import set_gradient_checkpointing


def tiny(**overrides) -> BartConfig:
    return BartConfig.from_preset("bart-tiny", vocab_size=61, **overrides)


def test_presets_have_the_published_shapes():
    base, large = BartConfig.from_preset("bart-base"), BartConfig.from_preset("bart-large")
    assert (base.encoder_layers, base.decoder_layers, base.d_model, base.encoder_ffn_dim) == (6, 6, 768, 3072)
    assert (large.encoder_layers, large.decoder_layers, large.d_model) == (12, 12, 1024)
    assert base.vocab_size == 50265 and base.max_position_embeddings == 1024
    assert not base.normalize_before and BartConfig.from_preset("bart-base-preln").normalize_before
    # bart-base has about 139M parameters, bart-large about 406M (the BART paper's sizes).
    assert 138e6 < base.num_parameters() < 141e6
    assert 405e6 < large.num_parameters() < 408e6


@pytest.mark.parametrize("pre_ln", [False, True])
def test_num_parameters_counts_the_module(pre_ln):
    config = tiny(normalize_before=pre_ln)
    model = BartForConditionalGeneration(config)
    assert config.num_parameters() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("field,value,message", [
    ("d_model", 129, "not divisible by encoder_attention_heads"),
    ("decoder_layers", 0, "decoder_layers must be an integer >= 1"),
    ("dropout", 1.0, "dropout must be a probability"),
    ("activation_function", "swish", "not supported"),
    ("pad_token_id", 61, "outside the vocabulary"),
    ("normalize_before", "yes", "true or false"),
])
def test_bad_config_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        tiny(**{field: value})


def test_unknown_preset_and_override_suggest_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'bart-base'"):
        BartConfig.from_preset("bart-bse")
    with pytest.raises(ConfigError, match="Did you mean 'd_model'"):
        tiny().replace(d_modl=8)


@pytest.mark.parametrize("pre_ln,model_type", [(False, "bart"), (True, "mbart")])
def test_config_json_round_trip_and_model_type(tmp_path, pre_ln, model_type):
    config = tiny(normalize_before=pre_ln, num_labels=2, id2label={0: "neg", 1: "pos"},
                  architectures=["BartForConditionalGeneration"])
    config.to_json_file(tmp_path / "config.json")
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == model_type and data["is_encoder_decoder"] is True
    prefix = "M" if pre_ln else ""
    assert data["architectures"] == [prefix + "BartForConditionalGeneration"]
    assert BartConfig.load(tmp_path) == config


@pytest.mark.parametrize("data,message", [
    ({"model_type": "t5"}, "not a BART checkpoint"),
    ({"model_type": "bart", "encoder_layerdrop": 0.1}, "encoder_layerdrop=0.1 is not supported"),
    ({"model_type": "bart", "tie_word_embeddings": False}, "tie_word_embeddings=false"),
    ({"model_type": "mbart", "normalize_before": False}, "Pre-LN layout"),
    ({"d_model": 64, "hiden": 3}, "unknown BartConfig key 'hiden'"),
])
def test_config_dicts_bertforge_cannot_honour_are_refused(data, message):
    with pytest.raises(ConfigError, match=message):
        BartConfig.from_dict(data, source="cfg.json")


def test_transformers_dict_without_forced_bos_forces_nothing():
    config = BartConfig.from_dict({"model_type": "bart", "vocab_size": 61, "d_model": 32,
                                   "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                                   "some_generic_key": 1})
    assert config.forced_bos_token_id is None
    assert BartConfig().forced_bos_token_id == 0  # our own default forces <s> like fairseq


def test_shift_tokens_right():
    labels = torch.tensor([[5, 6, 2, -100], [7, 2, -100, -100]])
    assert shift_tokens_right(labels, 1, 2).tolist() == [[2, 5, 6, 2], [2, 7, 2, 1]]


def test_sequence_longer_than_the_position_table_is_a_clear_error():
    model = BartModel(tiny(max_position_embeddings=8)).eval()
    with pytest.raises(DataError, match="max_position_embeddings is 8"):
        model(torch.full((1, 9), 5), decoder_input_ids=torch.full((1, 3), 5))


def test_tied_embedding_and_pad_row():
    model = BartForConditionalGeneration(tiny())
    shared = model.model.shared
    assert model.lm_head.weight is shared.weight
    assert model.model.encoder.embed_tokens is shared and model.model.decoder.embed_tokens is shared
    assert shared.padding_idx == 1 and torch.count_nonzero(shared.weight[1]) == 0  # <pad>


def test_scaled_embeddings_change_the_output():
    torch.manual_seed(0)
    plain = BartModel(tiny()).eval()
    scaled = BartModel(tiny(scale_embedding=True)).eval()
    scaled.load_state_dict(plain.state_dict())
    ids = torch.tensor([[0, 5, 6, 7, 2]])
    a = plain(ids).encoder_last_hidden_state
    b = scaled(ids).encoder_last_hidden_state
    assert not torch.allclose(a, b)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    config = tiny(dropout=0.0)
    a = BartForConditionalGeneration(config)
    b = BartForConditionalGeneration(config)
    b.load_state_dict(a.state_dict())
    set_gradient_checkpointing(b, True)
    ids = torch.randint(3, 61, (2, 9))
    dec = torch.randint(3, 61, (2, 6))
    for model in (a, b):
        model.train()
        model(ids, None, dec).logits.square().mean().backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), name


def test_classifier_needs_an_eos_in_every_row():
    model = BartForSequenceClassification(tiny(num_labels=2)).eval()
    with pytest.raises(DataError, match="must contain </s>"):
        model(torch.tensor([[0, 5, 6, 2], [0, 5, 6, 7]]))
    # Rows with different </s> counts are classified at their last one.
    logits = model(torch.tensor([[0, 5, 2, 2], [0, 5, 6, 2]])).logits
    assert logits.shape == (2, 2)


def test_loading_across_classes_and_layouts(tmp_path, caplog):
    torch.manual_seed(0)
    bare = BartModel(tiny(normalize_before=False))
    bare.save_pretrained(tmp_path / "bare")
    # A bare model's file into the LM class: the bias buffer is the only (head) part it lacks.
    lm = BartForConditionalGeneration.from_pretrained(tmp_path / "bare")
    assert torch.count_nonzero(lm.final_logits_bias) == 0
    assert torch.equal(lm.model.shared.weight, bare.shared.weight)
    # ... and back: the LM file into the bare class drops the bias.
    lm.save_pretrained(tmp_path / "lm")
    names = set(json.loads((tmp_path / "lm" / "config.json").read_text()))
    assert "model_type" in names
    back = BartModel.from_pretrained(tmp_path / "lm")
    assert torch.equal(back.encoder.layers[0].fc1.weight, bare.encoder.layers[0].fc1.weight)
    # A classifier starts its head fresh from an LM checkpoint.
    clf = BartForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2)
    assert clf.classification_head.out_proj.weight.shape == (2, 128)
    # Post-LN weights into a Pre-LN config: the final norms are missing, and the hint says why.
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    config["normalize_before"] = True
    (tmp_path / "lm" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="disagree on normalize_before"):
        BartForConditionalGeneration.from_pretrained(tmp_path / "lm")


def test_saved_file_has_one_embedding_matrix(tmp_path):
    from safetensors.torch import load_file

    BartForConditionalGeneration(tiny()).save_pretrained(tmp_path)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "model.shared.weight" in names and "final_logits_bias" in names
    assert not {"lm_head.weight", "model.encoder.embed_tokens.weight",
                "model.decoder.embed_tokens.weight"} & names


def test_flop_count_equals_torch_flop_counter():
    """The documented encoder-decoder FLOP count (benchmark MFU) equals what torch's FLOP counter
    measures for a forward pass (math attention, so the attention matmuls are visible), / 3."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from bertforge.train.flops import seq2seq_train_flops

    config = tiny(encoder_ffn_dim=256, decoder_ffn_dim=384, decoder_layers=3)
    model = BartForConditionalGeneration(config).eval()
    src, dec = torch.randint(5, 61, (2, 24)), torch.randint(5, 61, (2, 16))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        model(src, None, dec, target_positions=torch.ones(2, 16, dtype=torch.bool))
    expected = seq2seq_train_flops(config, torch.tensor([24, 24]), torch.tensor([16, 16])) / 3
    assert counter.get_total_flops() == expected
