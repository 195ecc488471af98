"""Where a batch's tokens are: the padded rows, or the real tokens only (unpadding, packing).

A padded batch is (B, S) with ``attention_mask`` 1 at real tokens. Unpadding removes the padding
once, at the encoder's entry: every layer then runs on the (T, H) tensor of the T real tokens,
so no matmul, LayerNorm or activation is spent on padding. Attention is the one operation that
must know where sequences begin and end; :class:`TokenLayout` says so with ``cu_seqlens`` (the
offsets of the N sequences in the T tokens), the convention of flash-attention's varlen kernels.

A row may also hold several sequences (packing, ``bertforge.data.packing``): ``position_ids``
then restart at 0 where each sequence begins, and attention stays inside each sequence
(block-diagonal), in the unpadded path by construction and in the padded path by a mask
(:func:`packed_keep_mask`).

An encoder runs one code path for either layout: :func:`batch_layout` picks a
:class:`TokenLayout` (unpadded) or a :class:`RowLayout` (padded rows), and both answer the same
questions: ``enter(x)`` puts a (B, S, ...) input into the layout (identity for rows),
``exit(x)`` pads states back, ``attend`` is what attention takes (``bertforge.ops.attention``),
``positions`` the position ids, ``first_tokens`` each sequence's first state and ``gather`` the
states at flat positions ``row * S + column``.

Shared by the data loader (it ships the layout with each batch, :func:`layout_batch_entries`)
and the models (they read it back, :func:`layout_from_batch`). Host-device syncs:
:func:`token_layout` needs four (the number of real tokens, of sequences, the longest and the
shortest length) when it runs on a GPU tensor; a layout from the loader costs the step none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

import torch

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
    """The padded attention backend's length groups, made on first use and shared by every layer."""
    offsets: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """The nested attention backend's int64 ``cu_seqlens``, made on first use, shared likewise."""

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

    # -- the layout interface an encoder runs on (shared with RowLayout) ----------------------
    @property
    def attend(self) -> TokenLayout:
        """What attention takes: the layout itself (varlen kernels read ``cu_seqlens``)."""
        return self

    def enter(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """(B, S, ...) inputs -> (T, ...); None stays None."""
        return None if x is None else self.unpad(x)

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        """(T, ...) states -> (B, S, ...), zeros at padding."""
        return self.pad(x)

    def first_tokens(self, states: torch.Tensor) -> torch.Tensor:
        """(T, H) -> (N, H): each sequence's first token."""
        return states.index_select(0, self.first_rows(states.device))

    def first_rows(self, device: torch.device) -> torch.Tensor:
        """(N,) int64 rows of the (T, H) states that hold each sequence's first token (on the
        layout's device)."""
        return self.starts()

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """(K,) int64 rows of the (T, H) states at (K,) ascending flat positions
        ``row * S + column`` of real tokens, or at the True entries of a (B, S) bool mask (one
        sync for K)."""
        if positions.dtype == torch.bool:
            return self.unpad(positions).nonzero().squeeze(1)
        return torch.searchsorted(self.indices, positions)

    def gather(self, states: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """(T, H) states at (K,) ascending flat positions ``row * S + column`` of real tokens."""
        return states.index_select(0, self.rows_of(flat))


@dataclass
class RowLayout:
    """The padded rows of a (B, S) batch, with :class:`TokenLayout`'s interface: inputs and
    states stay (B, S, ...), and attention reads a keep mask."""

    keep: torch.Tensor | None
    """(B, 1, 1 or S, S) bool, True = may attend; None when nothing is masked (fused kernels)."""
    shape: tuple[int, int]
    """(B, S)."""
    positions: torch.Tensor | None = None
    """(B, S) position ids of packed rows; None: a token's position is its column."""
    starts: torch.Tensor | None = None
    """(N,) flat positions of each sequence's first token in packed rows; None: column 0."""

    @property
    def attend(self) -> torch.Tensor | None:
        return self.keep

    def enter(self, x: torch.Tensor | None) -> torch.Tensor | None:
        return x

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def first_tokens(self, states: torch.Tensor) -> torch.Tensor:
        """(B, S, H) -> (N, H): column 0 of every row, or each packed sequence's first token."""
        return states[:, 0] if self.starts is None else self.gather(states, self.starts)

    def first_rows(self, device: torch.device) -> torch.Tensor:
        """(N,) int64 rows of the states flattened to (B * S, H) that hold each sequence's
        first token (on ``device``, where the states are)."""
        if self.starts is not None:
            return self.starts
        b, s = self.shape
        return torch.arange(0, b * s, s, device=device)

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """(K,) int64 rows of the (B * S, H) states: the flat positions themselves, or the True
        entries of a (B, S) bool mask (one sync for K)."""
        if positions.dtype == torch.bool:
            return positions.reshape(-1).nonzero().squeeze(1)
        return positions

    def gather(self, states: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """(B, S, H) states at (K,) flat positions ``row * S + column``."""
        return states.flatten(0, 1).index_select(0, flat)


Layout = Union[TokenLayout, RowLayout]
"""How an encoder lays out a batch (see the module docstring)."""


def batch_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, layout: TokenLayout | None = None,
                 *, unpad: bool = False) -> Layout:
    """The layout an encoder runs a (B, S) batch in: its real tokens only (``layout``, the
    loader's, or found here) when ``unpad`` is on and there is padding or packing to remove;
    padded rows otherwise, attending with the padding mask or, for packed rows (``position_ids``
    given), the block-diagonal one."""
    packed = position_ids is not None
    if layout is None and (packed or (unpad and attention_mask is not None)):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        layout = token_layout(mask, position_ids)
    if unpad and layout is not None:
        return layout
    shape = (input_ids.shape[0], input_ids.shape[-1])
    if packed:
        assert layout is not None
        starts = layout.indices.index_select(0, layout.starts())  # flat positions
        return RowLayout(packed_keep_mask(layout), shape, position_ids, starts)
    return RowLayout(padding_keep_mask(attention_mask), shape)


def token_layout(attention_mask: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> TokenLayout:
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
    (``max_seqlen`` and ``min_seqlen`` stay on the host: ``bertforge.data.batch.HOST_KEYS``), or
    None when the batch carries none."""
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


def padding_keep_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Turn a [B, S] padding mask (1 = real token) into the boolean mask SDPA takes, or None.

    Returns None when there is nothing to mask so SDPA may use its fused kernels (flash attention
    accepts no mask). Deciding that needs one device->host sync per forward pass; callers that know
    their batch is unpadded avoid it by passing ``attention_mask=None``.

    The result is [B, 1, 1, S] (broadcast over heads and query positions), True = may attend.
    A sequence whose mask is all zeros would give NaN (softmax over nothing), so such a sequence
    attends to every position instead; its outputs are meaningless either way but stay finite.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    if bool(keep.all()):
        return None
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep[:, None, None, :]


def packed_keep_mask(layout: TokenLayout) -> torch.Tensor:
    """(B, 1, S, S) bool for the padded path on packed rows: a token attends to the tokens of
    its own sequence only (block-diagonal); padding queries attend to themselves (finite,
    unused)."""
    b, s = layout.shape
    seq = torch.full((b * s,), -1, dtype=torch.long, device=layout.indices.device)
    seq = seq.index_copy(0, layout.indices, layout.sequence_of_token()).view(b, s)
    keep = (seq[:, :, None] == seq[:, None, :]) & (seq[:, None, :] >= 0)
    keep |= torch.eye(s, dtype=torch.bool, device=seq.device)
    return keep[:, None]


__all__ = ["LAYOUT_KEYS", "Layout", "RowLayout", "TokenLayout", "batch_layout",
           "layout_batch_entries", "layout_from_batch", "packed_keep_mask", "padding_keep_mask",
           "token_layout"]
