"""Token-identical generation: bertforge's BART with bertforge's ``generate`` against transformers'
BART with transformers' ``generate``, greedy and beam search, on random tiny models; and
generation_config.json read and written both ways.

Our model is loaded from the directory transformers saved, so both sides hold the same weights.
Weights are drawn with a large spread and EOS gets a bias, so the sequences are varied and some
end early (their rows are padded) while others run into the length limit. Every setting is
passed to transformers explicitly, through the generation_config.json bertforge writes, and the
model's own generation defaults hold the special token ids only, so nothing is added on that
side.
"""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.models.generation import GENERATION_CONFIG_NAME, GenerationConfig, generate
from bertforge.models.bart import BartForConditionalGeneration

transformers = pytest.importorskip("transformers")

PAD, EOS = 1, 2
EOS_BIAS = 3.0  # added to final_logits_bias[</s>], so that some sequences end before the limit
# (shape, Pre-LN (mBART layout), scale_embedding, forced BOS id, seed)
MODELS = {
    "bart-2x2": (dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                      decoder_ffn_dim=37), False, False, 0, 0),
    "bart-1x3-relu": (dict(vocab_size=71, d_model=48, encoder_layers=1, decoder_layers=3,
                           encoder_attention_heads=3, decoder_attention_heads=6,
                           encoder_ffn_dim=64, decoder_ffn_dim=20, activation_function="relu"),
                      False, True, None, 1),
    "mbart-2x2": (dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                       decoder_ffn_dim=37), True, False, 0, 2),
}
SETTINGS = {
    "greedy": dict(num_beams=1, max_length=20, min_length=5, no_repeat_ngram_size=3),
    "greedy-new-tokens": dict(num_beams=1, max_new_tokens=16, min_new_tokens=3,
                              repetition_penalty=1.5),
    "beam4-lp2-early": dict(num_beams=4, length_penalty=2.0, max_length=20, min_length=5,
                            no_repeat_ngram_size=3, early_stopping=True),
    "beam3-lp1-late-2seq": dict(num_beams=3, length_penalty=1.0, max_length=20, min_length=5,
                                no_repeat_ngram_size=3, early_stopping=False,
                                num_return_sequences=2),
    "beam3-never-3seq": dict(num_beams=3, length_penalty=1.0, max_length=18, min_length=6,
                             early_stopping="never", num_return_sequences=3,
                             no_repeat_ngram_size=2),
    "beam2-repetition": dict(num_beams=2, max_new_tokens=12, min_new_tokens=4,
                             length_penalty=0.5, repetition_penalty=1.5),
    # Longer than the first key/value buffers of the cache (32 steps), which grow mid-run.
    "greedy-long": dict(num_beams=1, max_length=38, min_length=34, no_repeat_ngram_size=3),
    "beam3-long": dict(num_beams=3, length_penalty=1.0, max_length=38, min_length=34,
                       no_repeat_ngram_size=3, early_stopping=True),
}
# The settings under which some rows end with EOS before the limit. A repetition penalty also
# penalises EOS (it is the decoder start token, so already in every sequence): the others run
# to the limit, forced EOS included.
ENDS_EARLY = ("greedy", "beam4-lp2-early", "beam3-lp1-late-2seq", "beam3-never-3seq")


def hf_model(name: str):
    shape, pre_ln, scale, forced_bos, seed = MODELS[name]
    config_cls = transformers.MBartConfig if pre_ln else transformers.BartConfig
    model_cls = (transformers.MBartForConditionalGeneration if pre_ln
                 else transformers.BartForConditionalGeneration)
    config = config_cls(**shape, max_position_embeddings=40, dropout=0.0, scale_embedding=scale,
                        pad_token_id=PAD, bos_token_id=0, eos_token_id=EOS,
                        decoder_start_token_id=EOS)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            is_norm_scale = ("layer_norm" in pname or "layernorm" in pname) \
                and pname.endswith("weight")
            tensor.copy_(1.0 + 0.2 * noise if is_norm_scale else 0.15 * noise)
        model.final_logits_bias[0, EOS] += EOS_BIAS
    # The model's own defaults: the special ids only (save_pretrained writes them to
    # generation_config.json).
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=0, eos_token_id=EOS, pad_token_id=PAD, decoder_start_token_id=EOS,
        forced_bos_token_id=forced_bos, forced_eos_token_id=EOS)
    return model


def sources(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 11) inputs of 11, 7 and 3 tokens, each ending with </s>, padded with <pad>."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.tensor([11, 7, 3])
    ids = torch.randint(3, vocab, (3, 11), generator=gen)
    ids[torch.arange(3), lengths - 1] = EOS
    mask = torch.arange(11)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, PAD), mask.long()


@pytest.fixture(scope="module", params=list(MODELS))
def models(request, tmp_path_factory):
    hf = hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(directory)
    ours = BartForConditionalGeneration.from_pretrained(directory).eval()
    return hf, ours, GenerationConfig.load(directory)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_generate_is_token_identical_to_transformers(models, setting, tmp_path):
    hf, ours, saved = models
    ids, mask = sources(ours.config.vocab_size)
    config = saved.replace(**SETTINGS[setting])
    assert config.forced_bos_token_id == hf.generation_config.forced_bos_token_id
    sequences, scores = generate(ours, ids, mask, config, return_scores=True)

    config.save(tmp_path)
    theirs_config = transformers.GenerationConfig.from_pretrained(tmp_path)
    theirs_config.return_dict_in_generate = True
    theirs_config.output_scores = True
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, generation_config=theirs_config)
    assert sequences.shape == theirs.sequences.shape
    assert sequences.tolist() == theirs.sequences.tolist()
    if config.num_beams > 1:
        assert torch.allclose(scores, theirs.sequences_scores, atol=1e-4)

    # The comparison is between real sequences: several tokens long, not one token repeated,
    # different per input and per hypothesis, and (where expected) some ended by EOS and padded.
    returned = config.num_return_sequences
    shortest, longest = config.length_limits()
    assert sequences.shape[0] == 3 * returned and 6 < sequences.shape[1] <= longest
    assert (sequences[:, 0] == EOS).all()
    lengths = (sequences != PAD).sum(dim=1)
    assert (lengths >= shortest).all() and lengths.float().mean() > 6
    assert sequences[:, 1:].unique().numel() >= 5
    assert len({tuple(row.tolist()) for row in sequences[::returned]}) > 1
    for block in sequences.split(returned):
        assert len({tuple(row.tolist()) for row in block}) == returned
    if setting in ENDS_EARLY:
        assert (lengths < sequences.shape[1]).any()
        assert (sequences[lengths < sequences.shape[1], -1] == PAD).all()


def test_transformers_reads_our_generation_config(tmp_path):
    ours = GenerationConfig(max_length=None, max_new_tokens=40, min_new_tokens=2, num_beams=4,
                            length_penalty=2.0, early_stopping="never", no_repeat_ngram_size=3,
                            repetition_penalty=1.1, num_return_sequences=2, bos_token_id=0,
                            eos_token_id=2, pad_token_id=1, decoder_start_token_id=2,
                            forced_bos_token_id=0, forced_eos_token_id=2)
    ours.save(tmp_path)
    theirs = transformers.GenerationConfig.from_pretrained(tmp_path)
    for name in GenerationConfig.field_names():
        assert getattr(theirs, name) == getattr(ours, name), name
    theirs.validate(strict=True)


def test_we_read_a_generation_config_transformers_wrote(tmp_path):
    theirs = transformers.GenerationConfig(
        max_length=142, min_length=56, num_beams=4, length_penalty=2.0, early_stopping=True,
        no_repeat_ngram_size=3, bos_token_id=0, eos_token_id=2, pad_token_id=1,
        decoder_start_token_id=2, forced_bos_token_id=0, forced_eos_token_id=2,
        return_dict_in_generate=True, output_scores=True, use_cache=True)
    theirs.save_pretrained(tmp_path)
    written = json.loads((tmp_path / GENERATION_CONFIG_NAME).read_text())
    assert "transformers_version" in written and "output_scores" in written
    ours = GenerationConfig.load(tmp_path)
    assert ours == GenerationConfig(
        max_length=142, min_length=56, num_beams=4, length_penalty=2.0, early_stopping=True,
        no_repeat_ngram_size=3, bos_token_id=0, eos_token_id=2, pad_token_id=1,
        decoder_start_token_id=2, forced_bos_token_id=0, forced_eos_token_id=2)
    # A setting that changes the tokens and that bertforge lacks is refused, not ignored.
    transformers.GenerationConfig(num_beams=4, suppress_tokens=[5]).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="suppress_tokens=\\[5\\] is not supported"):
        GenerationConfig.load(tmp_path)
