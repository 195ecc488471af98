"""BART: a bidirectional encoder and an autoregressive decoder, with Hugging Face names.

Pure ``nn.Module`` code (no losses, data or parallelism). Parameter names are those of
transformers' ``BartModel`` / ``BartForConditionalGeneration`` / ``BartForSequenceClassification``
(and of mBART for the Pre-LN layout), so ``state_dict()`` is their checkpoint. Architecture facts
worth knowing when reading it:

* one token embedding (``shared``) serves the encoder, the decoder and the LM head (tied);
  its output may be scaled by sqrt(d_model) (``scale_embedding``);
* learned positions with BART's offset of 2: position p reads row p + 2 of ``embed_positions``;
* ``layernorm_embedding`` normalises token + position embeddings before the first layer;
* post-LN layers by default; ``normalize_before`` moves each LayerNorm to its branch input and
  adds a final ``layer_norm`` to each stack (mBART);
* the LM head adds ``final_logits_bias``, a buffer transformers keeps at zero.

The encoder's self-attention runs through ``bertforge.ops.attention.attend`` (padded rows or,
unpadded, a variable-length kernel: the same layer code), the decoder's through
``scaled_dot_product_attention`` (causal, with a key/value cache). Generation uses ``encode``,
``decode_step`` and ``reorder_cache`` with a ``KVCache`` (see ``bertforge.models.generation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import DataError
from bertforge.models.bart_cache import KVCache, LayerCache
from bertforge.models.bart_config import BartConfig
from bertforge.models.hub import PreTrainedModel
from bertforge.ops.attention import Attend, attend
from bertforge.ops.unpad import Layout, TokenLayout, batch_layout, padding_keep_mask

POSITION_OFFSET = 2  # BART's learned positions start at row 2 (a fairseq legacy kept by all ports)


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called ``name`` in a BART config (validated by ``BartConfig``)."""
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    return torch.tanh if name == "tanh" else F.relu


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int,
                       decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: ``[start] + labels[:-1]`` per row, ignored label
    positions (-100) read as padding. (B, T) -> (B, T)."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 0] = decoder_start_token_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill_(shifted < 0, pad_token_id)


# ---------------------------------------------------------------------------------------------
# Building blocks


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
        (``bertforge.train.parallelize``)."""

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, D) -> (B, heads, T, head_dim)
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``states`` (B, T, D), split into heads."""
        return self._heads(self.k_proj(states)), self._heads(self.v_proj(states))

    def forward(self, hidden: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, is_causal: bool = False) -> torch.Tensor:
        """Queries from ``hidden`` (B, T, D) over keys/values (B, heads, S, head_dim);
        ``mask`` bool, broadcastable to (B, heads, T, S), True = may attend -> (B, T, D)."""
        b, t, d = hidden.shape
        q = self._heads(self.q_proj(hidden))
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal and mask is None,
            dropout_p=self.dropout_p if self.training else 0.0)
        return self.out_proj(context.transpose(1, 2).reshape(b, t, d))

    def self_attend(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        """Bidirectional self-attention (the encoder's): hidden (B, S, D) with a keep mask or
        None, or unpadded (T, D) with its ``TokenLayout`` -> the shape of hidden."""
        # (..., D) -> (..., heads, head_dim)
        q, k, v = (proj(hidden).unflatten(-1, (self.num_heads, self.head_dim))
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        context = attend(q, k, v, where, self.dropout_p if self.training else 0.0,
                         self.varlen_backend)
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

    def forward(self, hidden: torch.Tensor, self_mask: torch.Tensor | None,  # type: ignore[override]
                causal: bool, encoder_hidden: torch.Tensor, cross_keep: torch.Tensor | None,
                cache: LayerCache | None = None) -> torch.Tensor:
        """hidden (B, T, D); self_mask (B or 1, 1, T, T_past + T) bool, or None with ``causal``
        (plain causal attention over the T tokens) or without (every key visible: one new token
        after the cache); encoder_hidden (B, S, D); cross_keep (B, 1, 1, S) or None."""
        def attend_self(x: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attn.project_kv(x)
            if cache is not None:
                k, v = cache.append(k, v)
            return self.self_attn(x, k, v, self_mask, is_causal=causal)

        def attend_encoder(x: torch.Tensor) -> torch.Tensor:
            if cache is not None:
                k, v = cache.cross(encoder_hidden, self.encoder_attn.project_kv)
            else:
                k, v = self.encoder_attn.project_kv(encoder_hidden)
            return self.encoder_attn(x, k, v, cross_keep)

        hidden = self.residual(hidden, self.self_attn_layer_norm, attend_self)
        hidden = self.residual(hidden, self.encoder_attn_layer_norm, attend_encoder)
        return self.residual(hidden, self.final_layer_norm, self.feed_forward)


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


class _Stack(nn.Module):
    """Embeddings (token x scale + position, LayerNorm, dropout) and a stack of layers."""

    def __init__(self, config: BartConfig, shared: nn.Embedding, layers: nn.ModuleList) -> None:
        super().__init__()
        self.embed_scale = config.embed_scale
        self.embed_tokens = shared
        self.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings,
                                                              config.d_model)
        self.layers = layers
        self.layernorm_embedding = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        if config.normalize_before:
            # Pre-LN residual streams are never normalised inside the layers.
            self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.gradient_checkpointing = False
        """Recompute each layer's activations in backward instead of storing them (training)."""

    def embed(self, input_ids: torch.Tensor, start: int = 0,
              positions: torch.Tensor | None = None) -> torch.Tensor:
        """Ids (B, T) at positions start.. -> (B, T, D) normalised embeddings (after dropout);
        or ids (N,) of unpadded tokens at their ``positions`` (N,) -> (N, D)."""
        if positions is None:
            positions = self.embed_positions(input_ids.shape[-1], start)  # (T, D), broadcast
        else:
            positions = self.embed_positions.weight.index_select(0, positions + POSITION_OFFSET)
        tokens = self.embed_tokens(input_ids)
        if self.embed_scale != 1.0:
            tokens = tokens * self.embed_scale
        return self.dropout(self.layernorm_embedding(tokens + positions))

    def finish(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(hidden) if hasattr(self, "layer_norm") else hidden

    def run_layer(self, layer: nn.Module, *args: object) -> torch.Tensor:
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)


class BartEncoder(_Stack):
    """The bidirectional encoder."""

    def __init__(self, config: BartConfig, shared: nn.Embedding) -> None:
        super().__init__(config, shared,
                         nn.ModuleList(BartEncoderLayer(config) for _ in range(config.encoder_layers)))
        self.unpad = False
        """Run the layers on the real tokens only (``bertforge.ops.unpad``); the output is
        re-padded for the decoder, with zeros at padding. Set from outside
        (``bertforge.train.parallelize``)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                layout: TokenLayout | None = None) -> torch.Tensor:
        """(B, S) ids and padding mask (1 = real) -> (B, S, D). ``layout``: the source's
        ``TokenLayout`` when the loader computed it."""
        # Padded rows or the real tokens only: the same code, the layout moves the states.
        where: Layout = batch_layout(input_ids, attention_mask, layout=layout, unpad=self.unpad)
        self.embed_positions.check(input_ids.shape[-1])
        hidden = self.embed(where.enter(input_ids), positions=where.positions)  # (B, S, D)|(T, D)
        for layer in self.layers:
            hidden = self.run_layer(layer, hidden, where.attend)
        return where.exit(self.finish(hidden))


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


class BartDecoder(_Stack):
    """The autoregressive decoder (causal self-attention + cross-attention)."""

    def __init__(self, config: BartConfig, shared: nn.Embedding) -> None:
        super().__init__(config, shared,
                         nn.ModuleList(BartDecoderLayer(config) for _ in range(config.decoder_layers)))

    def forward(self, input_ids: torch.Tensor, encoder_hidden: torch.Tensor,
                encoder_attention_mask: torch.Tensor | None,
                attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        """input_ids (B, T) new tokens; encoder_hidden (B, S, D); masks 1 = real. With a cache,
        ``attention_mask`` (if given) covers cached + new tokens. -> (B, T, D)."""
        past = cache.length if cache is not None else 0
        if cache is not None and not cache.layers:
            cache.layers = [LayerCache() for _ in self.layers]
        hidden = self.embed(input_ids, past)
        self_mask, causal = decoder_self_mask(input_ids.shape[1], past, attention_mask,
                                              input_ids.device)
        cross_keep = padding_keep_mask(encoder_attention_mask)
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            if layer_cache is not None:  # the cache is mutated, so never recompute here
                hidden = layer(hidden, self_mask, causal, encoder_hidden, cross_keep, layer_cache)
            else:
                hidden = self.run_layer(layer, hidden, self_mask, causal, encoder_hidden,
                                        cross_keep)
        return self.finish(hidden)


# ---------------------------------------------------------------------------------------------
# Models


class BartPreTrainedModel(PreTrainedModel):
    """Base of all bertforge BART classes: BART's names for the generic loading code, and its
    weight initialisation."""

    config: BartConfig
    config_class = BartConfig
    checkpoint_prefix = "model"
    base_model_prefix = "model"
    body_prefixes = ("shared.", "encoder.", "decoder.")
    head_prefixes = ("final_logits_bias", "classification_head.")
    tied_keys = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                 "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                 "lm_head.weight")

    def init_weights(self) -> None:
        """BART initialisation: weights ~ N(0, init_std), biases 0, LayerNorm 1/0, [pad] row 0."""
        self.normal_init_(self.config.init_std)
        with torch.no_grad():
            shared = self.word_embeddings()
            if shared.padding_idx is not None:
                shared.weight[shared.padding_idx].zero_()

    def word_embeddings(self) -> nn.Embedding:
        """The shared (vocab_size, D) token embedding."""
        base = getattr(self, self.base_model_prefix) if self.base_model_prefix else self
        return base.shared

    def normalize_legacy(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Some exports store the token embedding only under the encoder's (tied) name.
        for prefix in ("model.", ""):
            shared = prefix + "shared.weight"
            if shared not in tensors:
                for alias in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
                    if prefix + alias in tensors:
                        tensors[shared] = tensors[prefix + alias]
                        break
        return tensors

    def mismatch_hints(self, names: list[str]) -> list[str]:
        if any(k.endswith("encoder.layer_norm.weight") or k.endswith("decoder.layer_norm.weight")
               for k in names):
            return ["The checkpoint and config.json disagree on normalize_before (Pre-LN / mBART "
                    "layout)."]
        return []


@dataclass
class Seq2SeqModelOutput:
    last_hidden_state: torch.Tensor
    """(B, T, D) decoder output."""
    encoder_last_hidden_state: torch.Tensor
    """(B, S, D) encoder output."""


@dataclass
class Seq2SeqLMOutput:
    logits: torch.Tensor
    """(B, T, vocab_size), or (N, vocab_size) at the N ``target_positions`` in row-major order."""
    encoder_last_hidden_state: torch.Tensor
    """(B, S, D) encoder output."""


class BartModel(BartPreTrainedModel):
    """Encoder and decoder over one shared token embedding."""

    base_model_prefix = ""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model,
                                   padding_idx=config.pad_token_id)
        self.encoder = BartEncoder(config, self.shared)
        self.decoder = BartDecoder(config, self.shared)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None,
                decoder_attention_mask: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> Seq2SeqModelOutput:
        """Source (B, S) and decoder inputs (B, T); without decoder inputs the source shifted
        right is used (as transformers does for denoising). ``layout``: the source's, as
        ``BartEncoder.forward``."""
        if decoder_input_ids is None:
            decoder_input_ids = shift_tokens_right(input_ids, self.config.pad_token_id,
                                                   self.config.decoder_start_token_id)
        encoded = self.encoder(input_ids, attention_mask, layout)
        decoded = self.decoder(decoder_input_ids, encoded, attention_mask, decoder_attention_mask)
        return Seq2SeqModelOutput(last_hidden_state=decoded, encoder_last_hidden_state=encoded)


class BartForConditionalGeneration(BartPreTrainedModel):
    """BART with the LM head: denoising pretraining, summarization, generation."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.config = config
        self.model = BartModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.model.shared.weight
        # A buffer, as in transformers: saved and loaded, never trained (zero unless a
        # checkpoint says otherwise).
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        self.generation_config: Any = None
        """``bertforge.models.generation.GenerationConfig`` saved with the model (generation_config.json)
        and used by every command unless overridden; None when the model has none."""

    def load_extras(self, directory: Path) -> None:
        from bertforge.models.generation import GENERATION_CONFIG_NAME, GenerationConfig

        if (directory / GENERATION_CONFIG_NAME).is_file():
            self.generation_config = GenerationConfig.load(directory)

    def save_extras(self, directory: Path) -> None:
        if self.generation_config is not None:
            self.generation_config.save(directory)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder states -> (..., vocab_size) scores."""
        return self.lm_head(hidden) + self.final_logits_bias[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None,
                decoder_attention_mask: torch.Tensor | None = None,
                target_positions: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> Seq2SeqLMOutput:
        """Teacher-forced scores. ``target_positions`` (B, T) bool limits the vocabulary
        projection (the costliest matmul) to the positions that are scored. ``layout``: the
        source's, as ``BartEncoder.forward``."""
        out = self.model(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
                         layout)
        hidden = out.last_hidden_state
        if target_positions is not None:
            if target_positions.dtype != torch.bool or target_positions.shape != hidden.shape[:2]:
                raise ValueError(f"target_positions must be a bool tensor of shape "
                                 f"{tuple(hidden.shape[:2])}, got {target_positions.dtype} "
                                 f"{tuple(target_positions.shape)}")
            hidden = hidden[target_positions]
        return Seq2SeqLMOutput(logits=self.logits(hidden),
                               encoder_last_hidden_state=out.encoder_last_hidden_state)

    # -- the interface of bertforge.models.generation ---------------------------------------------
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(B, S) -> (B, S, D) encoder output."""
        return self.model.encoder(input_ids, attention_mask)

    def decode_step(self, decoder_input_ids: torch.Tensor, encoder_hidden: torch.Tensor,
                    encoder_attention_mask: torch.Tensor | None,
                    cache: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        """Scores of the new tokens (B, T_new) after those in ``cache`` (None: a new cache):
        ((B, T_new, vocab_size) float logits, the updated cache)."""
        cache = KVCache() if cache is None else cache
        hidden = self.model.decoder(decoder_input_ids, encoder_hidden, encoder_attention_mask,
                                    cache=cache)
        return self.logits(hidden).float(), cache

    @staticmethod
    def reorder_cache(cache: KVCache, index: torch.Tensor) -> KVCache:
        """Keep batch rows ``index`` of ``cache`` (beam search)."""
        return cache.reorder(index)


class BartClassificationHead(nn.Module):
    """dropout -> dense -> tanh -> dropout -> out_proj on the final </s> state."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.out_proj = nn.Linear(config.d_model, config.num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(torch.tanh(self.dense(self.dropout(hidden)))))


@dataclass
class Seq2SeqClassifierOutput:
    logits: torch.Tensor
    """(B, num_labels)."""


class BartForSequenceClassification(BartPreTrainedModel):
    """BART classifier: the whole sequence through encoder and decoder, classified at the
    decoder state of the last </s> of each row."""

    def __init__(self, config: BartConfig) -> None:
        super().__init__()
        self.config = config
        self.model = BartModel(config)
        self.classification_head = BartClassificationHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> Seq2SeqClassifierOutput:
        hidden = self.model(input_ids, attention_mask).last_hidden_state  # (B, S, D)
        is_eos = input_ids.eq(self.config.eos_token_id)
        if not bool(is_eos.any(dim=1).all()):
            raise DataError("every input of BartForSequenceClassification must contain </s> "
                            "(encode with special tokens)")
        # Index of the last </s> per row: the largest position where it occurs.
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = torch.where(is_eos, positions, -1).amax(dim=1)
        sentence = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return Seq2SeqClassifierOutput(logits=self.classification_head(sentence))


BART_CLASSES = {cls.__name__: cls for cls in (BartModel, BartForConditionalGeneration,
                                              BartForSequenceClassification)}

__all__ = ["BART_CLASSES", "BartConfig", "BartForConditionalGeneration",
           "BartForSequenceClassification", "BartModel", "BartPreTrainedModel", "KVCache",
           "Seq2SeqLMOutput", "Seq2SeqModelOutput", "shift_tokens_right"]
