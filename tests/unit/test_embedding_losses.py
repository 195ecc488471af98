"""The embedding-training losses against float64 references written as explicit loops (and
sentence-transformers' own losses), and the cached (GradCache) embedding pass against encoding
with autograd: the same loss and parameter gradients, dropout included."""

from __future__ import annotations

import pytest
import torch
from sentence_transformers.sentence_transformer.losses import CoSENTLoss, MarginMSELoss, MultipleNegativesRankingLoss

from bertforge.models import BertConfig, BertModel
from bertforge.tasks.embedding_cache import cached_embeddings
from bertforge.tasks.embedding_losses import (LossTerms, column_pool, cosent, info_nce,
                                              margin_mse, matryoshka, target_indices)

B, D = 5, 8


def vectors(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- float64 references: one pair at a time, torch scalars so autograd gives their gradients

def cos64(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x * y).sum() / (x.norm() * y.norm())


def nce_term(logits: list[torch.Tensor], target: int) -> torch.Tensor:
    """-log softmax(logits)[target]."""
    return torch.logsumexp(torch.stack(logits), 0) - logits[target]


def reference_info_nce(anchors: torch.Tensor, columns: list[torch.Tensor], scale: float,
                       symmetric: bool) -> torch.Tensor:
    n = anchors.shape[0]
    pool = [(c, j) for c in range(len(columns)) for j in range(n)]
    forward = sum(nce_term([scale * cos64(anchors[i], columns[c][j]) for c, j in pool],
                           pool.index((0, i))) for i in range(n)) / n
    if not symmetric:
        return forward
    back = sum(nce_term([scale * cos64(columns[0][i], anchors[j]) for j in range(n)], i)
               for i in range(n)) / n
    return (forward + back) / 2


def reference_cosent(a: torch.Tensor, b: torch.Tensor, scores: list[float],
                     scale: float) -> torch.Tensor:
    cos = [cos64(a[i], b[i]) for i in range(len(scores))]
    terms = [torch.zeros((), dtype=torch.float64)]
    for i in range(len(scores)):
        for j in range(len(scores)):
            if scores[i] > scores[j]:
                terms.append(scale * (cos[j] - cos[i]))
    return torch.logsumexp(torch.stack(terms), 0)


def leaves(*tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(fp32 leaves, float64 leaves) with the same values, both requiring grad."""
    f32 = [t.float().clone().requires_grad_() for t in tensors]
    f64 = [t.double().clone().requires_grad_() for t in tensors]
    return f32, f64


@pytest.mark.parametrize("negatives", [0, 2])
@pytest.mark.parametrize("symmetric", [False, True])
def test_info_nce_equals_float64_loops(negatives: int, symmetric: bool) -> None:
    raw = [vectors(B, D, seed=s) for s in range(2 + negatives)]
    raw[1] = raw[0] + 0.7 * raw[1]  # positives near their anchors: a non-trivial accuracy
    (a, *cols), (a64, *cols64) = leaves(*raw)
    loss, stats = info_nce(a, cols, scale=20.0, symmetric=symmetric)
    want = reference_info_nce(a64, cols64, 20.0, symmetric)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    loss.backward()
    want.backward()
    for got, ref in zip([a, *cols], [a64, *cols64]):
        torch.testing.assert_close(got.grad.double(), ref.grad, rtol=1e-4, atol=1e-6)
    # acc: top-1 of anchor -> pool, target the own positive (column 0)
    pool = torch.cat([c.detach() for c in cols])
    top = torch.nn.functional.normalize(a.detach(), dim=-1) @ torch.nn.functional.normalize(
        pool, dim=-1).T
    assert 0 < stats["acc"] and stats["acc"] == (top.argmax(1) == torch.arange(B)).float().mean()
    assert stats["loss"] == loss.detach() and not stats["loss"].requires_grad


def test_info_nce_equals_sentence_transformers() -> None:
    a, p, n = (vectors(B, D, seed=s) for s in (3, 4, 5))
    for symmetric in (False, True):
        directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
        ref = MultipleNegativesRankingLoss(None, scale=20.0, directions=directions,
                                           partition_mode="per_direction")  # mean of the two
        want = ref.compute_loss_from_embeddings([a, p, n], None)
        got = info_nce(a, [p, n], scale=20.0, symmetric=symmetric).loss
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_info_nce_computes_in_fp32_under_autocast() -> None:
    a, p = vectors(B, 64, seed=1), vectors(B, 64, seed=2)
    want = info_nce(a, [p]).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = info_nce(a, [p]).loss
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_index_map_puts_every_own_positive_at_the_target() -> None:
    """One process with three "ranks" of 2 rows laid out as the gather does: the target of row
    i of rank r holds (r, i, column 0) and its own hard negatives lie elsewhere."""
    world, batch, columns = 3, 2, 3
    ids = torch.tensor([[[r, i, c] for c in range(columns)] for r in range(world)
                        for i in range(batch)], dtype=torch.float32)  # (W*B, C, 3)
    pool = column_pool(ids)                                          # (C*W*B, 3)
    for r in range(world):
        targets = target_indices(batch, r)
        for i, t in enumerate(targets.tolist()):
            assert pool[t].tolist() == [r, i, 0]
            own = [k for k, row in enumerate(pool.tolist()) if row[:2] == [r, i]]
            assert len(own) == columns and [k for k in own if k != t] == own[1:]


def test_cosent_equals_float64_loops_and_sentence_transformers() -> None:
    scores = [0.9, 0.1, 0.5, 0.5, 0.0, 0.7]  # a tie: (2, 3) is no pair
    raw = [vectors(len(scores), D, seed=s) for s in (6, 7)]
    (a, b), (a64, b64) = leaves(*raw)
    loss, stats = cosent(a, b, torch.tensor(scores), scale=20.0)
    want = reference_cosent(a64, b64, scores, 20.0)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    loss.backward()
    want.backward()
    torch.testing.assert_close(a.grad.double(), a64.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(b.grad.double(), b64.grad, rtol=1e-4, atol=1e-6)
    st = CoSENTLoss(None, scale=20.0).compute_loss_from_embeddings(raw, torch.tensor(scores))
    torch.testing.assert_close(loss.detach(), st, rtol=1e-5, atol=1e-6)
    assert stats == {"loss": loss.detach()}


def test_margin_mse_equals_loops_and_sentence_transformers() -> None:
    q, p = vectors(B, D, seed=8), vectors(B, D, seed=9)
    negs, margins = vectors(B, 2, D, seed=10), vectors(B, 2, seed=11)
    loss, _ = margin_mse(q, p, negs, margins)
    q64, p64, n64, m64 = (t.double() for t in (q, p, negs, margins))
    want = sum(((q64[i] @ p64[i] - q64[i] @ n64[i, j]) - m64[i, j]) ** 2
               for i in range(B) for j in range(2)) / (2 * B)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    st = MarginMSELoss(None).compute_loss_from_embeddings([q, p, negs[:, 0], negs[:, 1]], margins)
    torch.testing.assert_close(loss, st, rtol=1e-5, atol=1e-6)


def test_matryoshka_is_the_weighted_sum_of_cut_losses() -> None:
    a, p = vectors(B, D, seed=12), vectors(B, D, seed=13)
    dims, weights = (8, 4, 2), (1.0, 0.5, 0.25)

    def loss(cut: list[torch.Tensor]) -> LossTerms:
        return info_nce(cut[0], [cut[1]])

    total, stats = matryoshka(loss, [a, p], dims, weights)
    want = sum(w * info_nce(a[:, :d], [p[:, :d]]).loss for d, w in zip(dims, weights))
    torch.testing.assert_close(total, want, rtol=1e-6, atol=1e-6)
    assert stats["acc"] == info_nce(a, [p]).stats["acc"] and stats["loss"] == total.detach()
    plain, _ = matryoshka(lambda cut: info_nce(cut[0], [cut[1]]).loss, [a, p], (4, 2))
    torch.testing.assert_close(plain, info_nce(a[:, :4], [p[:, :4]]).loss
                               + info_nce(a[:, :2], [p[:, :2]]).loss)


@pytest.mark.parametrize("call, message", [
    (lambda: info_nce(vectors(B, D), [vectors(B + 1, D)]), "candidate column 0 has shape"),
    (lambda: info_nce(vectors(B, D), []), "at least one candidate column"),
    (lambda: cosent(vectors(B, D), vectors(B, D), torch.zeros(B, 1)), "scores (B,)"),
    (lambda: margin_mse(vectors(B, D), vectors(B, D), vectors(B, D), torch.zeros(B)),
     "negatives (B, h, D)"),
    (lambda: matryoshka(lambda c: c[0].sum(), [vectors(B, D)], (4, 2), (1.0,)),
     "one weight per dimension"),
    (lambda: matryoshka(lambda c: c[0].sum(), [vectors(B, D)], (D + 1,)), "in 1..8"),
    (lambda: cached_embeddings(lambda x: x["input_ids"], {"input_ids": torch.zeros(3, 2)}, 0,
                               torch.nn.Linear(1, 1)), "chunk must be at least 1"),
    (lambda: cached_embeddings(lambda x: x["input_ids"], {"input_ids": torch.zeros(3, 2),
                                                          "max_seqlen": torch.tensor(2)}, 2,
                               torch.nn.Linear(1, 1)), "max_seqlen has no rows"),
    (lambda: cached_embeddings(lambda x: x["input_ids"], {"input_ids": torch.zeros(3, 2),
                                                          "attention_mask": torch.zeros(4, 2)},
                               2, torch.nn.Linear(1, 1)), "inputs differ in rows"),
])
def test_bad_shapes_are_named(call, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        call()


# ---- the cached (GradCache) pass

SEQ = 10


def tiny_encoder(dropout: float) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=16,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertModel(config, add_pooling_layer=False).train()


def texts(n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, SEQ + 1, (n,), generator=gen)
    mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()             # (n, S)
    return {"input_ids": torch.randint(1, 50, (n, SEQ), generator=gen) * mask,
            "attention_mask": mask}


def mean_pool(model: torch.nn.Module, seen: list | None = None):
    def encode(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if seen is not None:
            seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"),
                         torch.get_float32_matmul_precision()))
        hidden = model(inputs["input_ids"], inputs["attention_mask"]).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()               # (m, S, 1)
        return (hidden.float() * mask).sum(1) / mask.sum(1)                 # (m, H)
    return encode


def chunked(encode, inputs: dict[str, torch.Tensor], chunk: int) -> torch.Tensor:
    """The uncached reference: the same chunks (so the same dropout draws), with autograd."""
    n = inputs["input_ids"].shape[0]
    return torch.cat([encode({k: v[i:i + chunk] for k, v in inputs.items()})
                      for i in range(0, n, chunk)])


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def rng_states(device: torch.device) -> list[torch.Tensor]:
    return [torch.get_rng_state()] + ([torch.cuda.get_rng_state(device)]
                                      if device.type == "cuda" else [])


def check_cached_pass(chunk: int, device: torch.device, tol: float) -> None:
    """Two cached calls and info_nce on them against the chunked pass with autograd, dropout on."""
    model = tiny_encoder(dropout=0.1).to(device)
    encode = mean_pool(model)
    queries, docs = ({k: v.to(device) for k, v in texts(7, seed=s).items()} for s in (1, 2))

    torch.manual_seed(5)
    want = info_nce(chunked(encode, queries, chunk), [chunked(encode, docs, chunk)]).loss
    want.backward()
    want_grads, want_rng = grads(model), rng_states(device)

    torch.manual_seed(5)
    q = cached_embeddings(encode, queries, chunk, model)
    d = cached_embeddings(encode, docs, chunk, model)
    assert q.shape == (7, 32) and q.requires_grad
    got = info_nce(q, [d]).loss
    got.backward()
    got_grads = grads(model)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert got_grads.keys() == {n for n, _ in model.named_parameters()}
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=tol, atol=tol,
                                   msg=name)
    # The replay left the generators where the forward had: later draws are unchanged.
    assert all(map(torch.equal, rng_states(device), want_rng))

    # Dropout is on (the replay mattered): other masks give another gradient.
    torch.manual_seed(6)
    info_nce(chunked(encode, queries, chunk), [chunked(encode, docs, chunk)]).loss.backward()
    other = grads(model)
    assert max(float((other[n] - want_grads[n]).abs().max()) for n in other) > 1e-4


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_cached_pass_gives_the_uncached_loss_and_gradients(chunk: int) -> None:
    check_cached_pass(chunk, torch.device("cpu"), tol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cached_pass_replays_cuda_dropout() -> None:
    """CUDA's dropout draws from the device generator (a Philox offset): replayed too. 1e-5:
    the embedding backward adds with atomics, in no fixed order."""
    check_cached_pass(3, torch.device("cuda"), tol=1e-5)


def test_backward_replays_the_forward_autocast_and_matmul_precision() -> None:
    model = tiny_encoder(dropout=0.0)
    seen: list = []
    encode = mean_pool(model, seen)
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = cached_embeddings(encode, texts(4, seed=3), 3, model)
        torch.set_float32_matmul_precision("highest")
        out.square().sum().backward()  # outside autocast, as the train loop's backward
    finally:
        torch.set_float32_matmul_precision(previous)
    assert seen == [(False, True, "medium")] * 2 + [(True, True, "medium")] * 2
    assert all(p.grad is not None for p in model.parameters())


def test_without_grad_mode_the_chunks_are_just_concatenated() -> None:
    model = tiny_encoder(dropout=0.0).eval()
    encode, inputs = mean_pool(model), texts(5, seed=4)
    with torch.no_grad():
        got = cached_embeddings(encode, inputs, 2, model)
        want = encode(inputs)
    assert not got.requires_grad
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
