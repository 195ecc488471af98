"""ModernBERT (Warner et al. 2024): the encoder, its task heads and their initialisation.

Token embeddings + LayerNorm (no position table: rotary embeddings in every attention layer),
pre-norm layers without biases, alternating global and sliding-window attention (layer i is
global when ``i % global_attn_every_n_layers == 0``; the others see ``local_attention // 2``
tokens each side, with another RoPE base), a GeGLU feed-forward block and a final LayerNorm.
Heads (masked LM, sequence / token classification, QA, multiple choice) start with the
"prediction head" (dense -> activation -> LayerNorm) and return logits only.

Plain ``nn`` modules; parameter names are transformers' (``model.layers.0.attn.Wqkv.weight``,
``head.dense``, ``decoder``, ``classifier``), so a state dict *is* a transformers ModernBERT
checkpoint. With ``unpad`` set (from outside, by the speed pass) padding is removed once before
the embeddings and restored once at the end (``bertforge.ops.unpad``); attention then runs on
the real tokens with per-sequence boundaries (``bertforge.ops.attention``, sliding windows
included). Packed rows (``position_ids`` restarting at 0) work in both layouts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import DataError
from bertforge.models.hub import PreTrainedModel
from bertforge.models.modernbert_config import GLOBAL, ModernBertConfig
from bertforge.models.outputs import (BertModelOutput, ClassifierOutput, MaskedLMOutput,
                                      QuestionAnsweringOutput)
from bertforge.ops.attention import Attend, WindowPlan, attend, band_keep_mask
from bertforge.ops.unpad import Layout, RowLayout, TokenLayout, batch_layout, token_layout

Rope = tuple[torch.Tensor, torch.Tensor]
"""(cos, sin) tables of a batch's positions, (B, S, head_dim) or (T, head_dim)."""


# ------------------------------------------------------------------------- rotary positions
# RoPE (Su et al. 2021), "rotate half" convention (transformers' Llama/ModernBERT, not GPT-J's
# interleaved pairs): dimension i < d/2 of a head pairs with i + d/2, rotated by
# position * theta ** (-2i / d). Tables come from the batch's positions in float32 and are not
# stored: a buffer would be cast to bf16 with the model and lose the frequencies' precision.
def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float,
                  dtype: torch.dtype) -> Rope:
    """(cos, sin), each (*positions.shape, head_dim) in ``dtype``, for integer ``positions``."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device,
                             dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)                           # (head_dim / 2,)
    angles = positions[..., None].float() * inv_freq                # (..., head_dim / 2)
    angles = torch.cat((angles, angles), dim=-1)                    # (..., head_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (..., heads, head_dim) by tables (..., head_dim) of the same leading shape
    (broadcast over the heads); computed in float32, returned in ``x``'s dtype."""
    cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)                   # (x1, x2) -> (-x2, x1)
    return (xf * cos + rotated * sin).to(x.dtype)


# ------------------------------------------------------------------------- building blocks
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
    """Base of all ModernBERT classes: transformers' names for the loading code
    (``bertforge.models.hub``) and ModernBERT's initialisation."""

    config: ModernBertConfig
    config_class = ModernBertConfig
    checkpoint_prefix = "model"
    base_model_prefix = "model"
    body_prefixes = ("embeddings.", "layers.", "final_norm.")
    head_prefixes = ("head.", "decoder.", "classifier.")
    tied_keys = ("decoder.weight",)
    vocab_row_suffixes = ("embeddings.tok_embeddings.weight", "decoder.bias")

    def init_weights(self, skip_prefix: str | None = None) -> None:
        """transformers' scheme: truncated normal (``initializer_cutoff_factor`` stds), std
        ``initializer_range`` for embeddings and input projections, ``initializer_range /
        sqrt(2 * layers)`` for output projections and the prediction head, ``hidden_size **
        -0.5`` for classifiers; biases 0, LayerNorms 1/0, the padding embedding row 0.
        ``skip_prefix``: a submodule already initialised."""
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
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, S) or unpadded (T,) ids -> (..., H)."""
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    """Fused QKV projection, RoPE on queries and keys, global or sliding-window attention (the
    window is in what the layer attends with: a band mask or a ``WindowPlan``), output
    projection."""

    def __init__(self, config: ModernBertConfig, layer_idx: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.is_global = config.resolved_layer_types()[layer_idx] == GLOBAL
        self.dropout_p = config.attention_dropout
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size,
                              bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.out_drop = nn.Dropout(config.attention_dropout)
        self.varlen_backend = "auto"
        """Kernel for unpadded tokens (``bertforge.ops.attention.BACKENDS``); set from outside."""

    def forward(self, hidden: torch.Tensor, where: Attend, rope: Rope) -> torch.Tensor:
        """hidden (B, S, H) with this layer kind's keep mask, or (T, H) with its
        ``TokenLayout`` (global) or ``WindowPlan`` (local) -> the shape of hidden."""
        dropout_p = self.dropout_p if self.training else 0.0
        # (..., 3H) -> 3 x (..., heads, head_dim): transformers' [q | k | v] split
        q, k, v = self.Wqkv(hidden).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(-3)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        context = attend(q, k, v, where, dropout_p, self.varlen_backend)
        return self.out_drop(self.Wo(context.flatten(-2)))


class ModernBertMLP(nn.Module):
    """GeGLU: ``Wo(drop(act(input) * gate))`` with ``Wi`` projecting to [input | gate]."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_activation)
        self.drop = nn.Dropout(config.mlp_dropout)
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

    def forward(self, hidden: torch.Tensor, where: Attend, cos: torch.Tensor,
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


# ------------------------------------------------------------------------- the encoder
class ModernBertModelOutput(BertModelOutput):
    """Encoder outputs (``last_hidden_state``, ``select``, ``states``/``layout``: as
    ``BertModelOutput``); ``pooler_output`` is always None (ModernBERT has no pooler)."""


class ModernBertModel(ModernBertPreTrainedModel):
    """The bare encoder: ``forward`` -> ``ModernBertModelOutput`` (``last_hidden_state`` after
    ``final_norm``). ``unpad`` (off by default; set from outside) runs the layers on the real
    tokens only: the same outputs at real tokens, no work on padding."""

    base_model_prefix = ""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.final_norm = layer_norm(config)
        # read once: forward runs no config code
        self.window, self.head_dim = config.window, config.head_dim
        self.rope_theta = {True: config.global_rope_theta, False: config.local_rope_theta}
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
        rows: the local one holds the band) or the layout (local: its ``WindowPlan``, whose
        blocked-kernel mask is made once for every local layer), and the RoPE tables of the
        kind's base at the batch's positions."""
        positions = where.positions
        if positions is None:  # padded rows, not packed: a token's position is its column
            positions = torch.arange(where.shape[1], device=hidden.device)[None, :]
        if isinstance(where, RowLayout):
            local: Attend = band_keep_mask(where.keep, where.shape[1], self.window,
                                           always=self.traceable)
        else:
            local = WindowPlan(where, self.window)
        return {is_global: (attn, *rotary_tables(positions, self.head_dim,
                                                 self.rope_theta[is_global], hidden.dtype))
                for is_global, attn in ((True, where.attend), (False, local))}


# ------------------------------------------------------------------------- heads
class ModernBertPredictionHead(nn.Module):
    """dense -> ``classifier_activation`` -> LayerNorm, before the decoder or a classifier."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden)))


def _token_means(states: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """(T, H) real-token states -> (N, H) mean of each sequence."""
    sums = states.new_zeros((layout.num_sequences, states.shape[-1]))
    sums = sums.index_add(0, layout.sequence_of_token(), states)
    return sums / layout.lengths().to(states.dtype)[:, None]


def pool(out: ModernBertModelOutput, how: str, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(N, H) one vector per sequence (per packed sequence in packed rows): its first token
    ("cls") or the mean of its real tokens ("mean", transformers' masked mean)."""
    layout, states = out.layout, out.states
    if how == "cls":
        return layout.first_tokens(states)
    if isinstance(layout, TokenLayout):
        return _token_means(states, layout)
    mask = attention_mask if attention_mask is not None else states.new_ones(layout.shape)
    if isinstance(layout, RowLayout) and layout.positions is not None:  # packed padded rows
        tokens = token_layout(mask, layout.positions)
        return _token_means(tokens.unpad(states), tokens)
    weights = mask.to(states.dtype).unsqueeze(-1)                      # (B, S, 1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1)


def _with_labels(config: ModernBertConfig, num_labels: int | None) -> ModernBertConfig:
    if num_labels is None or num_labels == config.num_labels:
        return config
    return config.replace(num_labels=num_labels)


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """Encoder + prediction head + ``decoder`` (tied to the token embeddings; bias per
    ``decoder_bias``). The masked-LM and pretraining head of the family."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight
        self.init_weights(skip_prefix="model")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> MaskedLMOutput:
        """(B, S) inputs -> logits (B, S, vocab_size), or (N, vocab_size) at the N
        ``masked_positions`` ((B, S) bool or flat int64 ``row * S + column``, as
        ``BertForMaskedLM``): the decoder, the costliest matmul, runs where it is scored."""
        out = self.model(input_ids, attention_mask, position_ids, layout)
        return MaskedLMOutput(logits=self.decoder(self.head(out.select(masked_positions))))


class _Classifier(ModernBertPreTrainedModel):
    """Encoder + prediction head + dropout + a linear classifier of ``outputs`` (transformers'
    layout of every ModernBERT classifier)."""

    def __init__(self, config: ModernBertConfig, outputs: int) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.init_weights(skip_prefix="model")

    def scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               position_ids: torch.Tensor | None, layout: TokenLayout | None) -> torch.Tensor:
        """(B, S) -> (N, outputs), one row per sequence pooled as ``classifier_pooling``."""
        out = self.model(input_ids, attention_mask, position_ids, layout)
        pooled = pool(out, self.config.classifier_pooling, attention_mask)
        return self.classifier(self.drop(self.head(pooled)))

    def token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     position_ids: torch.Tensor | None,
                     layout: TokenLayout | None) -> torch.Tensor:
        """(B, S) -> (B, S, outputs) at every token, padded once at the end (zeros at padding
        after an unpadded pass)."""
        out = self.model(input_ids, attention_mask, position_ids, layout)
        return out.layout.exit(self.classifier(self.drop(self.head(out.states))))


class ModernBertForSequenceClassification(_Classifier):
    """Logits (B, num_labels) per sequence (N rows for packed rows). ``num_labels`` (default:
    ``config.num_labels``) is stored in ``self.config`` and saved as id2label."""

    def __init__(self, config: ModernBertConfig, num_labels: int | None = None) -> None:
        config = _with_labels(config, num_labels)
        super().__init__(config, config.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> ClassifierOutput:
        return ClassifierOutput(logits=self.scores(input_ids, attention_mask, position_ids, layout))


class ModernBertForMultipleChoice(_Classifier):
    """Scores C candidate sequences per example: inputs (B, C, S) -> logits (B, C)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config, 1)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> ClassifierOutput:
        b, c, s = input_ids.shape
        # Every choice is an independent sequence: (B, C, S) -> (B*C, S).
        mask = attention_mask.reshape(b * c, s) if attention_mask is not None else None
        scores = self.scores(input_ids.reshape(b * c, s), mask, None, None)   # (B*C, 1)
        return ClassifierOutput(logits=scores.view(b, c))


class ModernBertForTokenClassification(_Classifier):
    """Per-token logits (B, S, num_labels)."""

    def __init__(self, config: ModernBertConfig, num_labels: int | None = None) -> None:
        config = _with_labels(config, num_labels)
        super().__init__(config, config.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> ClassifierOutput:
        return ClassifierOutput(logits=self.token_scores(input_ids, attention_mask,
                                                         position_ids, layout))


class ModernBertForQuestionAnswering(_Classifier):
    """Span scores: ``classifier`` (H -> 2: start, end). transformers sizes that layer by
    ``num_labels``, so the config is saved with ``num_labels=2``."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(_with_labels(config, 2), 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> QuestionAnsweringOutput:
        logits = self.token_scores(input_ids, attention_mask, position_ids, layout)
        start, end = logits.unbind(dim=-1)                             # (B, S, 2) -> 2 x (B, S)
        return QuestionAnsweringOutput(start_logits=start, end_logits=end)


MODERNBERT_CLASSES: dict[str, type[ModernBertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
                ModernBertForTokenClassification, ModernBertForQuestionAnswering,
                ModernBertForMultipleChoice)
}
"""Class name (config.json ``architectures``) -> bertforge class."""

__all__ = ["MODERNBERT_CLASSES", "ModernBertAttention", "ModernBertEmbeddings",
           "ModernBertEncoderLayer", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
           "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification",
           "ModernBertForTokenClassification", "ModernBertMLP", "ModernBertModel",
           "ModernBertModelOutput", "ModernBertPreTrainedModel", "ModernBertPredictionHead",
           "activation", "apply_rotary", "layer_norm", "pool", "rotary_tables",
           "traceable_keep_mask"]
