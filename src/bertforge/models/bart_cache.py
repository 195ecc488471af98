"""The decoder's key/value cache for incremental decoding (generation).

Self-attention keys and values live in buffers preallocated along time and grown by doubling,
so a step writes its new entries in place instead of concatenating the whole past (O(T) per
step, O(T^2) per sequence). The buffers are laid out time-first, (capacity, N, heads, head_dim),
so that the filled part ``[:length]`` is one contiguous block: reordering rows (beam search)
copies only that block, and attention reads it through a (N, heads, length, head_dim) view.

Cross-attention keys and values are a function of the encoder states passed to ``decode_step``:
they are computed once and reused for as long as the same encoder tensor is passed, and never
copied when the rows are reordered. Beam search passes the same encoder states at every step and
reorders within each input's beams, whose encoder rows are equal, so the cached entries stay
right; a caller that reorders rows across inputs passes the matching reordered encoder states
(a new tensor), and the entries are recomputed from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

_FIRST_CAPACITY = 32  # time steps of the first buffers; doubled whenever a step needs more


class LayerCache:
    """One decoder layer's cached keys and values."""

    def __init__(self) -> None:
        self.length = 0
        self._k: torch.Tensor | None = None  # (capacity, N, heads, head_dim)
        self._v: torch.Tensor | None = None
        self._spare: tuple[torch.Tensor, torch.Tensor] | None = None  # reorder targets
        self._cross: tuple[torch.Tensor, torch.Tensor] | None = None  # (N, heads, S, head_dim)
        self._cross_source: tuple[torch.Tensor, int | None] | None = None  # (states, version)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' keys and values (N, heads, T, head_dim); -> every key and value
        so far as (N, heads, length, head_dim) views of the buffers."""
        end = self.length + k.shape[2]
        if self._k is None or end > self._k.shape[0] or self._k.shape[1] != k.shape[0]:
            self._grow(k, end)
        assert self._k is not None and self._v is not None
        self._k[self.length:end] = k.permute(2, 0, 1, 3)
        self._v[self.length:end] = v.permute(2, 0, 1, 3)
        self.length = end
        return self._k[:end].permute(1, 2, 0, 3), self._v[:end].permute(1, 2, 0, 3)

    def _grow(self, k: torch.Tensor, end: int) -> None:
        old = self._k.shape[0] if self._k is not None else _FIRST_CAPACITY // 2
        capacity = max(end, 2 * old)
        rows, heads, _, head_dim = k.shape
        shape = (capacity, rows, heads, head_dim)
        new_k, new_v = k.new_empty(shape), k.new_empty(shape)
        if self._k is not None and self._v is not None and self.length:
            new_k[:self.length] = self._k[:self.length]
            new_v[:self.length] = self._v[:self.length]
        self._k, self._v, self._spare = new_k, new_v, None

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (N',), in that order: one copy of the filled part."""
        if self._k is None or self._v is None:
            return
        if index.shape[0] != self._k.shape[1]:  # the row count changes: full buffers, which
            # the next append grows
            self._k = self._k[:self.length].index_select(1, index)
            self._v = self._v[:self.length].index_select(1, index)
            self._spare = None
            return
        if self._spare is None:
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        spare_k, spare_v = self._spare
        torch.index_select(self._k[:self.length], 1, index, out=spare_k[:self.length])
        torch.index_select(self._v[:self.length], 1, index, out=spare_v[:self.length])
        self._spare = (self._k, self._v)
        self._k, self._v = spare_k, spare_v

    def cross(self, encoder_hidden: torch.Tensor,
              project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of ``encoder_hidden`` (N, S, D), projected by
        ``project`` once per encoder tensor (and per in-place change of it)."""
        source = self._cross_source
        # An inference tensor keeps no version counter (reading it raises): its identity alone
        # tells, as nothing outside inference mode can change it in place.
        version = None if encoder_hidden.is_inference() else encoder_hidden._version
        if (self._cross is None or source is None or source[0] is not encoder_hidden
                or source[1] != version):
            self._cross = project(encoder_hidden)
            self._cross_source = (encoder_hidden, version)
        return self._cross


@dataclass
class KVCache:
    """Keys and values of every decoder layer for incremental decoding (see the module notes)."""

    layers: list[LayerCache] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Decoder tokens seen so far (the position of the next one)."""
        return self.layers[0].length if self.layers else 0

    def reorder(self, index: torch.Tensor) -> KVCache:
        """Keep batch rows ``index`` (N,), in that order (beam search); in place, returns self.
        Cross-attention entries follow the encoder states of the next ``decode_step``."""
        for layer in self.layers:
            layer.reorder(index)
        return self
