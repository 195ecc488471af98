"""MFU's denominator: the peak FLOP/s looked up from the name CUDA reports for a GPU."""

from __future__ import annotations

import pytest

from bertforge.train.flops import peak_for_name


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989),      # SXM
    ("NVIDIA H100 PCIe", "bf16", 756),
    ("NVIDIA H100 NVL", "bf16", 835),
    ("NVIDIA H100 NVL", "fp32", 417.5),
    ("NVIDIA H200", "bf16", 989),
    ("NVIDIA H200 NVL", "fp16", 835),
    ("NVIDIA GH200 480GB", "bf16", 989),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312),
    ("NVIDIA A100 80GB PCIe", "fp32", 156),
    ("NVIDIA A10", "bf16", 125),
    ("NVIDIA L40S", "bf16", 362),
    ("NVIDIA L40", "bf16", 181),
    ("NVIDIA L4", "bf16", 121),
    ("Tesla V100-SXM2-32GB", "fp16", 125),
    ("Tesla V100-PCIE-16GB", "fp16", 112),
])
def test_each_form_of_a_chip_has_its_own_peak(name, precision, tflops) -> None:
    assert peak_for_name(name, precision) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name, precision", [
    ("Tesla V100-SXM2-32GB", "bf16"),   # no bf16 tensor cores
    ("NVIDIA GeForce RTX 4090", "bf16"),  # not in the table: MFU is not computed
    ("NVIDIA A1000", "bf16"),             # a name that merely contains "A100"
])
def test_unknown_peaks_are_none(name, precision) -> None:
    assert peak_for_name(name, precision) is None


# --- ModernBERT's count ----------------------------------------------------------------------------


def tiny_modernbert(**overrides):
    from bertforge.models.modernbert_config import ModernBertConfig

    fields = dict(vocab_size=64, hidden_size=8, intermediate_size=12, num_hidden_layers=3,
                  num_attention_heads=2, local_attention=4, pad_token_id=0, eos_token_id=1,
                  bos_token_id=2, cls_token_id=2, sep_token_id=1)
    return ModernBertConfig(**{**fields, **overrides})


def test_window_pairs_counts_the_band_of_each_sequence() -> None:
    from bertforge.train.flops import window_pairs

    for window in (0, 1, 2, 5):
        for length in range(1, 20):
            brute = sum(abs(i - j) <= window for i in range(length) for j in range(length))
            assert window_pairs(length, window) == brute, (length, window)


def test_modernbert_count_matches_a_hand_computation() -> None:
    """Layers global, local, local (every third global), H 8, I 12, V 64, window 2 each side;
    one sequence of 5 real tokens (one padding column) with 2 masked positions."""
    import torch

    from bertforge.train.flops import batch_train_flops

    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    predicted = torch.tensor([[False, True, False, False, True, False]])
    dense = 8 * 5 * 8 * 8 + 6 * 5 * 8 * 12      # Wqkv + Wo, GeGLU Wi (2 x 12) + Wo: 5440
    global_attention = 4 * 8 * 5 * 5             # QK^T and PV over 25 pairs: 800
    local_attention = 4 * 8 * (3 + 4 + 5 + 4 + 3)  # keys per query within |i - j| <= 2: 608
    head = 2 * 2 * 8 * 8 + 2 * 2 * 8 * 64        # dense and decoder at the 2 masked tokens
    forward = 3 * dense + global_attention + 2 * local_attention + head
    assert forward == 20640
    assert batch_train_flops(tiny_modernbert(), mask, predicted) == 3 * forward
    # nsp means nothing to ModernBERT (no pooler, no NSP head)
    assert batch_train_flops(tiny_modernbert(), mask, predicted, nsp=True) == 3 * forward
    # the comparison count: sliding-window layers scored as if global (25 pairs each)
    full = 3 * dense + 3 * global_attention + head
    assert batch_train_flops(tiny_modernbert(), mask, predicted, windowed=False) == 3 * full


def test_modernbert_windows_are_per_sequence_and_follow_layer_types() -> None:
    """A 3-token sequence fits in the window (9 pairs in every layer); an explicit layer_types
    list decides which layers are global; packed rows count each sequence on its own."""
    import torch

    from bertforge.ops.unpad import token_layout
    from bertforge.train.flops import batch_train_flops

    config = tiny_modernbert(layer_types=["sliding_attention", "sliding_attention",
                                          "full_attention"])
    dense = 8 * 3 * 8 * 8 + 6 * 3 * 8 * 12
    short = 3 * (3 * dense + 3 * 4 * 8 * 9)
    assert batch_train_flops(config, torch.tensor([[1, 1, 1, 0]])) == short
    long_dense = 8 * 6 * 8 * 8 + 6 * 6 * 8 * 12
    long = 3 * (3 * long_dense + 4 * 8 * 36 + 2 * 4 * 8 * (6 * 5 - 2 * 3))
    rows = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert batch_train_flops(config, rows) == short + long
    packed_mask = torch.ones(1, 9, dtype=torch.long)
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 5]])
    layout = token_layout(packed_mask, positions)
    assert batch_train_flops(config, packed_mask, layout=layout) == short + long


def test_bert_configs_keep_the_bert_count() -> None:
    import torch

    from bertforge.models.config import BertConfig
    from bertforge.train.flops import batch_train_flops, bert_train_flops

    config = BertConfig(vocab_size=64, hidden_size=8, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=16)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    expected = bert_train_flops(layers=2, hidden=8, intermediate=16,
                                vocab=config.padded_vocab_size, seq_len=4, predictions=1,
                                nsp=True)
    assert batch_train_flops(config, mask, mask.bool() & (torch.arange(5) == 2), True) == expected


def test_last_layer_is_counted_where_the_heads_read_it() -> None:
    """A hand count of a 2-layer model (H 8, I 16) on one 4-token sequence whose last layer
    runs its queries and feed-forward block at the first token and one masked position."""
    import torch

    from bertforge.models.config import BertConfig
    from bertforge.train.flops import batch_train_flops, bert_train_flops

    h, i, s, v = 8, 16, 4, 64
    full_layer = 8 * s * h * h + 4 * s * h * i + 4 * s * s * h
    last = 4 * s * h * h + 2 * (4 * h * h + 4 * h * i + 4 * s * h)  # 2 query tokens
    heads = 2 * h * h + 2 * h * v + 2 * h * h + 4 * h             # MLM at 1 position, NSP
    got = bert_train_flops(layers=2, hidden=h, intermediate=i, vocab=v, seq_len=s,
                           predictions=1, nsp=True, last_queries=2)
    assert got == 3.0 * (full_layer + last + heads)
    everything = bert_train_flops(layers=2, hidden=h, intermediate=i, vocab=v, seq_len=s,
                                  predictions=1, nsp=True)
    assert everything == bert_train_flops(layers=2, hidden=h, intermediate=i, vocab=v,
                                          seq_len=s, predictions=1, nsp=True, last_queries=s)
    config = BertConfig(vocab_size=v, hidden_size=h, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=i)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    predicted = mask.bool() & (torch.arange(5) == 2)
    assert batch_train_flops(config, mask, predicted, True, read="predicted") == got
    classifier = batch_train_flops(config, mask, read="first")
    assert classifier == 3.0 * (full_layer + 4 * s * h * h + 4 * h * h + 4 * h * i + 4 * s * h)


# --- the counts of each family, as they were before the family records gave the shapes --------
# (issue 39: flops.py reads ``FamilySpec.shape`` instead of telling families apart by
# ``model_type``; these numbers were captured from the code before that change)


def golden_batch():
    """Rows of 100, 128 and 7 real tokens (width 128) with every fifth token from the fourth
    masked while real; one packed row of sequences of 5, 3 and 4 tokens, 3 masked."""
    import torch

    mask = torch.tensor([[1] * 100 + [0] * 28, [1] * 128, [1] * 7 + [0] * 121])
    predicted = torch.zeros_like(mask, dtype=torch.bool)
    predicted[:, 3:40:5] = True
    packed = torch.ones(1, 12, dtype=torch.long)
    packed_predicted = torch.zeros(1, 12, dtype=torch.bool)
    packed_predicted[0, [1, 6, 9]] = True
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    return mask, predicted & mask.bool(), packed, packed_predicted, positions


@pytest.mark.parametrize("model, nsp, windowed, read, flops", [
    ("bert-base-uncased", True, True, None, 125143391232),
    ("bert-base-uncased", True, True, "predicted", 117310095360),
    ("bert-base-uncased", False, True, "first", 116680955904),
    ("bert-large-uncased", False, True, None, 436896694272),
    ("bert-large-uncased", True, True, "predicted", 423089553408),
    ("bert-tiny", True, True, None, 1036180992),
    ("modernbert-base", False, True, None, 164201232384),
    # no NSP head and no partial last layer in ModernBERT: nsp and read change nothing
    ("modernbert-base", True, True, "predicted", 164201232384),
    ("modernbert-base", False, False, None, 164884027392),
    ("modernbert-large", False, True, None, 497128488960),
    ("modernbert-tiny", False, True, None, 502599936),
])
def test_encoder_counts_are_unchanged(model, nsp, windowed, read, flops) -> None:
    from bertforge.models.registry import resolve_config
    from bertforge.train.flops import batch_train_flops

    mask, predicted, *_ = golden_batch()
    config = resolve_config(model)[1]
    assert batch_train_flops(config, mask, predicted, nsp, windowed=windowed, read=read) == flops


@pytest.mark.parametrize("model, packed, choices, unmasked", [
    ("bert-base-uncased", 6564105216, 114229352448, 122681143296),
    ("bert-large-uncased", 22358495232, 418683052032, 433601150976),
    ("modernbert-base", 8658432000, 160195442688, 160195442688),
    ("modernbert-tiny", 65733120, 173379840, 173379840),
])
def test_packed_multiple_choice_and_unmasked_counts_are_unchanged(model, packed, choices,
                                                                  unmasked) -> None:
    from bertforge.models.registry import resolve_config
    from bertforge.ops.unpad import token_layout
    from bertforge.train.flops import batch_train_flops

    mask, _, packed_mask, packed_predicted, positions = golden_batch()
    config = resolve_config(model)[1]
    layout = token_layout(packed_mask, positions)
    assert batch_train_flops(config, packed_mask, packed_predicted, True, layout=layout) == packed
    assert batch_train_flops(config, mask.reshape(1, 3, 128), read="first") == choices
    assert batch_train_flops(config, mask) == unmasked


@pytest.mark.parametrize("model, flops", [("bart-base", 159560769024),
                                          ("bart-large", 480324372480),
                                          ("bart-large-preln", 480324372480),
                                          ("bart-tiny", 7581904128)])
def test_encoder_decoder_counts_are_unchanged(model, flops) -> None:
    import torch

    from bertforge.models.registry import resolve_config
    from bertforge.train.flops import seq2seq_train_flops

    config = resolve_config(model)[1]
    assert seq2seq_train_flops(config, torch.tensor([100, 7, 128]),
                               torch.tensor([30, 5, 128])) == flops


def test_bart_matches_a_hand_count() -> None:
    """d 8, encoder 1 layer (F 16), decoder 2 layers (F 12), V 50; a 3-token source, 2-token
    target."""
    import torch

    from bertforge.models.bart_config import BartConfig
    from bertforge.train.flops import seq2seq_train_flops

    config = BartConfig(vocab_size=50, d_model=8, encoder_layers=1, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=16, decoder_ffn_dim=12, max_position_embeddings=16)
    d, s, t = 8, 3, 2
    encoder = 8 * s * d * d + 4 * s * d * 16 + 4 * s * s * d
    decoder = 2 * (8 * t * d * d + 4 * t * t * d + 4 * t * d * d + 4 * s * d * d
                   + 4 * t * s * d + 4 * t * d * 12)
    expected = 3 * (encoder + decoder + 2 * t * d * 50)
    assert seq2seq_train_flops(config, torch.tensor([s]), torch.tensor([t])) == expected


def test_the_count_of_the_wrong_kind_of_model_is_refused() -> None:
    import torch

    from bertforge.models.registry import resolve_config
    from bertforge.train.flops import batch_train_flops, seq2seq_train_flops

    with pytest.raises(ValueError, match="BartConfig is an encoder-decoder: count it with "
                                         "seq2seq_train_flops"):
        batch_train_flops(resolve_config("bart-tiny")[1], torch.ones(1, 4))
    with pytest.raises(ValueError, match="BertConfig has no decoder"):
        seq2seq_train_flops(resolve_config("bert-tiny")[1], torch.tensor([4]), torch.tensor([4]))


def test_flops_reads_the_family_record_not_model_types() -> None:
    """Issue 39: no family is told apart by name in the count; the record's shape decides."""
    import ast
    from pathlib import Path

    import bertforge.train.flops as flops

    source = Path(flops.__file__).read_text(encoding="utf-8")
    names = {"bert", "bart", "modernbert", "BERT", "BART", "ModernBERT"}
    compared = [node.lineno for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Compare)
                and any(isinstance(c, ast.Constant) and c.value in names
                        for c in (node.left, *node.comparators))]
    assert "model_type" not in source and compared == []
