"""The encoder's last layer computed only where a head reads it (``bertforge.speed.use_partial_rows``, applied from outside)
and its kernel, :func:`bertforge.ops.attention.attend_at`: queries at some tokens only, over
the keys of their whole sequence. Outputs and gradients must equal the full computation's at
those tokens, for every layout (padded rows, unpadded tokens, packed rows)."""

from __future__ import annotations

import copy

import pytest
import torch

from bertforge.models import BertConfig, BertForSequenceClassification
from bertforge.models.bert import BertForMaskedLM, BertForMultipleChoice, BertForPreTraining
from bertforge.ops.attention import attend_at, varlen_attention
from bertforge.ops.unpad import token_layout
from bertforge.speed import apply_speed_options, read_positions, set_unpadding

TOL = dict(atol=2e-5, rtol=1e-4)
LENGTHS = [7, 1, 12, 5, 64, 33, 96, 40]  # several length buckets, one of full rows (64, 96)


def layout_of(lengths: list[int], device: str = "cpu"):
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return token_layout(mask.to(device))


def some_rows(layout, seed: int = 0) -> torch.Tensor:
    """Ascending token rows: ~30% of tokens, one repeated, and sequences 1 and 3 left with no
    query at all (whole buckets of them too)."""
    g = torch.Generator().manual_seed(seed)
    cu = layout.cu_seqlens.cpu()
    rows = (torch.rand(int(cu[-1]), generator=g) < 0.3).nonzero().squeeze(1)
    empty = torch.zeros_like(rows, dtype=torch.bool)
    for s in (1, 3):
        empty |= (rows >= cu[s]) & (rows < cu[s + 1])
    rows = rows[~empty]
    return torch.cat([rows, rows[2:3]]).sort().values


def test_attend_at_equals_full_attention_at_the_rows() -> None:
    torch.manual_seed(4)
    layout = layout_of(LENGTHS)
    rows = some_rows(layout)
    q, k, v = (torch.randn(sum(LENGTHS), 2, 8, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    weights = torch.randn(len(rows), 2, 8, dtype=torch.float64)
    want = varlen_attention(q, k, v, layout, backend="padded").index_select(0, rows)
    want_grads = torch.autograd.grad((want * weights).sum(), (q, k, v))
    got = attend_at(q.index_select(0, rows), k, v, layout, rows, backend="padded")
    torch.testing.assert_close(got, want)
    for g, w in zip(torch.autograd.grad((got * weights).sum(), (q, k, v)), want_grads):
        torch.testing.assert_close(g, w)  # padding query slots give exact zeros back
    none = rows[:0]
    assert attend_at(q.index_select(0, none), k, v, layout, none).shape == (0, 2, 8)


def plain_and_partial(model):
    """(the model as built, a copy with the partial last layer applied from outside)."""
    partial = apply_speed_options(copy.deepcopy(model), cpu_kernels=False)
    assert type(partial.bert).__name__ == "PartialRowsBertModel"
    return model, partial


@pytest.mark.parametrize("unpad", [False, True])
def test_classifier_logits_and_gradients_equal_the_full_pass(unpad) -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=96, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config, num_labels=3).double()
    set_unpadding(model, unpad)
    layout = layout_of(LENGTHS)
    mask = torch.zeros(len(LENGTHS), 96, dtype=torch.long)
    mask.view(-1)[layout.indices] = 1
    ids = torch.randint(5, 97, mask.shape) * mask
    runs = []
    for m in plain_and_partial(model):
        logits = m(ids, mask).logits
        (logits * torch.arange(3.0, dtype=torch.float64)).sum().backward()
        runs.append((logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert read_positions(model) is None and read_positions(plain_and_partial(model)[1]) == "first"
    torch.testing.assert_close(runs[0][0], runs[1][0], **TOL)
    assert runs[0][1].keys() == runs[1][1].keys()
    for name, grad in runs[0][1].items():
        torch.testing.assert_close(runs[1][1][name], grad, **TOL, msg=name)


@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
def test_masked_lm_logits_equal_the_full_pass_and_the_state_dict_is_unchanged(cls) -> None:
    torch.manual_seed(3)
    model = cls(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=32,
                           max_position_embeddings=32, pre_layernorm=True)).eval()
    plain, partial = plain_and_partial(model)
    assert plain.state_dict().keys() == partial.state_dict().keys()
    ids = torch.randint(5, 60, (3, 20))
    mask = (torch.arange(20) < torch.tensor([[20], [7], [13]])).long()
    for positions in (torch.tensor([2, 5, 21, 44, 45]), mask.bool() & (ids % 3 == 0), None):
        want, got = plain(ids, mask, None, positions), partial(ids, mask, None, positions)
        for a, b in zip(vars(want).values(), vars(got).values()):
            torch.testing.assert_close(b, a, **TOL)
        kw = partial(ids, mask, masked_positions=positions)  # by keyword too
        torch.testing.assert_close(vars(kw)[next(iter(vars(kw)))],
                                   vars(want)[next(iter(vars(want)))], **TOL)


def test_multiple_choice_scores_equal_the_full_pass() -> None:
    torch.manual_seed(1)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    plain, partial = plain_and_partial(BertForMultipleChoice(config).eval())
    set_unpadding(partial, True)
    ids = torch.randint(5, 50, (3, 4, 16))
    mask = (torch.arange(16) < torch.randint(2, 17, (3, 4, 1))).long()
    torch.testing.assert_close(partial(ids, mask).logits, plain(ids, mask).logits, **TOL)


def test_a_partial_pass_refuses_what_it_did_not_compute() -> None:
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32)).eval()
    apply_speed_options(model)
    ids = torch.randint(5, 50, (2, 9))
    positions = torch.tensor([3, 12])
    model.bert.read_at = positions  # what the task model's hook does
    out = model.bert(ids)
    assert out.select(positions).shape == (2, 16) and out.pooler_output.shape == (2, 16)
    assert model.bert.read_at is None  # one pass only: the encoder alone computes every token
    torch.testing.assert_close(out.select(positions), model.bert(ids).select(positions), **TOL)
    with pytest.raises(ValueError, match="call the model's encoder directly"):
        out.last_hidden_state
    with pytest.raises(ValueError, match="select those"):
        out.select(positions.clone())
    with pytest.raises(ValueError, match="bool tensor of shape"):
        model(ids, masked_positions=torch.ones(3, 9, dtype=torch.bool))


def test_training_with_dropout_runs_the_short_path() -> None:
    torch.manual_seed(2)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64), num_labels=2)
    apply_speed_options(model, unpad=True)
    layout = layout_of([5, 64, 30])
    mask = torch.zeros(3, 64, dtype=torch.long)
    mask.view(-1)[layout.indices] = 1
    logits = model(torch.randint(5, 50, (3, 64)) * mask, mask).logits
    logits.sum().backward()
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    assert model.bert.encoder.layer[-1].attention.self.query.weight.grad.abs().sum() > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_attend_at_fused_kernel_equals_full_attention_in_bf16() -> None:
    """The fused varlen kernel with per-sequence query counts (some zero) against fp32
    attention of every query, at the rows."""
    from bertforge.ops.attention import resolve_backend

    device = torch.device("cuda")
    torch.manual_seed(4)
    layout = layout_of(LENGTHS, "cuda")
    backend = resolve_backend("auto", device, torch.bfloat16, 64)
    if backend not in ("flash", "torch-flash"):
        pytest.skip(f"no fused varlen kernel here (auto = {backend})")
    rows = some_rows(layout).to(device)
    q, k, v = (torch.randn(sum(LENGTHS), 4, 64, device=device) for _ in range(3))
    want = varlen_attention(q.double(), k.double(), v.double(), layout,
                            backend="padded").index_select(0, rows)
    got = attend_at(q.index_select(0, rows).bfloat16(), k.bfloat16(), v.bfloat16(), layout,
                    rows)
    assert float((got.double() - want).norm() / want.norm()) < 2e-2
