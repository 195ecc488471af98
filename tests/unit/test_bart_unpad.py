"""BART's unpadded training pass computes what the padded pass computes, where it matters.

* the variable-length kernels of the decoder (``bertforge.models.bart_varlen``): causal
  self-attention within each target and cross-attention to its own source, forward and
  backward, against per-sequence SDPA, for every backend that runs on a CPU;
* the whole model with ``unpad`` set (encoder on its real tokens, decoder on each row's columns
  through its last scored target): logits at the scored positions and every gradient equal the
  padded pass (post-LN and pre-LN, scored positions with gaps, rows scoring nothing, no scored
  positions at all, gradient checkpointing, the loader's layout);
* the vocabulary cross-entropy ``seq2seq_loss`` uses (``bertforge.ops.loss``) equals
  ``F.cross_entropy`` (with and without label smoothing) and its accuracy the argmax's;
* regionally compiled layers (the GPU default) equal eager ones, without a recompile per batch.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from bertforge.data.collate.seq2seq import collate_seq2seq
from bertforge.models.bart import BartForConditionalGeneration, BartModel
from bertforge.models.bart_config import BartConfig
from bertforge.models.bart_varlen import (Seq2SeqLayout, causal_attention, cross_attention,
                                          target_layout)
from bertforge.ops.unpad import token_layout
from bertforge.ops.loss import vocab_cross_entropy
from bertforge.tasks.denoise import seq2seq_loss
from bertforge.speed import (compile_layers, set_gradient_checkpointing,
                                         set_unpadding)

CPU_BACKENDS = ("padded", "nested")
TOL = dict(atol=2e-5, rtol=1e-4)
# Lengths crossing the kernel's 32-token groups: several groups, full and partial rows.
SOURCE_LENGTHS = (70, 6, 40, 33, 64, 1)
TARGET_LENGTHS = (50, 3, 33, 20, 1, 64)


def config(**kw) -> BartConfig:
    base = dict(vocab_size=120, d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, max_position_embeddings=80, dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0)
    return BartConfig(**{**base, **kw})


def mask_of(lengths: tuple[int, ...], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


def pairs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Right-padded sources (6, 72) and decoder inputs (6, 64) with their scored positions."""
    gen = torch.Generator().manual_seed(seed)
    source_mask = mask_of(SOURCE_LENGTHS, 72)
    ids = torch.randint(4, 120, source_mask.shape, generator=gen).masked_fill(source_mask == 0, 1)
    scored = mask_of(TARGET_LENGTHS, 64).bool()
    decoder = torch.randint(4, 120, scored.shape, generator=gen).masked_fill(~scored, 1)
    return ids, source_mask, decoder, scored


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], **TOL, msg=name)


def run(model, unpad: bool, backend: str = "auto", **inputs) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    set_unpadding(model, unpad, backend)
    logits = model(**inputs).logits
    (logits.square().mean() + logits.mean()).backward()
    return logits.detach(), grads(model)


# -- the kernels ------------------------------------------------------------------------------

def reference(q, k, v, q_layout, k_layout, causal: bool) -> torch.Tensor:
    """Per-sequence SDPA: (T_q, heads, head_dim) -> same."""
    out = []
    for n in range(q_layout.num_sequences):
        qs = q[q_layout.cu_seqlens[n]:q_layout.cu_seqlens[n + 1]].transpose(0, 1)
        ks = k[k_layout.cu_seqlens[n]:k_layout.cu_seqlens[n + 1]].transpose(0, 1)
        vs = v[k_layout.cu_seqlens[n]:k_layout.cu_seqlens[n + 1]].transpose(0, 1)
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("targets", [TARGET_LENGTHS, (64,) * 6, (5, 40, 40, 3, 64, 12)])
def test_kernels_equal_attention_per_sequence(backend, targets) -> None:
    torch.manual_seed(0)
    where = Seq2SeqLayout(token_layout(mask_of(targets, 64)), token_layout(mask_of(SOURCE_LENGTHS, 72)))
    t, s = where.target.num_tokens, where.source.num_tokens
    qkv = torch.randn(t, 3, 2, 8, requires_grad=True)
    q = torch.randn(t, 2, 8, requires_grad=True)
    kv = torch.randn(s, 2, 2, 8, requires_grad=True)
    weights = torch.randn(t, 2, 8)
    ours = [causal_attention(qkv, where, backend=backend), cross_attention(q, kv, where, backend=backend)]
    (sum((o * weights).sum() for o in ours)).backward()
    got = (qkv.grad, q.grad, kv.grad)
    for x in (qkv, q, kv):
        x.grad = None
    expected = [reference(*qkv.unbind(1), where.target, where.target, True),
                reference(q, *kv.unbind(1), where.target, where.source, False)]
    (sum((o * weights).sum() for o in expected)).backward()
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b, **TOL)
    for a, b in zip(got, (qkv.grad, q.grad, kv.grad)):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["torch-flash", "nested"])
def test_cuda_kernels_equal_attention_per_sequence_in_bf16(backend) -> None:
    """The decoder's kernels on a GPU in bf16 (``nested`` leaves causal self-attention to the
    padded kernel) against fp32 attention of each sequence alone: outputs and gradients within
    bf16 rounding (relative error of the whole tensor)."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    where = Seq2SeqLayout(token_layout(mask_of(TARGET_LENGTHS, 64).to(device)),
                          token_layout(mask_of(SOURCE_LENGTHS, 72).to(device)))
    t, s = where.target.num_tokens, where.source.num_tokens
    inputs = [torch.randn(*shape, device=device).bfloat16().requires_grad_()
              for shape in ((t, 3, 4, 64), (t, 4, 64), (s, 2, 4, 64))]
    qkv, q, kv = inputs
    weights = torch.randn(t, 4, 64, device=device)
    ours = [causal_attention(qkv, where, backend=backend),
            cross_attention(q, kv, where, backend=backend)]
    sum((o.float() * weights).sum() for o in ours).backward()
    ref = [x.detach().float().requires_grad_() for x in inputs]
    expected = [reference(*ref[0].unbind(1), where.target, where.target, True),
                reference(ref[1], *ref[2].unbind(1), where.target, where.source, False)]
    sum((o * weights).sum() for o in expected).backward()

    def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got.float() - want).norm() / want.norm())

    for got, want in zip(ours, expected):
        assert got.dtype == torch.bfloat16 and rel_err(got, want) < 2e-2
    for x, r in zip(inputs, ref):
        assert rel_err(x.grad, r.grad) < 3e-2


def test_target_layout_ends_at_each_rows_last_scored_position() -> None:
    scored = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]])
    layout = target_layout((4, 5), scored.bool(), scored.device)
    assert layout.cu_seqlens.tolist() == [0, 4, 5, 10, 12]  # a row scoring nothing keeps column 0
    assert layout.positions.tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 0, 1]
    assert target_layout((2, 3), None, scored.device).num_tokens == 6


# -- the model --------------------------------------------------------------------------------

@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_unpadded_training_pass_equals_padded(normalize_before, backend) -> None:
    torch.manual_seed(1)
    model = BartForConditionalGeneration(config(normalize_before=normalize_before))
    ids, mask, decoder, scored = pairs()
    inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder,
                  target_positions=scored)
    padded_logits, padded_grads = run(model, False, **inputs)
    logits, unpadded_grads = run(model, True, backend, **inputs)
    torch.testing.assert_close(logits, padded_logits, **TOL)
    assert_grads_close(unpadded_grads, padded_grads)


def test_scored_positions_with_gaps_and_rows_scoring_nothing() -> None:
    torch.manual_seed(2)
    model = BartForConditionalGeneration(config())
    model.final_logits_bias.normal_()  # a checkpoint's nonzero bias is added on both paths
    ids, mask, decoder, scored = pairs(seed=1)
    scored[0, 10:20] = False    # a gap inside a target
    scored[2] = False           # a row that scores nothing
    scored[3, 0] = False        # a target that starts late
    inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder,
                  target_positions=scored)
    padded_logits, padded_grads = run(model, False, **inputs)
    logits, unpadded_grads = run(model, True, **inputs)
    assert logits.shape == (int(scored.sum()), 120)
    torch.testing.assert_close(logits, padded_logits, **TOL)
    assert_grads_close(unpadded_grads, padded_grads)


def test_every_decoder_column_without_target_positions() -> None:
    torch.manual_seed(3)
    model = BartForConditionalGeneration(config())
    ids, mask, decoder, _ = pairs(seed=2)
    inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder)
    padded_logits, padded_grads = run(model, False, **inputs)
    logits, unpadded_grads = run(model, True, **inputs)
    torch.testing.assert_close(logits, padded_logits, **TOL)
    assert_grads_close(unpadded_grads, padded_grads)
    base = BartModel(config())
    set_unpadding(base, True)
    states = base.run(ids, mask, decoder)
    assert states.target is not None and states.target.num_tokens == decoder.numel()
    out = base(ids, mask, decoder)
    set_unpadding(base, False)
    reference = base(ids, mask, decoder)
    torch.testing.assert_close(out.last_hidden_state, reference.last_hidden_state, **TOL)
    real = mask.bool()
    torch.testing.assert_close(out.encoder_last_hidden_state[real],
                               reference.encoder_last_hidden_state[real], **TOL)


def test_padded_decoder_when_a_decoder_mask_is_given_or_no_source_padding() -> None:
    torch.manual_seed(4)
    model = BartModel(config())
    set_unpadding(model, True)
    ids, mask, decoder, scored = pairs(seed=3)
    assert model.run(ids, mask, decoder, scored.long()).target is None
    assert model.run(ids, None, decoder).target is None  # no source mask: nothing to unpad
    empty = mask.clone()
    empty[1] = 0  # a source with no real token: no sequence of its own, padded rows then
    assert model.run(ids, empty, decoder).target is None


def test_gradient_checkpointing_on_the_unpadded_path() -> None:
    torch.manual_seed(5)
    model = BartForConditionalGeneration(config(normalize_before=True))
    ids, mask, decoder, scored = pairs(seed=4)
    inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder,
                  target_positions=scored)
    model.train()
    logits, plain = run(model, True, **inputs)
    set_gradient_checkpointing(model, True)
    checkpointed_logits, checkpointed = run(model, True, **inputs)
    torch.testing.assert_close(checkpointed_logits, logits, **TOL)
    assert_grads_close(checkpointed, plain)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_seq2seq_loss_on_a_loader_batch(label_smoothing) -> None:
    torch.manual_seed(6)
    model = BartForConditionalGeneration(config())
    gen = torch.Generator().manual_seed(7)
    sources = [torch.randint(4, 120, (n,), generator=gen).numpy() for n in SOURCE_LENGTHS]
    targets = [torch.randint(4, 120, (n,), generator=gen).numpy() for n in TARGET_LENGTHS]
    batch = collate_seq2seq(sources, targets, pad_id=1, decoder_start_id=2)
    assert "cu_seqlens" in batch  # the loader's source layout, read by the unpadded encoder
    runs = []
    for unpad in (False, True):
        model.zero_grad()
        set_unpadding(model, unpad)
        out = seq2seq_loss(model, batch, label_smoothing)
        out.loss.backward()
        runs.append((out.stats, grads(model)))
    for key in runs[0][0]:
        torch.testing.assert_close(runs[1][0][key], runs[0][0][key], **TOL)
    assert_grads_close(runs[1][1], runs[0][1])
    assert ("nll" in runs[0][0]) == bool(label_smoothing)


# -- the loss ---------------------------------------------------------------------------------

@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_cross_entropy_equals_torchs(label_smoothing) -> None:
    torch.manual_seed(8)
    logits = (3 * torch.randn(37, 50)).requires_grad_()
    target = torch.randint(0, 50, (37,))
    target[:5] = logits.detach()[:5].argmax(-1)  # some right answers
    reference = logits.detach().clone().requires_grad_()
    loss, nll, correct = vocab_cross_entropy(logits, target, label_smoothing)
    accuracy = correct.float() / target.numel()
    expected = F.cross_entropy(reference, target, label_smoothing=label_smoothing)
    (2.5 * loss).backward()
    (2.5 * expected).backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(logits.grad, reference.grad)
    torch.testing.assert_close(nll, F.cross_entropy(reference.detach(), target))
    assert not nll.requires_grad and not accuracy.requires_grad
    assert accuracy.item() == (reference.detach().argmax(-1) == target).float().mean().item()
    assert accuracy.item() > 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor needs a C++ compiler on the CPU")
def test_compiled_unpadded_layers_equal_eager_without_a_recompile_per_batch() -> None:
    """Regional compilation (the GPU default) of the unpadded encoder and decoder layers: the
    variable-length kernels stay eager between the compiled regions; new batch shapes reuse the
    first batch's dynamic-shape graphs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(9)
    eager = BartForConditionalGeneration(config())
    compiled = BartForConditionalGeneration(config())
    compiled.load_state_dict(eager.state_dict())
    for model in (eager, compiled):
        set_unpadding(model, True)
    compile_layers(compiled)
    gen = torch.Generator().manual_seed(10)
    graphs = []
    for sizes in ((40, 17, 63), (25, 52, 33, 8), (61, 9)):
        sources = [torch.randint(4, 120, (n,), generator=gen).numpy() for n in sizes]
        targets = [torch.randint(4, 120, (max(1, n - 5),), generator=gen).numpy() for n in sizes]
        batch = collate_seq2seq(sources, targets, pad_id=1, decoder_start_id=2)
        results = []
        for model in (eager, compiled):
            model.zero_grad()
            loss = seq2seq_loss(model, batch).loss
            loss.backward()
            results.append((loss.detach(), grads(model)))
        graphs.append(counters["stats"]["unique_graphs"])
        torch.testing.assert_close(results[1][0], results[0][0], atol=1e-4, rtol=1e-4)
        for name, grad in results[0][1].items():
            torch.testing.assert_close(results[1][1][name], grad, atol=1e-4, rtol=1e-4, msg=name)
    assert graphs[0] > 0 and graphs == [graphs[0]] * len(graphs), graphs
