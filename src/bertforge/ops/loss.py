"""Cross-entropy over a large vocabulary, row chunk by row chunk: :func:`vocab_cross_entropy`,
the loss of every vocabulary head (BERT's masked LM, BART's decoder, with label smoothing).

The masked-LM loss reads (N, V) logits with V the vocabulary (30,522 for BERT's): the largest
tensors of a small model's step. ``F.cross_entropy(logits.float(), target)`` passes over them
about ten times in memory: the fp32 copy, log-softmax, the loss, then in backward a zero-filled
gradient, the log-softmax gradient and the cast back to the logits' dtype. This loss takes a
chunk of rows small enough to stay in cache, computes its log-sum-exp in fp32, its loss and
correct predictions, and the chunk's gradient (softmax minus one-hot, over N) right away, kept
in the logits' dtype for backward: one pass over the logits in memory, one over the gradient,
no fp32 copy of the whole. On a CPU this made BERT-mini's masked-LM step in bf16 about 10%
faster (docs/performance.md). On a GPU the chunks are large (few kernel launches) and only
bound the fp32 working copy. All on the device, no host synchronisation.
"""

from __future__ import annotations

import torch

_CHUNK_BYTES = 4 << 20  # fp32 bytes of one chunk of rows on a CPU: about a core's share of cache
_DEVICE_CHUNK_BYTES = 1 << 30  # elsewhere (a GPU): chunks only bound the fp32 working copy


def _keep_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the gradient is kept in between forward and backward: the logits' own, except
    fp16, whose range would flush the small unscaled gradients to zero (fp16 training scales the
    loss so that they survive; the scale only arrives in backward)."""
    return torch.float32 if dtype == torch.float16 else dtype


class _VocabCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor,  # type: ignore[override]
                smoothing: float):
        n, v = logits.shape
        budget = _CHUNK_BYTES if logits.device.type == "cpu" else _DEVICE_CHUNK_BYTES
        rows = max(1, budget // (4 * v))
        grad = None
        if ctx.needs_input_grad[0]:
            grad = torch.empty(logits.shape, dtype=_keep_dtype(logits.dtype),
                               device=logits.device)
        nll = torch.zeros((), dtype=torch.float32, device=logits.device)
        spread = torch.zeros((), dtype=torch.float32, device=logits.device)
        correct = torch.zeros((), dtype=torch.long, device=logits.device)
        in_place = grad is not None and grad.dtype == torch.float32
        for start in range(0, n, rows):
            x = logits[start:start + rows].float()      # a copy, or a view of fp32 logits
            t = target[start:start + rows, None]
            top = x.amax(dim=-1, keepdim=True)
            picked = x.gather(1, t)
            correct += (picked >= top).sum()            # ties with the best count as correct
            if smoothing:  # -log p averaged over the vocabulary: lse - mean of the logits
                spread -= x.mean(-1).sum()
            # exp(x - max), reused as the softmax: built in the gradient buffer when that is
            # fp32, else in x when x is a copy (never in the caller's logits)
            if in_place:
                e = torch.sub(x, top, out=grad[start:start + rows])
            else:
                e = x.sub_(top) if logits.dtype != torch.float32 else x - top
            e.exp_()
            total = e.sum(dim=-1, keepdim=True)
            lse = top + total.log()
            nll += (lse - picked).sum()
            if smoothing:
                spread += lse.sum()
            if grad is not None:  # (softmax - (1 - e) onehot - e / V) / n
                p = e.mul_(total.reciprocal_().div_(n))
                p.scatter_add_(1, t, p.new_full(t.shape, (smoothing - 1.0) / n))
                if smoothing:
                    p.sub_(smoothing / (v * n))
                if not in_place:
                    grad[start:start + rows] = p
        ctx.save_for_backward(grad)
        ctx.rows, ctx.dtype = rows, logits.dtype
        nll = nll / n
        loss = (1.0 - smoothing) * nll + spread * (smoothing / n) if smoothing else nll.clone()
        ctx.mark_non_differentiable(nll, correct)
        return loss, nll, correct

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll, _grad_correct):  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        scale = grad_loss.float()
        if grad.dtype == torch.float32:  # in place, no second (N, V) buffer (a second backward
            return grad.mul_(scale).to(ctx.dtype), None, None  # is refused by autograd)
        # half-precision gradient: scaled in fp32 chunk by chunk, so that a loss scale or an
        # accumulation factor is not first rounded to the half dtype
        out = torch.empty_like(grad)
        for start in range(0, grad.shape[0], ctx.rows):
            out[start:start + ctx.rows] = grad[start:start + ctx.rows].float().mul_(scale)
        return out, None, None


def vocab_cross_entropy(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, nll, correct)`` of (N, V) logits and (N,) target ids (every row counts: select
    the scored rows first): ``loss`` is the mean cross-entropy with ``label_smoothing`` (as
    ``F.cross_entropy(logits.float(), target, label_smoothing=...)``), ``nll`` its value without
    smoothing and ``correct`` the number of rows whose target scores as high as the row's
    best (ties count: they have measure zero for real logits, and a max is several times
    cheaper than an argmax on a CPU); only ``loss`` carries a gradient. Computed in fp32
    whatever the logits' dtype; the gradient has the logits' dtype (kept in fp32 until backward
    for fp16 logits, whose loss scale arrives only then). N = 0 gives NaN, as the mean of
    nothing does."""
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"want (N, V) logits and (N,) targets, got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")
    return _VocabCrossEntropy.apply(logits, target, float(label_smoothing))


__all__ = ["vocab_cross_entropy"]
