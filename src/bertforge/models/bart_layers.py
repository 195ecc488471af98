"""BART's building blocks: attention, the encoder and decoder layers, learned positions.

Transformers' parameter names (``self_attn.q_proj``, ``encoder_attn``, ``fc1``, ...), so a layer's
``state_dict()`` is its checkpoint entry. Each layer runs on padded rows or on unpadded tokens:

* encoder self-attention goes through ``bertforge.ops.attention.attend`` (a keep mask for padded
  rows, a ``TokenLayout`` for unpadded tokens);
* decoder attention reads a :class:`PaddedDecoding` (masks for padded rows, and the key/value
  cache of generation) or a ``Seq2SeqLayout`` (unpadded targets and sources,
  ``bertforge.models.bart_varlen``).

On unpadded tokens (training) the projections of one input are fused into one matmul (queries,
keys and values of self-attention; keys and values of cross-attention) over the concatenated
weights: one (T, D) x (D, 3D) product and its backward cost what three (T, D) x (D, D) ones do
on one CPU thread and less with several (fewer parallel regions to synchronise). The padded path
keeps transformers' three products, so that generation computes exactly what transformers
computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import DataError
from bertforge.models.bart_cache import LayerCache
from bertforge.models.bart_config import BartConfig
from bertforge.models.bart_varlen import Seq2SeqLayout, causal_attention, cross_attention
from bertforge.ops.attention import Attend, attend, resolve_backend, sdpa
from bertforge.ops.unpad import TokenLayout

POSITION_OFFSET = 2  # BART's learned positions start at row 2 (a fairseq legacy kept by all ports)


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called ``name`` in a BART config (validated by ``BartConfig``)."""
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    return torch.tanh if name == "tanh" else F.relu


@dataclass
class PaddedDecoding:
    """What the decoder's attention reads on padded rows (B, T)."""

    self_mask: torch.Tensor | None
    """(B or 1, 1, T, T_past + T) bool, True = may attend; None: see ``causal``."""
    causal: bool
    """With no ``self_mask``: plain causal attention over the T tokens (True) or every key
    visible (False: one new token after the cache)."""
    cross_keep: torch.Tensor | None
    """(B, 1, 1, S) bool source keep mask, or None (nothing to hide)."""


DecoderAttend = Union[PaddedDecoding, Seq2SeqLayout]


class BartAttention(nn.Module):
    """Multi-head attention: self-attention (causal or not) or cross-attention over the encoder."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.dropout_p = num_heads, d_model // num_heads, dropout
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.q_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.varlen_backend = "auto"
        """Kernel for unpadded tokens (``bertforge.ops.attention.BACKENDS``); set from outside
        (``bertforge.speed``)."""

    @property
    def _drop(self) -> float:
        return self.dropout_p if self.training else 0.0

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, D) -> (B, heads, T, head_dim)
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def _fused(self, x: torch.Tensor, *projections: nn.Linear) -> torch.Tensor:
        """(T, D) through ``projections`` in one matmul -> (T, len(projections), heads,
        head_dim)."""
        if not all(isinstance(p, nn.Linear) for p in projections):
            # int8 layers (ops.linear.Int8Linear) hold packed weights: one call each
            return torch.stack([p(x) for p in projections], dim=-2).unflatten(
                -1, (self.num_heads, self.head_dim))
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        return F.linear(x, weight, bias).unflatten(-1, (len(projections), self.num_heads,
                                                        self.head_dim))

    def project_kv(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``states`` (B, T, D), split into heads."""
        return self._heads(self.k_proj(states)), self._heads(self.v_proj(states))

    def forward(self, hidden: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, is_causal: bool = False) -> torch.Tensor:
        """Queries from ``hidden`` (B, T, D) over keys/values (B, heads, S, head_dim);
        ``mask`` bool, broadcastable to (B, heads, T, S), True = may attend -> (B, T, D)."""
        b, t, d = hidden.shape
        q = self._heads(self.q_proj(hidden))
        context = sdpa(q, k, v, mask, self._drop, is_causal=is_causal and mask is None)
        return self.out_proj(context.transpose(1, 2).reshape(b, t, d))

    def self_attend(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        """Bidirectional self-attention (the encoder's): hidden (B, S, D) with a keep mask or
        None, or unpadded (T, D) with its ``TokenLayout`` -> the shape of hidden."""
        if isinstance(where, TokenLayout):
            q, k, v = self._fused(hidden, self.q_proj, self.k_proj, self.v_proj).unbind(-3)
            if resolve_backend(self.varlen_backend, hidden.device, hidden.dtype,
                               self.head_dim) == "nested":
                q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # jagged: dense values
        else:  # (..., D) -> (..., heads, head_dim)
            q, k, v = (proj(hidden).unflatten(-1, (self.num_heads, self.head_dim))
                       for proj in (self.q_proj, self.k_proj, self.v_proj))
        context = attend(q, k, v, where, self._drop, self.varlen_backend)
        return self.out_proj(context.flatten(-2))

    def causal_attend(self, hidden: torch.Tensor, where: Seq2SeqLayout) -> torch.Tensor:
        """Causal self-attention of unpadded decoder tokens (T_t, D) -> (T_t, D)."""
        qkv = self._fused(hidden, self.q_proj, self.k_proj, self.v_proj)
        context = causal_attention(qkv, where, self._drop, self.varlen_backend)
        return self.out_proj(context.flatten(-2))

    def cross_attend(self, hidden: torch.Tensor, source: torch.Tensor,
                     where: Seq2SeqLayout) -> torch.Tensor:
        """Unpadded decoder tokens (T_t, D) over their sources' unpadded encoder states
        (T_s, D) -> (T_t, D)."""
        q = self.q_proj(hidden).unflatten(-1, (self.num_heads, self.head_dim))
        kv = self._fused(source, self.k_proj, self.v_proj)
        context = cross_attention(q, kv, where, self._drop, self.varlen_backend)
        return self.out_proj(context.flatten(-2))


class _Block(nn.Module):
    """Shared residual plumbing: post-LN ``norm(x + drop(f(x)))`` or pre-LN ``x + drop(f(norm(x)))``."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.pre_ln = config.normalize_before
        self.dropout = nn.Dropout(config.dropout)

    def residual(self, x: torch.Tensor, norm: nn.LayerNorm,
                 branch: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.pre_ln:
            return x + self.dropout(branch(norm(x)))
        return norm(x + self.dropout(branch(x)))


class BartEncoderLayer(_Block):
    """Self-attention block, then feed-forward block."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__(config)
        d, eps = config.d_model, config.layer_norm_eps
        self.self_attn = BartAttention(d, config.encoder_attention_heads, config.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=eps)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=eps)
        self.act = activation(config.activation_function)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.act(self.fc1(x))))

    def forward(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        """(B, S, D), where (B, 1, 1, S) bool or None -> (B, S, D); or unpadded (T, D) with its
        ``TokenLayout`` -> (T, D)."""
        hidden = self.residual(hidden, self.self_attn_layer_norm,
                               lambda x: self.self_attn.self_attend(x, where))
        return self.residual(hidden, self.final_layer_norm, self.feed_forward)


class BartDecoderLayer(BartEncoderLayer):
    """Causal self-attention block, cross-attention block, feed-forward block."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__(config.replace(encoder_attention_heads=config.decoder_attention_heads,
                                        encoder_ffn_dim=config.decoder_ffn_dim))
        d = config.d_model
        self.encoder_attn = BartAttention(d, config.decoder_attention_heads,
                                          config.attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, encoder_hidden: torch.Tensor,  # type: ignore[override]
                where: DecoderAttend, cache: LayerCache | None = None) -> torch.Tensor:
        """Padded rows: hidden (B, T, D), encoder_hidden (B, S, D), a :class:`PaddedDecoding`
        and optionally the layer's cache -> (B, T, D). Unpadded: hidden (T_t, D), encoder_hidden
        (T_s, D) and their ``Seq2SeqLayout`` -> (T_t, D)."""
        if isinstance(where, Seq2SeqLayout):
            def attend_self(x: torch.Tensor) -> torch.Tensor:
                return self.self_attn.causal_attend(x, where)

            def attend_encoder(x: torch.Tensor) -> torch.Tensor:
                return self.encoder_attn.cross_attend(x, encoder_hidden, where)
        else:
            def attend_self(x: torch.Tensor) -> torch.Tensor:
                k, v = self.self_attn.project_kv(x)
                if cache is not None:
                    k, v = cache.append(k, v)
                return self.self_attn(x, k, v, where.self_mask, is_causal=where.causal)

            def attend_encoder(x: torch.Tensor) -> torch.Tensor:
                if cache is not None:
                    k, v = cache.cross(encoder_hidden, self.encoder_attn.project_kv)
                else:
                    k, v = self.encoder_attn.project_kv(encoder_hidden)
                return self.encoder_attn(x, k, v, where.cross_keep)

        hidden = self.residual(hidden, self.self_attn_layer_norm, attend_self)
        hidden = self.residual(hidden, self.encoder_attn_layer_norm, attend_encoder)
        return self.residual(hidden, self.final_layer_norm, self.feed_forward)


def decoder_self_mask(length: int, past: int, attention_mask: torch.Tensor | None,
                      device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """Self-attention mask of ``length`` new decoder tokens after ``past`` cached ones, as
    ``(mask, causal)``.

    Without padding no tensor is built: ``(None, True)`` for plain causal attention over the new
    tokens (no past; SDPA's ``is_causal`` kernels), ``(None, False)`` for one new token after the
    cache (it sees every key). Otherwise a (1 or B, 1, T, past + T) bool mask, True = may attend:
    causal, and with ``attention_mask`` (B, past + T) padding keys hidden. A query with nothing
    to attend to (a left pad) attends everywhere instead, so outputs stay finite.
    """
    padded = attention_mask is not None and not bool(attention_mask.bool().all())
    if not padded and (past == 0 or length == 1):
        return None, past == 0 and length > 1
    total = past + length
    rows = torch.arange(past, total, device=device)[:, None]
    keep = (torch.arange(total, device=device)[None, :] <= rows)[None, None]  # (1, 1, T, total)
    if padded:
        keep = keep & attention_mask.bool()[:, None, None, :]
        keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep, False


class BartLearnedPositionalEmbedding(nn.Embedding):
    """Learned positions; position p is row p + 2 (BART's offset)."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__(max_positions + POSITION_OFFSET, d_model)
        self.max_positions = max_positions

    def forward(self, length: int, start: int = 0) -> torch.Tensor:  # type: ignore[override]
        """Embeddings of positions start .. start + length - 1: (length, D)."""
        self.check(start + length)
        positions = torch.arange(start + POSITION_OFFSET, start + length + POSITION_OFFSET,
                                 device=self.weight.device)
        return super().forward(positions)

    def check(self, end: int) -> None:
        """DataError when a sequence reaches ``end`` tokens, more than the table holds."""
        if end > self.max_positions:
            raise DataError(
                f"a sequence reaches {end} tokens but the model's "
                f"max_position_embeddings is {self.max_positions}: truncate inputs (e.g. lower "
                f"data.max_seq_length, data.max_target_length or generation max_length)")


__all__ = ["POSITION_OFFSET", "BartAttention", "BartDecoderLayer", "BartEncoderLayer",
           "BartLearnedPositionalEmbedding", "DecoderAttend", "PaddedDecoding", "activation",
           "decoder_self_mask"]
