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
