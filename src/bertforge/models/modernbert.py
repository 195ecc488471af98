"""The ModernBERT encoder (Warner et al. 2024): ``ModernBertModel`` and its building blocks.

Token embeddings + LayerNorm (no position table: rotary embeddings in every attention layer),
pre-norm layers without biases, alternating global and sliding-window attention (layer i is
global when ``i % global_attn_every_n_layers == 0``; the others see ``local_attention // 2``
tokens each side), a GeGLU feed-forward block and a final LayerNorm. Global and local layers
rotate with different RoPE bases.

Pure ``nn.Module`` code, as ``bertforge.models.bert``; parameter names are transformers'
(``model.layers.0.attn.Wqkv.weight``...), so the state dict *is* a transformers ModernBERT
checkpoint. With ``unpad`` set (from outside, ``bertforge.train.parallelize``) padding is removed
once before the embeddings and restored once at the end (``bertforge.ops.unpad``); attention
then runs on the real tokens with per-sequence boundaries, the local layers through
``bertforge.ops.window``. Packed rows (``position_ids`` restarting at 0) work in both layouts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import DataError
from bertforge.models.bert import BertModelOutput
from bertforge.models.hub import PreTrainedModel
from bertforge.models.modernbert_config import GLOBAL, ModernBertConfig
from bertforge.ops.attention import Attend, attend
from bertforge.ops.dropout import Dropout
from bertforge.ops.rotary import apply_rotary, rotary_tables
from bertforge.ops.unpad import Layout, RowLayout, TokenLayout, batch_layout
from bertforge.ops.window import WindowPlan, band_keep_mask, window_attend

Rope = tuple[torch.Tensor, torch.Tensor]
"""(cos, sin) tables of a batch's positions, (B, S, head_dim) or (T, head_dim)."""


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation a ModernBERT config names (validated by ``ModernBertConfig``)."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.silu if name == "silu" else F.relu


def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertPreTrainedModel(PreTrainedModel):
    """Base of all bertforge ModernBERT classes: transformers' names for the generic loading
    code (``bertforge.models.hub``) and ModernBERT's initialisation."""

    config: ModernBertConfig
    config_class = ModernBertConfig
    checkpoint_prefix = "model"
    base_model_prefix = "model"
    body_prefixes = ("embeddings.", "layers.", "final_norm.")
    head_prefixes = ("head.", "decoder.", "classifier.")
    tied_keys = ("decoder.weight",)
    vocab_row_suffixes = ("embeddings.tok_embeddings.weight", "decoder.bias")

    def init_weights(self, skip_prefix: str | None = None) -> None:
        """transformers' ModernBERT scheme: truncated normal (``initializer_cutoff_factor``
        standard deviations) with std ``initializer_range`` for embeddings and input
        projections, ``initializer_range / sqrt(2 * layers)`` for output projections and the
        prediction head, ``hidden_size ** -0.5`` for classifiers; biases 0, LayerNorms 1/0; the
        padding row of the embedding 0. ``skip_prefix``: a submodule already initialised."""
        c = self.config
        std_in, std_out = c.initializer_range, c.initializer_range / math.sqrt(2 * c.num_hidden_layers)
        with torch.no_grad():
            for name, module in self.named_modules():
                if skip_prefix and (name == skip_prefix or name.startswith(skip_prefix + ".")):
                    continue
                leaf = name.rsplit(".", 1)[-1]
                if isinstance(module, nn.LayerNorm):
                    module.weight.fill_(1.0)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, nn.Embedding):
                    self._trunc_normal_(module, std_in)
                    if module.padding_idx is not None:
                        module.weight[module.padding_idx].zero_()
                elif isinstance(module, nn.Linear) and leaf == "decoder":  # weight: tied
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, nn.Linear):
                    std = {"Wqkv": std_in, "Wi": std_in, "classifier": c.hidden_size ** -0.5}
                    self._trunc_normal_(module, std.get(leaf, std_out))

    def _trunc_normal_(self, module: nn.Module, std: float) -> None:
        cut = self.config.initializer_cutoff_factor * std
        nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-cut, b=cut)
        if getattr(module, "bias", None) is not None:
            module.bias.zero_()

    def word_embeddings(self) -> nn.Embedding:
        """The (vocab_size, H) token embedding table."""
        base = getattr(self, self.base_model_prefix) if self.base_model_prefix else self
        return base.embeddings.tok_embeddings


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout (positions enter through RoPE, not here)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                           padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)
        self.drop = Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) or unpadded (T,) ids -> (..., H)."""
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    """Fused QKV projection, RoPE on queries and keys, global or sliding-window attention,
    output projection."""

    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.is_global = config.resolved_layer_types()[layer_idx] == GLOBAL
        self.window = config.window
        self.dropout_p = config.attention_dropout
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size,
                              bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.out_drop = Dropout(config.attention_dropout)
        self.varlen_backend = "auto"
        """Kernel for unpadded tokens (``bertforge.ops.attention.BACKENDS``); set from outside."""

    def forward(self, hidden: torch.Tensor, where: Attend | WindowPlan,
                rope: Rope) -> torch.Tensor:
        """hidden (B, S, H) with this layer kind's keep mask, or (T, H) with its
        ``TokenLayout`` (global) or ``WindowPlan`` (local) -> the shape of hidden."""
        dropout_p = self.dropout_p if self.training else 0.0
        # (..., 3H) -> 3 x (..., heads, head_dim): transformers' [q | k | v] split
        q, k, v = self.Wqkv(hidden).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(-3)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if self.is_global:
            context = attend(q, k, v, where, dropout_p, self.varlen_backend)
        else:
            context = window_attend(q, k, v, where, self.window, dropout_p, self.varlen_backend)
        return self.out_drop(self.Wo(context.flatten(-2)))


class ModernBertMLP(nn.Module):
    """GeGLU: ``Wo(drop(act(input) * gate))`` with ``Wi`` projecting to [input | gate]."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_activation)
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(hidden).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(value) * gate))


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm layer: ``x + attn(attn_norm(x))``, then ``x + mlp(mlp_norm(x))``. Layer 0 has
    no ``attn_norm``: its input is the embedding LayerNorm's output already."""

    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = layer_norm(config) if layer_idx else nn.Identity()
        self.attn = ModernBertAttention(config, layer_idx)
        self.mlp_norm = layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, hidden: torch.Tensor, where: Attend | WindowPlan, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.attn_norm(hidden), where, (cos, sin))
        return hidden + self.mlp(self.mlp_norm(hidden))


def traceable_keep_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``ops.unpad.padding_keep_mask`` without its "nothing to mask" test (a device->host read
    that a traced graph would freeze): (B, S) 1 = real token -> (B, 1, 1, S) bool, an all-padding
    row keeping every key (finite, unused outputs)."""
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep[:, None, None, :]


class ModernBertModelOutput(BertModelOutput):
    """Encoder outputs (``last_hidden_state``, ``select``, ``states``/``layout``: as
    ``BertModelOutput``); ``pooler_output`` is always None (ModernBERT has no pooler)."""


class ModernBertModel(ModernBertPreTrainedModel):
    """The bare encoder: ``forward`` -> ``ModernBertModelOutput`` (``last_hidden_state`` after
    ``final_norm``).

    ``unpad`` (off by default; set from outside) runs the layers on the real tokens only: the
    same outputs at real tokens, no work on padding.
    """

    base_model_prefix = ""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.final_norm = layer_norm(config)
        self.unpad = False
        self.traceable = False
        """Export mode (set from outside, ``bertforge.export``): padded rows, and the padding and
        band masks built on every call without a branch on token values or on the length (no
        "nothing is padded" or "no row is longer than the window" shortcuts), so that one traced
        graph is right for every batch and sequence length. Same outputs as the default path at
        real tokens (padding positions hold other unused values)."""
        self.gradient_checkpointing = False
        """Recompute each layer's activations in backward instead of storing them."""
        self.init_weights()

    def check_length(self, seq_len: int) -> None:
        """DataError when a row is longer than ``max_position_embeddings``."""
        limit = self.config.max_position_embeddings
        if seq_len > limit:
            raise DataError(f"input has {seq_len} tokens per sequence but the model's "
                            f"max_position_embeddings is {limit}: truncate inputs to at most "
                            f"{limit} tokens (e.g. lower --max-seq-length)")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> ModernBertModelOutput:
        """input_ids, attention_mask (1 = real token): (B, S) -> ModernBertModelOutput.

        ``position_ids`` (B, S) mark packed rows: several sequences per row, each starting at
        position 0 and attending only to itself. ``layout``: the batch's ``TokenLayout`` when
        the loader computed it (as ``BertModel``).
        """
        self.check_length(input_ids.shape[-1])
        if self.traceable and position_ids is None:
            where: Layout = RowLayout(traceable_keep_mask(attention_mask),
                                      (input_ids.shape[0], input_ids.shape[-1]))
        else:
            where = batch_layout(input_ids, attention_mask, position_ids, layout, unpad=self.unpad)
        hidden = self.embeddings(where.enter(input_ids))             # (B, S, H) or (T, H)
        kinds = self._layer_inputs(where, hidden)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            args = kinds[layer.attn.is_global]
            if recompute:
                hidden = checkpoint(layer, hidden, *args, use_reentrant=False)
            else:
                hidden = layer(hidden, *args)
        return ModernBertModelOutput(states=self.final_norm(hidden), layout=where)

    def _layer_inputs(self, where: Layout, hidden: torch.Tensor) -> dict[bool, tuple]:
        """is_global -> (attend, cos, sin) for the layers of that kind: the keep mask (padded
        rows: the local one holds the band) or the layout, and the RoPE tables of the kind's
        base at the batch's positions."""
        c = self.config
        positions = where.positions
        if positions is None:  # padded rows, not packed: a token's position is its column
            positions = torch.arange(where.shape[1], device=hidden.device)[None, :]
        if isinstance(where, RowLayout):
            local: object = band_keep_mask(where.keep, where.shape[1], c.window,
                                           always=self.traceable)
        else:  # shared by every local layer: the blocked kernel's mask is made once
            local = WindowPlan(where, c.window)
        return {
            True: (where.attend, *rotary_tables(positions, c.head_dim, c.global_rope_theta, hidden.dtype)),
            False: (local, *rotary_tables(positions, c.head_dim, c.local_rope_theta, hidden.dtype)),
        }


__all__ = ["ModernBertAttention", "ModernBertEmbeddings", "ModernBertEncoderLayer",
           "ModernBertMLP", "ModernBertModel", "ModernBertModelOutput",
           "ModernBertPreTrainedModel", "activation", "layer_norm", "traceable_keep_mask"]
