"""Self-attention and the residual "output" blocks of a BERT layer.

Attention goes through ``torch.nn.functional.scaled_dot_product_attention`` so PyTorch picks the
fastest kernel for the device (flash / memory-efficient / math); on unpadded tokens through
``bertforge.models.unpad.varlen_attention``. Module and parameter names follow
Hugging Face BERT (``attention.self.query``, ``attention.output.dense``, ``attention.output.LayerNorm``)
so that the state dict is the Hugging Face checkpoint without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.models.config import BertConfig
from bertforge.models.unpad import TokenLayout, varlen_self_attention

Attend = torch.Tensor | TokenLayout | None
"""What a layer attends with: a (B, 1, 1 or S, S) bool keep mask or None over (B, S, H) states,
or the ``TokenLayout`` of unpadded (T, H) states."""


def attention_keep_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
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


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention (no output projection: that is ``BertSelfOutput``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.dropout_p = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.varlen_backend = "auto"
        """Kernel for unpadded tokens (``bertforge.models.unpad.BACKENDS``)."""

    def forward(self, hidden: torch.Tensor, keep_mask: Attend) -> torch.Tensor:
        """hidden: (B, S, H); keep_mask: (B, 1, 1 or S, S) bool or None -> context (B, S, H).
        Unpadded: hidden (T, H) with its ``TokenLayout`` -> (T, H)."""
        dropout_p = self.dropout_p if self.training else 0.0
        if isinstance(keep_mask, TokenLayout):
            return varlen_self_attention(hidden, (self.query, self.key, self.value),
                                         self.num_heads, keep_mask, dropout_p, self.varlen_backend)
        b, s, h = hidden.shape
        # (B, S, H) -> (B, heads, S, head_dim)
        q = self.query(hidden).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(hidden).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.value(hidden).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=keep_mask, dropout_p=dropout_p)
        # (B, heads, S, head_dim) -> (B, S, H)
        return context.transpose(1, 2).reshape(b, s, h)


class BertResidualOutput(nn.Module):
    """Projection + dropout + residual, with the LayerNorm placed for post-LN or pre-LN.

    Post-LN (original BERT): ``LayerNorm(residual + dropout(dense(x)))``.
    Pre-LN: the LayerNorm is applied to the branch *input* by the caller (``normalize_input``), and
    this block returns ``residual + dropout(dense(x))``. Keeping one ``LayerNorm`` per block in both
    layouts keeps the parameter names identical.
    """

    def __init__(self, in_features: int, config: BertConfig) -> None:
        super().__init__()
        self.pre_layernorm = config.pre_layernorm
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def normalize_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """Branch input: normalised for pre-LN, unchanged for post-LN."""
        return self.LayerNorm(hidden) if self.pre_layernorm else hidden

    def forward(self, branch: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """branch: (B, S, in_features), residual: (B, S, H) -> (B, S, H)."""
        out = residual + self.dropout(self.dense(branch))
        return out if self.pre_layernorm else self.LayerNorm(out)


class BertSelfOutput(BertResidualOutput):
    """Output projection of the attention block (``attention.output``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config.hidden_size, config)


class BertAttention(nn.Module):
    """``attention.self`` + ``attention.output``: the attention half of a layer, residual included."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden: torch.Tensor, keep_mask: Attend) -> torch.Tensor:
        """(B, S, H) -> (B, S, H), or unpadded (T, H) -> (T, H)."""
        context = self.self(self.output.normalize_input(hidden), keep_mask)
        return self.output(context, hidden)
