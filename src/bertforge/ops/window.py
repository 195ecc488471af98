"""Bidirectional sliding-window attention (ModernBERT's local layers) for either token layout.

A query at position i sees the keys j of its own sequence with ``|i - j| <= window`` (both ends
inclusive: transformers' ``sliding_window_bidirectional_overlay``, flash-attn's
``window_size=(window, window)``). One entry point, :func:`window_attend`, takes what
``bertforge.ops.attention.attend`` takes:

* padded rows, (B, S, heads, head_dim): the keep mask already holds the band
  (:func:`band_keep_mask`, made once per batch and shared by every local layer), so this is
  plain SDPA (``ops.attention.attend``);
* unpadded tokens, (T, heads, head_dim) with their ``TokenLayout``: by kernel, best first:

  * ``flash``: ``flash_attn_varlen_func(..., window_size=(window, window))`` on CUDA in
    fp16/bf16 when the flash-attn package is installed. NOT TESTED: no GPU in the development
    environment; it is the same call as the global layers' flash path plus the window argument;
  * when no sequence is longer than ``window + 1`` tokens the window hides nothing: the global
    varlen kernel (``ops.attention.varlen_attention``) is exact and cheaper;
  * otherwise blocked local attention (:func:`blocked_window_attention`): the token stream is
    cut into blocks of ``block`` queries, each attending to the keys from ``window`` before to
    ``window`` after its block, masked to the band and to its own sequence; one batched SDPA
    call for all blocks. Work is linear in T (``block + 2 * window`` keys per query) whatever the
    sequence lengths, and packed rows need nothing more than their ``cu_seqlens``. Runs on any
    device (verified on CPU against the padded reference).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from bertforge.ops.attention import (
    Attend,
    _flash_varlen,
    attend,
    resolve_backend,
    sdpa,
    varlen_attention,
)
from bertforge.ops.unpad import TokenLayout


def band_keep_mask(keep: torch.Tensor | None, seq_len: int, window: int,
                   always: bool = False) -> torch.Tensor | None:
    """The padded path's local-layer mask: ``keep`` ((B, 1, 1 or S, S) bool or None) and the
    band ``|i - j| <= window`` over the S columns -> (B or 1, 1, S, S) bool; ``keep`` itself
    when the band covers every pair. Every query also keeps itself, so a padding query far
    from any real token still has a key (finite, unused output) and real queries are unchanged
    (they always see themselves). ``always``: build the band even when it covers every pair
    (a traced graph must not freeze that length test)."""
    if seq_len - 1 <= window and not always:
        return keep
    cols = torch.arange(seq_len, device=keep.device if keep is not None else None)
    offsets = cols[:, None] - cols[None, :]                         # (S, S)
    band = offsets.abs() <= window
    if keep is None:
        return band[None, None]
    return (keep & band) | (offsets == 0)  # (not torch.eye: ONNX's EyeLike has no bool kernel)


@dataclass
class WindowPlan:
    """What the local layers of an unpadded pass attend with: the batch's ``TokenLayout`` and
    the window, plus the blocked kernel's additive mask, made on first use and shared by every
    local layer of the pass (building it costs about as much as one layer's attention)."""

    layout: TokenLayout
    window: int
    bias: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """(blocks, 1, block, span) 0 / -inf mask of :func:`blocked_window_attention`."""

    def blocked_bias(self, dtype: torch.dtype) -> torch.Tensor:
        if self.bias is None or self.bias.dtype != dtype:
            self.bias = window_bias(self.layout.sequence_of_token(), self.window,
                                    default_block(self.window), dtype)
        return self.bias


def window_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  where: Attend | WindowPlan, window: int, dropout_p: float = 0.0,
                  backend: str = "auto") -> torch.Tensor:
    """Sliding-window attention for either layout (module docstring): q, k, v
    (B, S, heads, head_dim) with a keep mask that holds the band (:func:`band_keep_mask`), or
    (T, heads, head_dim) with their ``TokenLayout`` (or its ``WindowPlan``) -> the shape of q."""
    if isinstance(where, TokenLayout):
        where = WindowPlan(where, window)
    if not isinstance(where, WindowPlan):
        return attend(q, k, v, where, dropout_p)
    return window_varlen_attention(q, k, v, where, dropout_p, backend)


@torch.compiler.disable  # data-dependent layouts: eager between compiled regions
def window_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            plan: WindowPlan, dropout_p: float = 0.0,
                            backend: str = "auto") -> torch.Tensor:
    """Sliding-window attention within each sequence: (T, heads, head_dim) -> same shape."""
    layout, window = plan.layout, plan.window
    if layout.max_seqlen - 1 <= window:
        return varlen_attention(q, k, v, layout, dropout_p, backend)
    if resolve_backend(backend, q.device, q.dtype, q.shape[-1]) == "flash":  # UNTESTED (no GPU)
        cu = layout.cu_seqlens
        return _flash_varlen()(q, k, v, cu, cu, layout.max_seqlen, layout.max_seqlen,
                               dropout_p=dropout_p, window_size=(window, window))
    return blocked_window_attention(q, k, v, layout.sequence_of_token(), window, dropout_p,
                                    bias=plan.blocked_bias(q.dtype))


def default_block(window: int) -> int:
    """Queries per block: twice the window (at least 32), so a query is scored against
    ``4 * window`` keys where ``2 * window + 1`` matter, and blocks stay few."""
    return max(32, 2 * window)


def window_bias(sequence: torch.Tensor, window: int, block: int,
                dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of :func:`blocked_window_attention`: (blocks, 1, block, span), 0 where
    query ``b * block + i`` may see key ``b * block - window + j`` (same sequence, ``|distance|
    <= window``), -inf elsewhere. Padding tokens are sequence -1: they see each other only
    (finite, discarded outputs), and every real query sees itself, so no row is all -inf."""
    t = sequence.shape[0]
    blocks = -(-t // block)
    tail, span = blocks * block - t, block + 2 * window
    seq_q = F.pad(sequence, (0, tail), value=-1).view(blocks, block)
    seq_k = F.pad(sequence, (window, tail + window), value=-1).unfold(0, span, block)
    device = sequence.device
    offsets = torch.arange(block, device=device)[:, None] - torch.arange(span, device=device)
    band = (offsets + window).abs() <= window                       # (block, span)
    keep = (seq_q[:, :, None] == seq_k[:, None, :]) & band          # (blocks, block, span)
    bias = torch.zeros(keep.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~keep, float("-inf"))[:, None]


def blocked_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             sequence: torch.Tensor, window: int, dropout_p: float = 0.0,
                             block: int | None = None,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """q, k, v (T, heads, head_dim) of consecutive tokens, ``sequence`` (T,) the sequence
    number of each (non-decreasing: tokens of a sequence are contiguous) -> (T, heads,
    head_dim): token t attends to the tokens u of its sequence with ``|t - u| <= window``.
    ``bias``: :func:`window_bias` of these arguments, when the caller has it already."""
    t = q.shape[0]
    block = block or default_block(window)
    blocks = -(-t // block)
    tail, span = blocks * block - t, block + 2 * window
    if bias is None:
        bias = window_bias(sequence, window, block, q.dtype)
    # queries: (T, h, d) -> (blocks, h, block, d)
    qb = F.pad(q, (0, 0, 0, 0, 0, tail)).view(blocks, block, *q.shape[1:]).transpose(1, 2)

    def keys(x: torch.Tensor) -> torch.Tensor:  # (T, h, d) -> (blocks, h, span, d), a view
        padded = F.pad(x, (0, 0, 0, 0, window, tail + window))
        return padded.unfold(0, span, block).permute(0, 1, 3, 2)

    out = sdpa(qb, keys(k), keys(v), bias, dropout_p)
    return out.transpose(1, 2).reshape(blocks * block, *q.shape[1:])[:t]


__all__ = ["WindowPlan", "band_keep_mask", "blocked_window_attention", "default_block",
           "window_attend", "window_bias", "window_varlen_attention"]
