"""Self-attention and the residual "output" blocks of a BERT layer.

Attention goes through ``bertforge.ops.attention.attend``: SDPA over padded rows (PyTorch picks
the fastest kernel for the device: flash / memory-efficient / math), a variable-length kernel
over unpadded tokens; the layer code is the same for both. Module and parameter names follow
Hugging Face BERT (``attention.self.query``, ``attention.output.dense``, ``attention.output.LayerNorm``)
so that the state dict is the Hugging Face checkpoint without renaming.
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.models.config import BertConfig
from bertforge.ops.attention import Attend, attend, attend_at, queries_at_rows
from bertforge.ops.dropout import Dropout


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
        """Kernel for unpadded tokens (``bertforge.ops.attention.BACKENDS``); set from outside
        (``bertforge.train.parallelize``)."""

    def forward(self, hidden: torch.Tensor, where: Attend,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, S, H) with a (B, 1, 1 or S, S) bool keep mask or None, or unpadded (T, H)
        with its ``TokenLayout`` -> context, the shape of hidden; only the (K, H) context at
        ``rows`` (ascending indices into the states flattened to (tokens, H)) when given."""
        dropout_p = self.dropout_p if self.training else 0.0
        k, v = self._heads(self.key, hidden), self._heads(self.value, hidden)
        if rows is not None and queries_at_rows(where, self.varlen_backend, hidden.device,
                                                hidden.dtype, self.head_dim):
            q = self._heads(self.query, at_rows(hidden, rows))
            return attend_at(q, k, v, where, rows, dropout_p, self.varlen_backend).flatten(-2)
        q = self._heads(self.query, hidden)
        context = attend(q, k, v, where, dropout_p, self.varlen_backend).flatten(-2)
        return context if rows is None else at_rows(context, rows)

    def _heads(self, proj: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., heads, head_dim)."""
        return proj(hidden).unflatten(-1, (self.num_heads, self.head_dim))


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
        self.dropout = Dropout(config.hidden_dropout_prob)

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

    def forward(self, hidden: torch.Tensor, where: Attend,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, S, H) -> (B, S, H), or unpadded (T, H) -> (T, H); (K, H) at ``rows`` when given
        (``BertSelfAttention``)."""
        context = self.self(self.output.normalize_input(hidden), where, rows)
        return self.output(context, hidden if rows is None else at_rows(hidden, rows))


def at_rows(hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(..., H) states flattened to (tokens, H), at ``rows`` -> (K, H)."""
    return hidden.flatten(0, -2).index_select(0, rows)
