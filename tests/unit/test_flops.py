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
