"""fp32 parity of bertforge BART with transformers' BART (post-LN) and mBART (our Pre-LN layout).

Both directions through model directories, on random tiny configs whose every weight (biases,
LayerNorms and ``final_logits_bias`` included) is randomised with a large spread, so a weight
copied to the wrong place changes the outputs. Batches are padded on the right and on the left,
in the source and in the decoder input; only real positions are compared.
"""

from __future__ import annotations

import pytest
import torch

from bertforge.models.bart import (BartConfig, BartForConditionalGeneration,
                                   BartForSequenceClassification, BartModel)

transformers = pytest.importorskip("transformers")

TOL = 1e-5
SHAPES = [
    dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
         decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37),
    dict(vocab_size=71, d_model=48, encoder_layers=1, decoder_layers=3, encoder_attention_heads=3,
         decoder_attention_heads=6, encoder_ffn_dim=64, decoder_ffn_dim=20,
         activation_function="relu"),
]


def hf_classes(pre_ln: bool) -> tuple[type, dict[str, type]]:
    if pre_ln:
        return transformers.MBartConfig, {
            "BartModel": transformers.MBartModel,
            "BartForConditionalGeneration": transformers.MBartForConditionalGeneration,
            "BartForSequenceClassification": transformers.MBartForSequenceClassification}
    return transformers.BartConfig, {
        "BartModel": transformers.BartModel,
        "BartForConditionalGeneration": transformers.BartForConditionalGeneration,
        "BartForSequenceClassification": transformers.BartForSequenceClassification}


def randomize_(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if not tensor.is_floating_point():
                continue
            noise = torch.randn(tensor.shape, generator=gen)
            is_norm_scale = ("layer_norm" in name or "layernorm" in name) and name.endswith("weight")
            tensor.copy_(1.0 + 0.2 * noise if is_norm_scale else 0.15 * noise)


def hf_model(kind: str, shape: dict, pre_ln: bool, scale: bool, seed: int):
    config_cls, classes = hf_classes(pre_ln)
    config = config_cls(**shape, max_position_embeddings=40, dropout=0.0, scale_embedding=scale,
                        num_labels=4, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=2)
    torch.manual_seed(seed)
    model = classes[kind](config).eval()
    randomize_(model, seed)
    return model


def batch(vocab: int, left: bool, seed: int = 0):
    """Sources (3, 12) and decoder inputs (3, 9) with lengths 12/7/4 and 9/5/2, padded with <pad>=1
    on the right or the left; every source ends with </s> = 2."""
    gen = torch.Generator().manual_seed(seed)
    src_len, tgt_len = torch.tensor([12, 7, 4]), torch.tensor([9, 5, 2])

    def make(width: int, lengths: torch.Tensor, eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(3, vocab, (3, width), generator=gen)
        pos = torch.arange(width)[None, :]
        mask = (pos >= width - lengths[:, None]) if left else (pos < lengths[:, None])
        if eos:  # the last real token of every row
            last = torch.full((3,), width - 1) if left else lengths - 1
            ids[torch.arange(3), last] = 2
        return ids.masked_fill(~mask, 1), mask.long()

    src, src_mask = make(12, src_len, eos=True)
    dec, dec_mask = make(9, tgt_len, eos=False)
    return src, src_mask, dec, dec_mask


def roundtrip(hf, cls, tmp_path):
    hf.save_pretrained(tmp_path / "hf")
    ours = cls.from_pretrained(tmp_path / "hf")
    return ours


@pytest.mark.parametrize("shape", [0, 1])
@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("left", [False, True], ids=["right-pad", "left-pad"])
def test_conditional_generation_logits_match(tmp_path, shape, pre_ln, left):
    hf = hf_model("BartForConditionalGeneration", SHAPES[shape], pre_ln, scale=pre_ln, seed=shape)
    ours = roundtrip(hf, BartForConditionalGeneration, tmp_path)
    assert ours.config.normalize_before is pre_ln
    src, src_mask, dec, dec_mask = batch(SHAPES[shape]["vocab_size"], left)
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec,
                  decoder_attention_mask=dec_mask).logits
        got = ours(src, src_mask, dec, dec_mask).logits
    real = dec_mask.bool()
    assert want.abs()[real].max() > 1.0  # the comparison is not between near-zero outputs
    assert (got[real] - want[real]).abs().max() <= TOL
    # Scores at selected positions equal the full scores there.
    with torch.no_grad():
        picked = ours(src, src_mask, dec, dec_mask, target_positions=real).logits
    assert torch.equal(picked, got[real])


@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-ln", "pre-ln"])
def test_bare_model_and_classifier_match(tmp_path, pre_ln):
    shape = SHAPES[0]
    src, src_mask, dec, dec_mask = batch(shape["vocab_size"], left=False)
    hf = hf_model("BartModel", shape, pre_ln, scale=False, seed=3)
    ours = roundtrip(hf, BartModel, tmp_path / "model")
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec,
                  decoder_attention_mask=dec_mask)
        got = ours(src, src_mask, dec, dec_mask)
    real = dec_mask.bool()
    assert (got.last_hidden_state[real] - want.last_hidden_state[real]).abs().max() <= TOL
    enc_real = src_mask.bool()
    assert (got.encoder_last_hidden_state[enc_real]
            - want.encoder_last_hidden_state[enc_real]).abs().max() <= TOL

    # transformers' classifier needs the same number of </s> in every row: one, at the end.
    hf_cls = hf_model("BartForSequenceClassification", shape, pre_ln, scale=False, seed=4)
    ours_cls = roundtrip(hf_cls, BartForSequenceClassification, tmp_path / "cls")
    with torch.no_grad():
        want = hf_cls(input_ids=src, attention_mask=src_mask).logits
        got = ours_cls(src, src_mask).logits
    assert want.shape == got.shape == (3, 4)
    assert (got - want).abs().max() <= TOL


@pytest.mark.parametrize("pre_ln", [False, True], ids=["post-ln", "pre-ln"])
def test_transformers_loads_our_directory_whole(tmp_path, pre_ln):
    """Our save_pretrained -> transformers' from_pretrained: no missing, unexpected or mismatched
    keys, the right architecture, and the same logits."""
    config = BartConfig.from_preset("bart-tiny", vocab_size=97, normalize_before=pre_ln,
                                    scale_embedding=pre_ln, dropout=0.0)
    torch.manual_seed(0)
    ours = BartForConditionalGeneration(config).eval()
    randomize_(ours, 7)
    ours.save_pretrained(tmp_path)
    auto = transformers.AutoModelForSeq2SeqLM
    hf, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    expected = "MBartForConditionalGeneration" if pre_ln else "BartForConditionalGeneration"
    assert type(hf).__name__ == expected
    src, src_mask, dec, dec_mask = batch(97, left=False, seed=1)
    with torch.no_grad():
        want = hf.eval()(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec,
                         decoder_attention_mask=dec_mask).logits
        got = ours(src, src_mask, dec, dec_mask).logits
    real = dec_mask.bool()
    assert (got[real] - want[real]).abs().max() <= TOL


def test_incremental_decoding_equals_full_decoding(tmp_path):
    """decode_step over a KV cache, fed in uneven pieces, gives the teacher-forced logits."""
    hf = hf_model("BartForConditionalGeneration", SHAPES[0], False, scale=False, seed=5)
    ours = roundtrip(hf, BartForConditionalGeneration, tmp_path)
    src, src_mask, dec, _ = batch(SHAPES[0]["vocab_size"], left=False)
    with torch.no_grad():
        full = ours(src, src_mask, dec).logits
        encoded = ours.encode(src, src_mask)
        pieces, cache = [], None
        for start, end in ((0, 3), (3, 4), (4, 5), (5, 9)):
            logits, cache = ours.decode_step(dec[:, start:end], encoded, src_mask, cache)
            pieces.append(logits)
    assert cache.length == 9
    assert (torch.cat(pieces, 1) - full).abs().max() <= TOL
    # Reordering the cache reorders the rows of the next step.
    with torch.no_grad():
        order = torch.tensor([2, 0, 0])
        cache.reorder(order)
        extended = torch.cat([dec[order], torch.tensor([[5], [6], [7]])], dim=1)  # a 10th token
        nxt, _ = ours.decode_step(extended[:, 9:], encoded[order], src_mask[order], cache)
        again = ours(src[order], src_mask[order], extended).logits[:, 9:]
    assert (nxt - again).abs().max() <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_gpu_fp32_logits_and_beam_search_match_transformers(tmp_path):
    """On CUDA (flash / memory-efficient attention kernels): fp32 logits within 1e-4 of
    transformers', bf16 autocast within 0.05 of our fp32, and beam search token-identical."""
    from bertforge.models.generation import GenerationConfig, generate

    hf = hf_model("BartForConditionalGeneration", SHAPES[0], False, scale=False, seed=9)
    ours = roundtrip(hf, BartForConditionalGeneration, tmp_path).cuda()
    hf = hf.cuda()
    src, src_mask, dec, dec_mask = (t.cuda() for t in batch(SHAPES[0]["vocab_size"], left=False))
    real = dec_mask.bool()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec,
                  decoder_attention_mask=dec_mask).logits
        got = ours(src, src_mask, dec, dec_mask).logits
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = ours(src, src_mask, dec, dec_mask).logits.float()
    assert (got[real] - want[real]).abs().max() <= 1e-4
    assert (low[real] - got[real]).abs().max() <= 0.05 * got[real].abs().max()
    settings = dict(num_beams=4, length_penalty=2.0, min_length=5, max_length=16,
                    no_repeat_ngram_size=3, early_stopping=True)
    mine = generate(ours, src, src_mask, GenerationConfig.from_model_config(ours.config, **settings))
    theirs = hf.generate(input_ids=src, attention_mask=src_mask, **settings)
    assert mine.tolist() == theirs.tolist()


# ---------------------------------------------------------------------------------------------
# Generation: inputs that finish at very different steps leave the batch, and the tokens stay
# transformers' (greedy and beam search), through BART's own generation step and through the
# model's decode_step.

EOS_BIAS = 2.5  # on final_logits_bias[</s>]: some sequences end early, others run to the limit
GENERATION = {
    "greedy": dict(num_beams=1, max_length=30, min_length=3, no_repeat_ngram_size=3),
    "beam4-early": dict(num_beams=4, max_length=30, min_length=3, length_penalty=2.0,
                        no_repeat_ngram_size=3, early_stopping=True),
    "beam3-late-2seq": dict(num_beams=3, max_length=30, min_length=3, length_penalty=1.0,
                            early_stopping=False, num_return_sequences=2),
    "beam2-never": dict(num_beams=2, max_new_tokens=25, length_penalty=0.8,
                        early_stopping="never", repetition_penalty=1.3),
}


def uneven_sources(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(6, 30) sources of 30, 2, 17, 5, 24 and 9 tokens, each ending with </s>, padded."""
    gen = torch.Generator().manual_seed(11)
    lengths = torch.tensor([30, 2, 17, 5, 24, 9])
    ids = torch.randint(3, vocab, (6, 30), generator=gen)
    ids[torch.arange(6), lengths - 1] = 2
    mask = torch.arange(30)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, 1), mask.long()


@pytest.fixture(scope="module")
def generation_models(tmp_path_factory):
    hf = hf_model("BartForConditionalGeneration", SHAPES[0], False, scale=False, seed=21)
    with torch.no_grad():
        hf.final_logits_bias[0, 2] += EOS_BIAS
    hf.generation_config = transformers.GenerationConfig(
        bos_token_id=0, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2,
        forced_bos_token_id=0, forced_eos_token_id=2)
    directory = tmp_path_factory.mktemp("generation")
    hf.save_pretrained(directory)
    return hf, BartForConditionalGeneration.from_pretrained(directory).eval(), directory


class _GenericBart(BartForConditionalGeneration):
    """A subclass: generate decodes it through decode_step / reorder_cache, not BART's own
    generation step."""


@pytest.mark.parametrize("setting", list(GENERATION))
def test_generate_drops_finished_inputs_and_matches_transformers(generation_models, setting,
                                                                 monkeypatch):
    from bertforge.models.generation import GenerationConfig, bart_decoding, generate, search

    hf, ours, directory = generation_models
    ids, mask = uneven_sources(SHAPES[0]["vocab_size"])
    config = GenerationConfig.load(directory).replace(**GENERATION[setting])
    rows_per_step: list[int] = []
    step = bart_decoding.BartDecoding.step
    monkeypatch.setattr(bart_decoding.BartDecoding, "step", lambda self, tokens: (
        rows_per_step.append(tokens.shape[0]), step(self, tokens))[1])
    sequences, scores = generate(ours, ids, mask, config, return_scores=True)
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, **GENERATION[setting],
                             return_dict_in_generate=True, output_scores=True)
    assert sequences.tolist() == theirs.sequences.tolist()
    if config.num_beams > 1:
        assert torch.allclose(scores, theirs.sequences_scores, atol=1e-4)

    # The inputs finished at different steps (some by EOS, some at the limit), and each left
    # the batch: the steps ran on fewer and fewer rows, down to the last input's beams.
    beams = config.num_beams
    returned = config.num_return_sequences
    lengths = (sequences != 1).sum(dim=1).view(6, returned).max(dim=1).values
    assert len(set(lengths.tolist())) >= 3 and lengths.min() < lengths.max()
    assert rows_per_step[0] == 6  # one row per input until the first step chose the beams
    later = rows_per_step[1:]
    assert later[0] == 6 * beams and later == sorted(later, reverse=True)
    assert later[-1] < 6 * beams and all(n % beams == 0 for n in later)
    # One step per token of the longest output, none after it; none for a last token forced
    # to be EOS (the model's scores could not change it).
    longest = int(lengths.max())
    skipped = config.forced_eos_token_id is not None and longest == config.length_limits()[1]
    assert len(rows_per_step) == longest - 1 - skipped

    # The model's own decode_step path (a subclass) gives the same tokens and scores.
    generic = _GenericBart.from_pretrained(directory).eval()
    count = len(rows_per_step)
    again, again_scores = generate(generic, ids, mask, config, return_scores=True)
    assert len(rows_per_step) == count  # BART's generation step was not used
    assert again.tolist() == sequences.tolist()
    assert torch.allclose(again_scores, scores, atol=1e-5)

    # Reading the host every 4 steps (as on a GPU): done inputs ride along longer, same output.
    monkeypatch.setattr(search, "CHECK_EVERY", {"cpu": 4})
    late, late_scores = generate(ours, ids, mask, config, return_scores=True)
    assert late.tolist() == sequences.tolist()
    assert torch.allclose(late_scores, scores, atol=1e-5)
    assert sum(rows_per_step[count:]) >= sum(rows_per_step[:count])


@pytest.mark.parametrize("setting", ["greedy", "beam4-early"])
def test_generate_without_padding_matches_transformers(generation_models, setting):
    """No padding anywhere (attention_mask None): cross-attention runs unmasked."""
    from bertforge.models.generation import GenerationConfig, generate

    hf, ours, directory = generation_models
    ids = uneven_sources(SHAPES[0]["vocab_size"])[0][:, :12].clone()
    ids[ids < 3] = 3  # no <pad> or </s> inside
    ids[:, -1] = 2
    config = GenerationConfig.load(directory).replace(**GENERATION[setting])
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, **GENERATION[setting])
    assert generate(ours, ids, None, config).tolist() == theirs.tolist()
