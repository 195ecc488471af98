"""The losses of embedding training (``tasks/embedding.py``), as pure functions of embeddings.

Inputs are (B, D) text vectors as the encoder and pooling produced them (any dtype); the
similarities, softmaxes and squares are computed in fp32 with autocast off, since a bf16
cosine times a scale of 20 keeps about two significant digits.

Each function returns :class:`LossTerms` ``(loss, stats)``: the 0-d loss to backpropagate and
detached scalars to log (always "loss"). The task wraps them into a
``bertforge.data.batch.LossOutput`` with the sequences and tokens it trained on, which only it
knows.

Under torch.distributed, ``gather=True`` scores every rank's local rows against the rows of all
ranks (``bertforge.train.distributed.all_gather_with_grad``: gradients flow back to the rank
that owns each row), so W ranks with B rows each train like one process with W*B rows; the
integration test ``tests/integration/test_embedding_gather.py`` checks the losses and gradients.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bertforge.data.batch import LossOutput
from bertforge.train.distributed import all_gather_with_grad


class LossTerms(NamedTuple):
    """A loss and what to log of it; unpacks as ``loss, stats = ...``."""

    loss: torch.Tensor              # 0-d, differentiable
    stats: dict[str, torch.Tensor]  # detached 0-d scalars, "loss" among them


def _rank(gather: bool) -> int:
    """This process's rank among those the gather reaches (0 without a gather)."""
    return dist.get_rank() if gather and dist.is_initialized() else 0


def _unit(t: torch.Tensor) -> torch.Tensor:
    """(..., D) scaled to unit length in fp32 (a cosine is then a dot product)."""
    return F.normalize(t.float(), dim=-1)


def _gather(t: torch.Tensor, gather: bool) -> torch.Tensor:
    return all_gather_with_grad(t) if gather else t


def _no_autocast(t: torch.Tensor) -> torch.autocast:
    """A scope where matmuls stay in the fp32 of their inputs (the train loop's forward runs
    the loss under autocast)."""
    return torch.autocast(t.device.type, enabled=False)


def target_indices(batch: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
    """(B,) the column of :func:`column_pool`'s rows that holds each local anchor's positive:
    local anchor i on rank ``rank`` targets ``rank * batch + i`` (the positives of all ranks come
    first, in rank order)."""
    return torch.arange(rank * batch, (rank + 1) * batch, device=device)


def column_pool(rows: torch.Tensor) -> torch.Tensor:
    """(N, C, D) candidate rows (N = W*B gathered examples, C columns) -> (C*N, D), column by
    column: candidate c of example n at ``c * N + n``. Column 0 (the positives) fills the first
    N, so :func:`target_indices` points at an anchor's own positive and never at one of its own
    hard negatives (at ``c * N + n`` for c >= 1)."""
    return rows.transpose(0, 1).reshape(-1, rows.shape[-1])


def _check_columns(anchors: torch.Tensor, candidates: Sequence[torch.Tensor]) -> None:
    if anchors.dim() != 2:
        raise ValueError(f"info_nce: anchors must be (B, D), got {tuple(anchors.shape)}")
    if not candidates:
        raise ValueError("info_nce: needs at least one candidate column (the positives)")
    for c, column in enumerate(candidates):
        if column.shape != anchors.shape:
            raise ValueError(f"info_nce: candidate column {c} has shape {tuple(column.shape)}, "
                             f"the anchors {tuple(anchors.shape)}; every column is (B, D)")


def info_nce(anchors: torch.Tensor, candidates: Sequence[torch.Tensor], *, scale: float = 20.0,
             symmetric: bool = False, gather: bool = True) -> LossTerms:
    """Multiple-negatives ranking (InfoNCE) loss over cosine similarities times ``scale``.

    ``anchors`` (B, D); ``candidates``: C columns of (B, D), column 0 the positives, the others
    hard negatives. Each anchor is scored against every candidate of every column of every rank
    (in-batch and hard negatives); its target is its own positive. ``symmetric`` adds the
    positive -> anchors term (each positive against every anchor of every rank) and averages
    the two. Stats: "loss" and "acc" (top-1 accuracy of the anchor -> candidates scores).

    Under DDP each rank's loss is the mean over its own anchors; DDP's mean over ranks of the
    gradients, with the gather's summed backward, gives one process's gradient on all W*B.
    """
    _check_columns(anchors, candidates)
    batch = anchors.shape[0]
    with _no_autocast(anchors):
        local = _unit(anchors)                                     # (B, D)
        columns = _unit(torch.stack(list(candidates), 1))           # (B, C, D)
        # One collective for everything gathered: the anchors ride along only when needed.
        packed = torch.cat([local[:, None], columns], 1) if symmetric else columns
        rows = _gather(packed, gather)                              # (W*B, [1+]C, D)
        pool = column_pool(rows[:, 1:] if symmetric else rows)      # (C*W*B, D)
        targets = target_indices(batch, _rank(gather), anchors.device)
        scores = scale * local @ pool.T                             # (B, C*W*B)
        loss = F.cross_entropy(scores, targets)
        if symmetric:
            back = scale * columns[:, 0] @ rows[:, 0].T             # (B, W*B) positive->anchors
            loss = (loss + F.cross_entropy(back, targets)) / 2
    acc = (scores.detach().argmax(1) == targets).float().mean()
    return LossTerms(loss, {"loss": loss.detach(), "acc": acc})


def cosent(a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor, *, scale: float = 20.0,
           gather: bool = True) -> LossTerms:
    """CoSENT: ``log(1 + sum over pairs (i, j) with scores_i > scores_j of
    exp(scale * (cos_j - cos_i)))``, cos_i the cosine of ``a[i]`` (B, D) and ``b[i]`` (B, D),
    ``scores`` (B,) the gold similarities; over the pairs of the whole gathered batch.

    Under DDP every rank computes the same loss of all (W*B)^2 pairs. Its gradient for the
    gathered cosines is the same on every rank, so the gather's backward (a sum over ranks)
    hands each rank W times the one-process gradient of its own cosines, and DDP's mean over
    ranks divides by W again: no further division is needed (the test checks it).
    """
    if a.dim() != 2 or a.shape != b.shape or scores.shape != a.shape[:1]:
        raise ValueError(f"cosent: a and b must be (B, D) and scores (B,); got "
                         f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(scores.shape)}")
    with _no_autocast(a):
        cos = (_unit(a) * _unit(b)).sum(-1)                         # (B,)
        # The cosines (not the embeddings) cross ranks, with the gold scores in the same
        # collective; the scores need no gradient, so theirs is dropped.
        both = _gather(torch.stack([cos, scores.detach().float()], 1), gather)   # (N, 2)
        cos, gold = both[:, 0], both[:, 1]
        diff = scale * (cos[None, :] - cos[:, None])                # (N, N): [i, j] cos_j - cos_i
        counted = gold[:, None] > gold[None, :]                     # pairs with score_i > score_j
        terms = torch.cat([diff.new_zeros(1), diff.masked_fill(~counted, float("-inf")).flatten()])
        loss = torch.logsumexp(terms, 0)                            # log(exp(0) + sum exp(...))
    return LossTerms(loss, {"loss": loss.detach()})


def margin_mse(queries: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor,
               margins: torch.Tensor) -> LossTerms:
    """Margin-MSE distillation: the mean over (B, h) of (student margin - teacher margin)^2,
    the student margin ``dot(q, pos) - dot(q, neg_j)`` (the dot product, as sentence-transformers'
    MarginMSELoss). ``queries``, ``positives`` (B, D); ``negatives`` (B, h, D); ``margins``
    (B, h) the teacher's. Rank-local: DDP's mean over ranks is the mean over the global batch."""
    if (queries.dim() != 2 or positives.shape != queries.shape or negatives.dim() != 3
            or negatives.shape[::2] != queries.shape or margins.shape != negatives.shape[:2]):
        raise ValueError(f"margin_mse: expected queries and positives (B, D), negatives "
                         f"(B, h, D), margins (B, h); got {tuple(queries.shape)}, "
                         f"{tuple(positives.shape)}, {tuple(negatives.shape)}, "
                         f"{tuple(margins.shape)}")
    with _no_autocast(queries):
        q = queries.float()
        pos = (q * positives.float()).sum(-1)                      # (B,)
        neg = torch.einsum("bd,bhd->bh", q, negatives.float())     # (B, h)
        loss = F.mse_loss(pos[:, None] - neg, margins.detach().float())
    return LossTerms(loss, {"loss": loss.detach()})


def _as_terms(out: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, stats) of what a loss function returned: a tensor, (loss, stats) or LossOutput."""
    if isinstance(out, torch.Tensor):
        return out, {}
    if isinstance(out, LossOutput):
        return out.loss, dict(out.stats)
    loss, stats = out
    return loss, dict(stats)


def matryoshka(loss: Callable[[list[torch.Tensor]], Any], embeddings: list[torch.Tensor],
               dims: Sequence[int], weights: Sequence[float] | None = None) -> LossTerms:
    """Matryoshka representation loss: ``sum_k weights[k] * loss([e[..., :dims[k]] for e in
    embeddings])``, so the first d values of a vector work on their own for every d in ``dims``.

    ``loss`` takes the cut embeddings (in the order given) and returns a 0-d tensor,
    ``(loss, stats)`` (:class:`LossTerms`) or a ``LossOutput``; a loss on cosines normalizes
    the cut vectors itself. ``weights`` default to 1 each. Stats: those of the largest
    dimension's term, and "loss" the weighted sum.
    """
    full = embeddings[0].shape[-1]
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if not dims or len(weights) != len(dims):
        raise ValueError(f"matryoshka: needs one weight per dimension; got dims {list(dims)} "
                         f"and weights {weights}")
    if any(not 0 < d <= full for d in dims):
        raise ValueError(f"matryoshka: every dimension must be in 1..{full} (the embedding "
                         f"size); got {list(dims)}")
    terms, stats = [], {}
    for d, w in zip(dims, weights):
        term, term_stats = _as_terms(loss([e[..., :d] for e in embeddings]))
        terms.append(w * term)
        if d == max(dims):
            stats = term_stats
    total = torch.stack(terms).sum()
    return LossTerms(total, {**stats, "loss": total.detach()})


__all__ = ["LossTerms", "column_pool", "cosent", "info_nce", "margin_mse", "matryoshka",
           "target_indices"]
