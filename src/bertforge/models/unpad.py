"""Unpadded (variable-length) execution: where a batch's real tokens are, and attention over them.

A padded batch is (B, S) with ``attention_mask`` 1 at real tokens. Unpadding removes the padding
once, at the encoder's entry: every layer then runs on the (T, H) tensor of the T real tokens,
so no matmul, LayerNorm or activation is spent on padding. Attention is the one operation that
must know where sequences begin and end; :class:`TokenLayout` says so with ``cu_seqlens`` (the
offsets of the N sequences in the T tokens), the convention of flash-attention's varlen kernels.

A row may also hold several sequences (packing, ``bertforge.data.packing``): ``position_ids``
then restart at 0 where each sequence begins, and attention stays inside each sequence
(block-diagonal), in the unpadded path by construction and in the padded path by a mask
(:func:`packed_keep_mask`).

Varlen attention backends (:func:`varlen_attention`), best first:

* ``flash``: ``flash_attn.flash_attn_varlen_func`` (the flash-attn package, CUDA, fp16/bf16);
* ``nested``: PyTorch SDPA on nested tensors of the jagged layout, which runs PyTorch's own fused
  varlen kernels on CUDA (flash, memory-efficient or cuDNN attention: no extra package). The
  tensors carry the batch's shortest and longest sequence lengths (host ints from the loader), so
  PyTorch's kernel checks read nothing back from the GPU. On a CPU PyTorch has no fused kernel for
  them and falls back to a per-sequence math path (it reads every length and warns about its
  strided nested layout): a correctness reference there, never the default;
* ``padded``: the tokens scattered into padded rows, one per *sequence*, sequences of similar
  length together (lengths rounded up to a multiple of ``BUCKET``, one SDPA call per width, a
  key-padding mask where a row is not full), gathered back. Always available; the fastest on
  CPU, where SDPA on nested tensors falls back to a per-sequence loop (measured ~10x slower,
  docs/performance.md).

Host-device syncs: :func:`token_layout` needs four (the number of real tokens, of sequences, the
longest and the shortest length) when it runs on a GPU tensor; the pretraining loader computes the layout on
the CPU instead and ships it in the batch (:func:`layout_from_batch`), so the model's step then
needs none.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.core.limits import ATTENTION_BACKENDS as BACKENDS

# Batch keys of a layout computed by the loader (contracts.md, "micro-batch").
LAYOUT_KEYS = ("token_indices", "cu_seqlens", "max_seqlen", "min_seqlen")


@dataclass
class TokenLayout:
    """The real tokens of a (B, S) batch, in row-major order, grouped into N sequences."""

    indices: torch.Tensor
    """(T,) int64 flat positions ``row * S + column`` of the real tokens, ascending."""
    cu_seqlens: torch.Tensor
    """(N + 1,) int32: sequence n is tokens ``cu_seqlens[n]`` .. ``cu_seqlens[n + 1] - 1``."""
    max_seqlen: int
    """Length of the longest sequence (a host int: kernels size their grids with it)."""
    shape: tuple[int, int]
    """(B, S) of the padded batch."""
    positions: torch.Tensor
    """(T,) int64 position id of every real token (its column, or the batch's ``position_ids``)."""
    min_seqlen: int = 1
    """Length of the shortest sequence (a host int: PyTorch's fused varlen kernels refuse
    empty sequences and would read it back from the GPU if not told)."""
    buckets: list | None = field(default=None, repr=False, compare=False)
    """The padded backend's length groups, computed on first use and shared by every layer."""
    offsets: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """The nested backend's int64 ``cu_seqlens``, made on first use and shared by every layer."""

    @property
    def num_tokens(self) -> int:
        return self.indices.shape[0]

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    def starts(self) -> torch.Tensor:
        """(N,) int64 index (into the T tokens) of each sequence's first token."""
        return self.cu_seqlens[:-1].long()

    def lengths(self) -> torch.Tensor:
        """(N,) int64 tokens per sequence."""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).long()

    def sequence_of_token(self) -> torch.Tensor:
        """(T,) int64 sequence number of every token (no sync: the output size is known)."""
        n = torch.arange(self.num_sequences, device=self.indices.device)
        return torch.repeat_interleave(n, self.lengths(), output_size=self.num_tokens)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, ...) -> (T, ...): the real tokens' entries."""
        return x.flatten(0, 1).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(T, ...) -> (B, S, ...) with zeros at padding (differentiable)."""
        b, s = self.shape
        out = x.new_zeros((b * s, *x.shape[1:]))
        return out.index_copy(0, self.indices, x).view(b, s, *x.shape[1:])

    def to(self, device: torch.device) -> TokenLayout:
        return TokenLayout(self.indices.to(device, non_blocking=True),
                           self.cu_seqlens.to(device, non_blocking=True), self.max_seqlen,
                           self.shape, self.positions.to(device, non_blocking=True),
                           self.min_seqlen)


def token_layout(attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None) -> TokenLayout:
    """The layout of a (B, S) padding mask (nonzero = real token).

    A sequence starts at the first real token of every row and, when ``position_ids`` (B, S) are
    given (packed rows), also wherever a real token has position 0. Without ``position_ids`` a
    token's position is its column, as in the padded model.
    """
    b, s = attention_mask.shape
    flat = attention_mask.reshape(-1) != 0
    indices = flat.nonzero().squeeze(1)                        # sync on a GPU: T
    t = indices.shape[0]
    rows = torch.div(indices, s, rounding_mode="floor")
    begins = torch.ones(t, dtype=torch.bool, device=indices.device)
    begins[1:] = rows[1:] != rows[:-1]
    if position_ids is None:
        positions = indices - rows * s
    else:
        # index_select: advanced indexing (t[idx]) is hundreds of times slower on a CPU here
        positions = position_ids.reshape(-1).index_select(0, indices).long()
        begins |= positions == 0
    starts = begins.nonzero().squeeze(1)                       # sync on a GPU: N
    cu = torch.cat([starts, starts.new_tensor([t])]).to(torch.int32)
    lengths = cu[1:] - cu[:-1]
    longest = int(lengths.max()) if t else 0                  # sync on a GPU
    shortest = int(lengths.min()) if t else 0                 # sync on a GPU
    return TokenLayout(indices, cu, longest, (b, s), positions, shortest)


def layout_from_batch(batch: Mapping) -> TokenLayout | None:
    """The layout the loader computed for this batch (``LAYOUT_KEYS``), on the batch's device
    (``max_seqlen`` and ``min_seqlen`` stay on the host: ``bertforge.data.batch.HOST_KEYS``), or None
    when the batch carries none."""
    if "cu_seqlens" not in batch:
        return None
    ids = batch["input_ids"]
    indices = batch["token_indices"]
    s = ids.shape[-1]
    if "position_ids" in batch:
        positions = batch["position_ids"].reshape(-1).index_select(0, indices)
    else:
        positions = indices % s
    cu = batch["cu_seqlens"]
    # A layout from before min_seqlen was shipped: found here (a sync when cu is on a GPU).
    shortest = batch["min_seqlen"] if "min_seqlen" in batch else (cu[1:] - cu[:-1]).min()
    return TokenLayout(indices, cu, int(batch["max_seqlen"]), (ids.shape[0], s), positions,
                       int(shortest))


def layout_batch_entries(attention_mask: torch.Tensor,
                         position_ids: torch.Tensor | None = None) -> dict:
    """``LAYOUT_KEYS`` for a CPU batch (the loader's side of :func:`layout_from_batch`)."""
    layout = token_layout(attention_mask, position_ids)
    return {"token_indices": layout.indices, "cu_seqlens": layout.cu_seqlens,
            "max_seqlen": torch.tensor(layout.max_seqlen),
            "min_seqlen": torch.tensor(layout.min_seqlen)}


def packed_keep_mask(layout: TokenLayout) -> torch.Tensor:
    """(B, 1, S, S) bool for the padded path on packed rows: a token attends to the tokens of
    its own sequence only (block-diagonal); padding queries attend to themselves (finite, unused)."""
    b, s = layout.shape
    seq = torch.full((b * s,), -1, dtype=torch.long, device=layout.indices.device)
    seq = seq.index_copy(0, layout.indices, layout.sequence_of_token()).view(b, s)
    keep = (seq[:, :, None] == seq[:, None, :]) & (seq[:, None, :] >= 0)
    keep |= torch.eye(s, dtype=torch.bool, device=seq.device)
    return keep[:, None]


@functools.lru_cache(maxsize=None)
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def resolve_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """The backend ``auto`` means on ``device`` for ``dtype``; a named one is checked."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not one of {', '.join(BACKENDS)}")
    half = dtype in (torch.float16, torch.bfloat16)
    if name == "flash" and (_flash_varlen() is None or device.type != "cuda" or not half):
        raise ValueError("the flash backend needs the flash-attn package, a CUDA device and "
                         "fp16/bf16 activations; use backend auto")
    if name != "auto":
        return name
    if device.type == "cuda":
        return "flash" if half and _flash_varlen() is not None else "nested"
    return "padded"


@torch.compiler.disable  # a kernel call on data-dependent layouts: eager between compiled regions
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                     dropout_p: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Bidirectional attention within each sequence: q, k, v (T, heads, head_dim) -> same shape."""
    backend = resolve_backend(backend, q.device, q.dtype)
    if backend == "flash":
        cu = layout.cu_seqlens
        return _flash_varlen()(q, k, v, cu, cu, layout.max_seqlen, layout.max_seqlen,
                               dropout_p=dropout_p)
    if backend == "nested":
        return _nested_attention(q, k, v, layout, dropout_p)
    return _bucketed_attention(q, k, v, layout, dropout_p)


def nested_heads(x: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """(T, heads, head_dim) -> a jagged nested tensor (N, heads, j, head_dim) that knows its
    shortest and longest sequence, so SDPA's kernel selection reads no length from the device."""
    if layout.offsets is None:  # int64 offsets, made once per batch and shared by every layer
        layout.offsets = layout.cu_seqlens.long()
    return torch.nested.nested_tensor_from_jagged(
        x, offsets=layout.offsets, min_seqlen=layout.min_seqlen,
        max_seqlen=layout.max_seqlen).transpose(1, 2)


def _nested_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                      dropout_p: float) -> torch.Tensor:
    """The ``nested`` backend: SDPA on jagged nested tensors, PyTorch's fused varlen kernels on
    CUDA."""
    with warnings.catch_warnings():
        # CPU only: PyTorch's math fallback for jagged inputs converts them to its prototype
        # strided nested layout and says so on every call (no fused CPU kernel exists).
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in "
                                "prototype stage", category=UserWarning)
        out = F.scaled_dot_product_attention(nested_heads(q, layout), nested_heads(k, layout),
                                             nested_heads(v, layout), dropout_p=dropout_p)
    return out.transpose(1, 2).values()


def varlen_self_attention(hidden: torch.Tensor, projections: tuple, num_heads: int,
                          layout: TokenLayout, dropout_p: float, backend: str) -> torch.Tensor:
    """Self-attention context of unpadded states: ``projections`` (query, key, value modules)
    applied to hidden (T, D), split into ``num_heads`` heads, attended within each sequence,
    merged back -> (T, D) (before any output projection)."""
    t, d = hidden.shape
    q, k, v = (proj(hidden).view(t, num_heads, d // num_heads) for proj in projections)
    return varlen_attention(q, k, v, layout, dropout_p, backend).reshape(t, d)


BUCKET = 32
"""Width granularity of the padded backend: sequences padded to the next multiple of 32 tokens,
each width its own SDPA call."""


@dataclass
class _Bucket:
    rows: int             # sequences in the bucket
    width: int            # their padded length
    tokens: torch.Tensor  # (n,) indices into the T tokens
    slots: torch.Tensor   # (n,) positions in the (rows * width) buffer
    keep: torch.Tensor | None  # (rows, 1, 1, width) key mask; None when every row is full


def _buckets(layout: TokenLayout, device: torch.device) -> list[_Bucket]:
    """Sequences grouped by length rounded up to ``BUCKET`` (host arithmetic on the lengths: free
    when the layout came from the loader on the CPU, one sync for a layout on a GPU)."""
    cu = layout.cu_seqlens.cpu().numpy().astype(np.int64)
    lengths = np.diff(cu)
    widths = -(-lengths // BUCKET) * BUCKET
    out = []
    for width in np.unique(widths).tolist():  # a loop over a handful of widths
        members = np.flatnonzero(widths == width)
        lens = lengths[members]
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        tokens = np.repeat(cu[members], lens) + within
        slots = np.repeat(np.arange(len(members)) * width, lens) + within
        keep = None
        if (lens != width).any():
            mask = np.arange(width)[None, :] < lens[:, None]
            keep = torch.from_numpy(mask).to(device)[:, None, None, :]
        out.append(_Bucket(len(members), width, torch.from_numpy(tokens).to(device),
                           torch.from_numpy(slots).to(device), keep))
    return out


def _bucketed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TokenLayout,
                        dropout_p: float) -> torch.Tensor:
    """The ``padded`` backend: one padded row per *sequence* (so packed rows stay
    block-diagonal), sequences of similar length batched together so that a short sequence is
    not padded to the batch's longest."""
    if layout.buckets is None:
        layout.buckets = _buckets(layout, q.device)
    out = torch.zeros_like(q)
    for b in layout.buckets:
        def spread(x: torch.Tensor) -> torch.Tensor:  # (T, h, d) -> (rows, h, width, d)
            buf = x.new_zeros((b.rows * b.width, *x.shape[1:]))
            buf = buf.index_copy(0, b.slots, x.index_select(0, b.tokens))
            return buf.view(b.rows, b.width, *x.shape[1:]).transpose(1, 2)

        context = F.scaled_dot_product_attention(spread(q), spread(k), spread(v),
                                                 attn_mask=b.keep, dropout_p=dropout_p)
        flat = context.transpose(1, 2).reshape(b.rows * b.width, *q.shape[1:])
        out = out.index_copy(0, b.tokens, flat.index_select(0, b.slots))
    return out
