"""Unpadding and packing change where the work happens, never the result.

* unpadded == padded: outputs at real tokens and every gradient, fp32, BERT (post-LN and pre-LN,
  with and without a pooler, MLM at bool or flat positions) and BART's encoder, through each
  varlen backend that runs on a CPU (``padded`` and PyTorch's ``nested``);
* packed == separate: the same samples packed several per row give the losses and gradients of
  the same samples one per row, on the unpadded path and on the padded path (block-diagonal
  mask), with position ids restarting per sequence;
* the layout the loader ships equals the one the model computes, and first fit decreasing packs
  every sequence exactly once within the row width.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.data.collate.mlm import collate_rows
from bertforge.data.packing import first_fit_decreasing, packing_efficiency
from bertforge.models import BertConfig, BertForMaskedLM, BertForPreTraining
from bertforge.models.bart import BartForConditionalGeneration
from bertforge.models.bart_config import BartConfig
from bertforge.ops.attention import varlen_attention
from bertforge.ops.unpad import TokenLayout, layout_from_batch, packed_keep_mask, token_layout
from bertforge.tasks.mlm import pretraining_loss
from bertforge.speed import set_gradient_checkpointing, set_unpadding

CPU_BACKENDS = ("padded", "nested")
TOL = dict(atol=2e-5, rtol=1e-4)


def bert_config(**kw) -> BertConfig:
    base = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=40, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)
    return BertConfig(**{**base, **kw})


def padded_batch(lengths: list[int], width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ids = torch.randint(5, 97, (b, width), generator=g)
    mask = torch.zeros(b, width, dtype=torch.long)
    types = torch.zeros(b, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        types[i, n // 2:n] = 1
    ids[mask == 0] = 0
    predicted = (torch.rand(b, width, generator=g) < 0.3) & mask.bool()
    predicted[:, 0] = True  # every row predicts something; padding never
    predicted &= mask.bool()
    labels = torch.where(predicted, torch.randint(5, 97, (b, width), generator=g), -100)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
            "mlm_labels": labels, "nsp_labels": torch.randint(0, 2, (b,), generator=g)}


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], **TOL, msg=name)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("pre_layernorm", [False, True])
def test_unpadded_bert_equals_padded_outputs_and_gradients(backend, pre_layernorm) -> None:
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config(pre_layernorm=pre_layernorm))
    batch = padded_batch([23, 7, 40, 1, 16], width=40)
    runs = []
    for unpad in (False, True):
        model.zero_grad()
        set_unpadding(model, unpad, backend)
        out = pretraining_loss(model, batch)
        out.loss.backward()
        runs.append((out.loss.detach(), out.stats, grads(model)))
    (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = runs
    torch.testing.assert_close(loss_a, loss_b, **TOL)
    assert stats_a.keys() == stats_b.keys()
    assert_grads_close(grads_a, grads_b)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_unpadded_hidden_states_equal_at_real_tokens_and_are_zero_at_padding(backend) -> None:
    torch.manual_seed(1)
    model = BertForPreTraining(bert_config()).eval()
    batch = padded_batch([12, 30, 5], width=32)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    padded = model.bert(*args)
    set_unpadding(model, True, backend)
    unpadded = model.bert(*args)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(unpadded.last_hidden_state[real], padded.last_hidden_state[real],
                               **TOL)
    assert (unpadded.last_hidden_state[~real] == 0).all()
    torch.testing.assert_close(unpadded.pooler_output, padded.pooler_output, **TOL)
    # MLM logits at bool positions and at the same flat positions agree with the padded model
    positions = batch["mlm_labels"] != -100
    flat = positions.reshape(-1).nonzero().squeeze(1)
    set_unpadding(model, False)
    ref = model(*args, masked_positions=positions).mlm_logits
    set_unpadding(model, True, backend)
    torch.testing.assert_close(model(*args, masked_positions=positions).mlm_logits, ref, **TOL)
    torch.testing.assert_close(model(*args, masked_positions=flat).mlm_logits, ref, **TOL)


def test_unpadded_masked_lm_without_pooler_and_with_gradient_checkpointing() -> None:
    torch.manual_seed(2)
    model = BertForMaskedLM(bert_config(hidden_dropout_prob=0.1))
    batch = padded_batch([9, 33, 17, 2], width=40)
    runs = []
    for unpad in (False, True):
        model.zero_grad()
        set_unpadding(model, unpad)
        set_gradient_checkpointing(model, unpad)
        torch.manual_seed(5)  # dropout draws differ with the layout: compare in eval mode
        model.eval()
        out = pretraining_loss(model, batch)
        out.loss.backward()
        runs.append((out.loss.detach(), grads(model)))
    torch.testing.assert_close(runs[0][0], runs[1][0], **TOL)
    assert_grads_close(runs[0][1], runs[1][1])


@pytest.mark.parametrize("normalize_before", [False, True])
def test_unpadded_bart_encoder_equals_padded(normalize_before) -> None:
    torch.manual_seed(3)
    cfg = BartConfig(vocab_size=120, d_model=32, encoder_layers=2, decoder_layers=2,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
                     attention_dropout=0.0, activation_dropout=0.0,
                     normalize_before=normalize_before)
    model = BartForConditionalGeneration(cfg)
    b, s = 4, 24
    ids = torch.randint(4, 120, (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    for i, n in enumerate((24, 6, 17, 11)):
        mask[i, n:] = 0
    ids[mask == 0] = cfg.pad_token_id
    decoder = torch.randint(4, 120, (b, 10))
    runs = []
    for backend in (None, *CPU_BACKENDS):
        model.zero_grad()
        set_unpadding(model, backend is not None, backend or "auto")
        out = model(ids, mask, decoder)
        out.logits.square().mean().backward()
        encoded = out.encoder_last_hidden_state
        runs.append((out.logits.detach(), encoded.detach(), grads(model)))
    logits, encoded, ref_grads = runs[0]
    real = mask.bool()
    for other_logits, other_encoded, other_grads in runs[1:]:
        torch.testing.assert_close(other_logits, logits, **TOL)
        torch.testing.assert_close(other_encoded[real], encoded[real], **TOL)
        assert (other_encoded[~real] == 0).all()
        assert_grads_close(other_grads, ref_grads)


def test_token_layout_of_padded_and_packed_rows() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    layout = token_layout(mask)
    assert layout.indices.tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 10, 11]
    assert layout.cu_seqlens.tolist() == [0, 3, 6, 10] and layout.max_seqlen == 4
    assert layout.min_seqlen == 3
    # left padding keeps column positions, as the padded model does
    assert layout.positions.tolist() == [0, 1, 2, 1, 2, 3, 0, 1, 2, 3]
    positions = torch.tensor([[0, 1, 0, 0], [0, 0, 1, 2], [0, 1, 0, 1]])
    packed = token_layout(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]), positions)
    assert packed.cu_seqlens.tolist() == [0, 2, 3, 4, 7, 9, 11] and packed.max_seqlen == 3
    assert packed.min_seqlen == 1
    assert packed.sequence_of_token().tolist() == [0, 0, 1, 2, 3, 3, 3, 4, 4, 5, 5]
    keep = packed_keep_mask(packed)[:, 0]
    assert keep[0].tolist() == [[True, True, False, False], [True, True, False, False],
                                [False, False, True, False], [False, False, False, True]]


def test_varlen_backends_equal_attention_per_sequence() -> None:
    torch.manual_seed(4)
    lengths = [7, 1, 12, 5, 64, 33, 96, 40]  # several length buckets, one of full rows (64, 96)
    mask = torch.zeros(len(lengths), 96, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    layout = token_layout(mask)
    q, k, v = (torch.randn(sum(lengths), 2, 8, requires_grad=True) for _ in range(3))
    want = []
    for a, b in zip(layout.cu_seqlens[:-1].tolist(), layout.cu_seqlens[1:].tolist()):
        heads = [x[a:b].transpose(0, 1)[None] for x in (q, k, v)]
        want.append(torch.nn.functional.scaled_dot_product_attention(*heads)[0].transpose(0, 1))
    want = torch.cat(want)
    weights = torch.randn_like(want)  # a loss that weighs every output differently
    want_grads = torch.autograd.grad((want * weights).sum(), (q, k, v))
    for backend in CPU_BACKENDS:
        got = varlen_attention(q, k, v, layout, backend=backend)
        torch.testing.assert_close(got, want, **TOL)
        grads = torch.autograd.grad((got * weights).sum(), (q, k, v))
        for g, w in zip(grads, want_grads):  # padding slots read real tokens: exact zeros back
            torch.testing.assert_close(g, w, **TOL)
    with pytest.raises(ValueError, match="flash backend needs"):
        varlen_attention(q, k, v, layout, backend="flash")
    with pytest.raises(ValueError, match="torch-flash backend needs a CUDA GPU"):
        varlen_attention(q, k, v, layout, backend="torch-flash")
    with pytest.raises(ValueError, match="not one of"):
        varlen_attention(q, k, v, layout, backend="fast")


def masked_rows(lengths: list[int], seed: int = 0) -> list[tuple]:
    """Rows as the loader masks them: (ids, types, labels, nsp)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in lengths:
        ids = rng.integers(5, 97, n)
        types = (np.arange(n) >= n // 2).astype(np.int64)
        labels = np.where(rng.random(n) < 0.3, rng.integers(5, 97, n), -100)
        labels[min(1, n - 1)] = 7
        rows.append((ids, types, labels, int(rng.integers(0, 2))))
    return rows


@pytest.mark.parametrize("unpad", [True, False])
def test_packed_rows_train_like_separate_rows(unpad) -> None:
    torch.manual_seed(6)
    model = BertForPreTraining(bert_config())
    set_unpadding(model, unpad)
    lengths = [30, 3, 12, 25, 8, 18, 5, 40, 2]
    rows = masked_rows(lengths)
    separate = collate_rows(rows, pad_id=0, pad_to_multiple_of=8)
    packed = collate_rows(rows, pad_id=0, pad_to_multiple_of=8, pack_width=40)
    assert packed["input_ids"].shape[0] < len(rows) and packed["input_ids"].shape[1] == 40
    assert packed["attention_mask"].sum() == sum(lengths)
    runs = []
    for batch in (separate, packed):
        model.zero_grad()
        out = pretraining_loss(model, batch)
        out.loss.backward()
        assert out.sequences == len(rows)
        runs.append((out.stats, grads(model)))
    fill = [stats.pop("row_fill") for stats, _ in runs]  # what packing changes: the row fill
    assert float(fill[0]) == pytest.approx(sum(lengths) / (len(rows) * 40))
    assert float(fill[1]) == pytest.approx(sum(lengths) / (packed["input_ids"].shape[0] * 40))
    assert fill[1] > fill[0]
    for key in runs[0][0]:
        torch.testing.assert_close(runs[1][0][key], runs[0][0][key], **TOL, msg=key)
    assert_grads_close(runs[1][1], runs[0][1])


def test_packed_batch_layout_and_positions() -> None:
    rows = masked_rows([5, 3, 4, 6])
    batch = collate_rows(rows, pad_id=0, pad_to_multiple_of=8, pack_width=8)
    # first fit decreasing, longest first: 6 opens row 0, 5 opens row 1 (6 + 5 > 8), 4 opens
    # row 2 (no room in rows 0 and 1), 3 joins row 1: rows (6), (5, 3), (4)
    assert batch["attention_mask"].sum(1).tolist() == [6, 8, 4]
    assert batch["position_ids"].tolist()[1] == [0, 1, 2, 3, 4, 0, 1, 2]
    # nsp labels follow the sequences' row-major order: samples 3, 0, 1, 2
    assert batch["nsp_labels"].tolist() == [rows[i][3] for i in (3, 0, 1, 2)]
    shipped = layout_from_batch(batch)
    computed = token_layout(batch["attention_mask"], batch["position_ids"])
    for name in ("indices", "cu_seqlens", "positions"):
        assert torch.equal(getattr(shipped, name), getattr(computed, name)), name
    assert shipped.max_seqlen == computed.max_seqlen == 6
    assert shipped.min_seqlen == computed.min_seqlen == 3
    assert shipped.shape == computed.shape == (3, 8)


def test_first_fit_decreasing_places_every_sequence_once() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 129, 500)
    rows = first_fit_decreasing(lengths, 128)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(500))
    assert all(lengths[row].sum() <= 128 for row in rows)
    assert rows == first_fit_decreasing(lengths, 128)  # deterministic
    # a lower bound on rows is total / width; first fit decreasing stays close to it
    assert len(rows) <= 1.1 * lengths.sum() / 128 + 1
    assert 0.9 < packing_efficiency(lengths, 128) <= 1.0
    with pytest.raises(ValueError, match="does not fit in rows of 16"):
        first_fit_decreasing([3, 17], 16)


def test_layout_moves_with_the_batch() -> None:
    layout = token_layout(torch.tensor([[1, 1, 0], [1, 0, 0]]))
    moved = layout.to(torch.device("cpu"))
    assert isinstance(moved, TokenLayout) and torch.equal(moved.indices, layout.indices)
    x = torch.arange(3 * 2, dtype=torch.float32).view(3, 2)
    assert layout.pad(x).tolist() == [[[0, 1], [2, 3], [0, 0]], [[4, 5], [0, 0], [0, 0]]]
    assert torch.equal(layout.unpad(layout.pad(x)), x)


def test_flop_count_is_per_sequence_whether_packed_or_not() -> None:
    from bertforge.train.flops import batch_train_flops

    config = bert_config()
    rows = masked_rows([30, 3, 12, 25, 8])
    counts = []
    for pack in (None, 40):
        batch = collate_rows(rows, pad_id=0, pad_to_multiple_of=8, pack_width=pack)
        counts.append(batch_train_flops(config, batch["attention_mask"],
                                        batch["mlm_labels"].ne(-100), True,
                                        layout_from_batch(batch)))
    plain = collate_rows(rows, pad_id=0, pad_to_multiple_of=8)
    without_layout = batch_train_flops(config, plain["attention_mask"],
                                       plain["mlm_labels"].ne(-100), True)
    assert counts[0] == pytest.approx(counts[1], rel=1e-12) == without_layout


def test_nested_backend_kernel_checks_read_nothing_from_the_device() -> None:
    """What PyTorch does before a fused varlen kernel runs on jagged inputs (the flash and
    memory-efficient eligibility checks, then the varlen preprocessing) must not read a length
    back from the device: the nested tensors carry the loader's host-side shortest and longest
    lengths. Without ``min_seqlen`` each of q, k and v costs one read per check (three per layer
    on a GPU). The same functions run on a CPU, so the count is checked here."""
    from torch.backends.cuda import SDPAParams
    from torch.nested._internal import sdpa

    from bertforge.ops.attention import nested_heads
    from bertforge.train.syncs import SyncCounter

    rows = masked_rows([9, 3, 16, 7])
    layout = layout_from_batch(collate_rows(rows, pad_id=0, pad_to_multiple_of=8))
    q, k, v = (torch.randn(layout.num_tokens, 2, 8, requires_grad=True) for _ in range(3))
    with SyncCounter("cpu") as counter:
        nq, nk, nv = (nested_heads(x, layout) for x in (q, k, v))
        params = SDPAParams(nq, nk, nv, None, 0.0, False, False)
        assert sdpa._can_use_flash_sdpa_jagged(params)
        assert sdpa._can_use_efficient_sdpa_jagged(params)
        sdpa._sdpa_nested_preprocessing(nq, nk, nv)
    assert counter.total == 0, dict(counter.counts)
    assert (nq._get_min_seqlen(), nq._get_max_seqlen()) == (3, 16)


@pytest.mark.parametrize("unpadded", [False, True])
def test_cpu_half_precision_attention_runs_in_fp32(unpadded) -> None:
    """Under bf16 autocast on a CPU, attention gets fp32 inputs (PyTorch's CPU attention is slower
    in bf16) and hands back bf16: the result equals fp32 attention of the same bf16 inputs,
    rounded once, in both layouts; gradients reach the bf16 inputs."""
    from bertforge.ops.attention import attend

    torch.manual_seed(0)
    lengths = [5, 9, 3]
    mask = torch.zeros(3, 9, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    layout = token_layout(mask)
    shape = (sum(lengths), 2, 8) if unpadded else (3, 9, 2, 8)
    q, k, v = (torch.randn(shape).bfloat16().requires_grad_() for _ in range(3))
    where = layout if unpadded else mask.bool()[:, None, None, :]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(q, k, v, where)
    with torch.autocast("cpu", enabled=False):
        want = attend(q.detach().float(), k.detach().float(), v.detach().float(),
                      where)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want.bfloat16())
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.bfloat16


def test_auto_backend_on_cuda_prefers_a_fused_kernel(monkeypatch) -> None:
    """What ``auto`` resolves to on a CUDA device (no GPU needed: the device checks are stubbed):
    the flash-attn package when installed, else PyTorch's own flash kernel where it runs (half
    precision, head size a multiple of 8 up to 256, compute capability 8.0+), else nested."""
    from bertforge.ops import attention

    cuda, half = torch.device("cuda"), torch.bfloat16
    monkeypatch.setattr(attention, "_flash_varlen", lambda: None)
    monkeypatch.setattr(attention, "_torch_flash_device", lambda device: True)
    assert attention.resolve_backend("auto", cuda, half, 64) == "torch-flash"
    assert attention.resolve_backend("auto", cuda, half) == "torch-flash"
    assert attention.resolve_backend("auto", cuda, torch.float32, 64) == "nested"
    for odd in (36, 320):
        assert attention.resolve_backend("auto", cuda, half, odd) == "nested"
        with pytest.raises(ValueError, match="multiple of 8 up to 256"):
            attention.resolve_backend("torch-flash", cuda, half, odd)
    assert attention.resolve_backend("auto", torch.device("cpu"), half, 64) == "padded"
    monkeypatch.setattr(attention, "_flash_varlen", lambda: object())
    assert attention.resolve_backend("auto", cuda, half, 64) == "flash"
    monkeypatch.setattr(attention, "_flash_varlen", lambda: None)
    monkeypatch.setattr(attention, "_torch_flash_device", lambda device: False)  # pre-Ampere
    assert attention.resolve_backend("auto", cuda, half, 64) == "nested"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["torch-flash", "nested"])
def test_cuda_varlen_backends_equal_attention_per_sequence_in_bf16(backend) -> None:
    """The CUDA kernels on bf16 tokens against fp32 attention of each sequence alone, outputs
    and the gradients of q, k and v, within bf16 rounding (relative error of the whole tensor)."""
    device = torch.device("cuda")
    torch.manual_seed(4)
    lengths = [7, 1, 12, 5, 64, 33, 96, 40]
    mask = torch.zeros(len(lengths), 96, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    layout = token_layout(mask.to(device))
    q, k, v = (torch.randn(sum(lengths), 4, 64, device=device).bfloat16().requires_grad_()
               for _ in range(3))
    weights = torch.randn(sum(lengths), 4, 64, device=device)
    out = varlen_attention(q, k, v, layout, backend=backend)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    (out.float() * weights).sum().backward()
    ref = [x.detach().float().requires_grad_() for x in (q, k, v)]
    want = []
    bounds = layout.cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        heads = [x[a:b].transpose(0, 1)[None] for x in ref]
        want.append(torch.nn.functional.scaled_dot_product_attention(*heads)[0].transpose(0, 1))
    want = torch.cat(want)
    (want * weights).sum().backward()
    assert rel_err(out, want) < 2e-2
    for got, x in zip((q, k, v), ref):
        assert rel_err(got.grad, x.grad) < 3e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_unpadded_bert_trains_like_the_padded_one_in_bf16() -> None:
    """BERT on the unpadded path with the backend ``auto`` picks on this GPU, against the padded
    path: the loss and every gradient within bf16 rounding."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = BertForPreTraining(bert_config(hidden_size=128, num_attention_heads=2,
                                           intermediate_size=256)).to(device)
    batch = {k: v.to(device) for k, v in padded_batch([23, 7, 40, 1, 16], width=40).items()}
    runs = []
    for unpad in (False, True):
        model.zero_grad()
        set_unpadding(model, unpad)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = pretraining_loss(model, batch)
        out.loss.backward()
        runs.append((out.loss.detach().float(), grads(model)))
    (loss_a, grads_a), (loss_b, grads_b) = runs
    assert abs(float(loss_a - loss_b)) < 2e-2 * abs(float(loss_a))
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        if name.endswith("key.bias"):  # softmax ignores it: its gradient is 0 plus rounding
            continue
        assert rel_err(grads_b[name], grads_a[name].float()) < 5e-2, name


def test_cpu_bf16_inference_attends_in_bf16_unless_a_float_bias() -> None:
    """Without autograd a bool mask (or none) keeps bf16 on a CPU (the forward kernel is faster
    in bf16); a float bias still takes the fp32 detour, with autograd or without."""
    from bertforge.ops.attention import sdpa

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8).bfloat16() for _ in range(3))
    keep = torch.rand(2, 1, 1, 6) > 0.3
    keep[..., 0] = True
    bias = torch.randn(2, 1, 6, 6)
    F = torch.nn.functional
    with torch.no_grad():
        for mask in (None, keep):
            assert torch.equal(sdpa(q, k, v, mask, 0.0),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias)
        assert torch.equal(sdpa(q, k, v, bias, 0.0), want.bfloat16())


@pytest.mark.parametrize("case", ["causal", "bias"])
def test_cpu_half_precision_sdpa_takes_causal_and_float_bias(case) -> None:
    """BART's causal attention and ModernBERT's window bias go through the same fp32 detour on a
    CPU: bf16 inputs under autocast give fp32 attention of those inputs, rounded once."""
    from bertforge.ops.attention import sdpa

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8).bfloat16() for _ in range(3))
    bias = torch.randn(2, 1, 6, 6).bfloat16() if case == "bias" else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v, bias, 0.0, is_causal=case == "causal")
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=None if bias is None else bias.float(),
        is_causal=case == "causal")
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want.bfloat16())
