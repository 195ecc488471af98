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

Padding is removed once, at the encoder's entry, when ``unpad`` is set on the stacks (from
outside: ``bertforge.speed``, ``train.unpad``): the encoder runs on its real tokens
(``bertforge.ops.unpad`` / ``ops.attention``, as BERT), and a teacher-forced decoder on each
row's columns up to its last scored target (``bertforge.models.bart_varlen``: causal
self-attention per target, cross-attention over its own source's real tokens), so no matmul,
LayerNorm or vocabulary projection is spent on padding. Outputs at real positions equal the
padded pass. Generation uses ``encode``, ``decode_step`` and ``reorder_cache`` with a ``KVCache``
on padded rows (see ``bertforge.models.generation``); the layers are in ``bart_layers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import DataError
from bertforge.models.bart_cache import KVCache, LayerCache
from bertforge.models.bart_config import BartConfig
from bertforge.models.bart_layers import (POSITION_OFFSET, BartDecoderLayer, BartEncoderLayer,
                                          BartLearnedPositionalEmbedding, PaddedDecoding,
                                          decoder_self_mask)
from bertforge.models.bart_varlen import Seq2SeqLayout, target_layout
from bertforge.models.hub import PreTrainedModel
from bertforge.ops.unpad import Layout, TokenLayout, batch_layout, padding_keep_mask


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int,
                       decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: ``[start] + labels[:-1]`` per row, ignored label
    positions (-100) read as padding. (B, T) -> (B, T)."""
    shifted = labels.new_empty(labels.shape)
    shifted[:, 0] = decoder_start_token_id
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill_(shifted < 0, pad_token_id)


# ---------------------------------------------------------------------------------------------
# Stacks (the layers are in bertforge.models.bart_layers)


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
        """Run the layers on the real tokens only (``bertforge.ops.unpad``); ``forward`` re-pads
        the output, with zeros at padding. Set from outside (``bertforge.speed``)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                layout: TokenLayout | None = None) -> torch.Tensor:
        """(B, S) ids and padding mask (1 = real) -> (B, S, D). ``layout``: the source's
        ``TokenLayout`` when the loader computed it."""
        hidden, where = self.encode_tokens(input_ids, attention_mask, layout)
        return where.exit(hidden)

    def encode_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                      layout: TokenLayout | None = None) -> tuple[torch.Tensor, Layout]:
        """The encoder's states in the layout it ran in: (B, S, D) with a ``RowLayout``, or the
        real tokens' (T, D) with their ``TokenLayout`` (``unpad`` on and padding to remove)."""
        # Padded rows or the real tokens only: the same code, the layout moves the states.
        where: Layout = batch_layout(input_ids, attention_mask, layout=layout, unpad=self.unpad)
        self.embed_positions.check(input_ids.shape[-1])
        hidden = self.embed(where.enter(input_ids), positions=where.positions)  # (B, S, D)|(T, D)
        for layer in self.layers:
            hidden = self.run_layer(layer, hidden, where.attend)
        return self.finish(hidden), where


class BartDecoder(_Stack):
    """The autoregressive decoder (causal self-attention + cross-attention)."""

    def __init__(self, config: BartConfig, shared: nn.Embedding) -> None:
        super().__init__(config, shared,
                         nn.ModuleList(BartDecoderLayer(config) for _ in range(config.decoder_layers)))
        self.unpad = False
        """Teacher-forced passes run on the decoder's real tokens only when the encoder ran
        unpadded (``BartModel.run``). Set from outside (``bertforge.speed``)."""

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
        where = PaddedDecoding(self_mask, causal, padding_keep_mask(encoder_attention_mask))
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            if layer_cache is not None:  # the cache is mutated, so never recompute here
                hidden = layer(hidden, encoder_hidden, where, layer_cache)
            else:
                hidden = self.run_layer(layer, hidden, encoder_hidden, where)
        return self.finish(hidden)

    def decode_tokens(self, input_ids: torch.Tensor, encoder_tokens: torch.Tensor,
                      where: Seq2SeqLayout) -> torch.Tensor:
        """Teacher forcing on unpadded tokens: input_ids (B, T), the encoder's unpadded states
        (T_s, D) -> the states of ``where.target``'s T_t tokens, (T_t, D)."""
        self.embed_positions.check(input_ids.shape[-1])
        target = where.target
        hidden = self.embed(target.unpad(input_ids), positions=target.positions)  # (T_t, D)
        for layer in self.layers:
            hidden = self.run_layer(layer, hidden, encoder_tokens, where)
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


@dataclass
class Seq2SeqStates:
    """``BartModel.run``'s result: the decoder's states where it computed them."""

    decoder: torch.Tensor
    """(B, T, D) padded rows, or (T_t, D) the tokens of ``target``."""
    target: TokenLayout | None
    """Where the unpadded decoder's tokens are in the (B, T) batch; None: padded rows."""
    encoder: torch.Tensor
    """(B, S, D) encoder output, zeros at padding after an unpadded pass."""

    def padded_decoder(self) -> torch.Tensor:
        """(B, T, D) decoder states (zeros where an unpadded pass did no work)."""
        if self.target is None:
            return self.decoder
        b, t = self.target.shape
        if self.target.num_tokens == b * t:  # every column: already row-major (B * T, D)
            return self.decoder.view(b, t, -1)
        return self.target.pad(self.decoder)

    def at(self, target_positions: torch.Tensor) -> torch.Tensor:
        """(N, D) decoder states at the N ``target_positions`` (B, T) bool, row-major."""
        if self.target is None:
            return self.decoder[target_positions]
        flat = target_positions.reshape(-1).nonzero().squeeze(1)  # (N,) row * T + column
        if flat.shape[0] == self.target.num_tokens:  # the targets are the decoder's tokens
            return self.decoder
        return self.target.gather(self.decoder, flat)


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
        states = self.run(input_ids, attention_mask, decoder_input_ids, decoder_attention_mask,
                          layout)
        return Seq2SeqModelOutput(last_hidden_state=states.padded_decoder(),
                                  encoder_last_hidden_state=states.encoder)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            decoder_input_ids: torch.Tensor | None = None,
            decoder_attention_mask: torch.Tensor | None = None,
            layout: TokenLayout | None = None,
            target_positions: torch.Tensor | None = None) -> Seq2SeqStates:
        """``forward``'s pass, the decoder's states left where it computed them: unpadded when
        both stacks run unpadded (``unpad``; a source with padding; no decoder mask), then only
        through each row's last ``target_positions`` column (B, T) bool, if given."""
        if decoder_input_ids is None:
            decoder_input_ids = shift_tokens_right(input_ids, self.config.pad_token_id,
                                                   self.config.decoder_start_token_id)
        encoded, where = self.encoder.encode_tokens(input_ids, attention_mask, layout)
        encoder_hidden = where.exit(encoded)  # (B, S, D), zeros at padding
        unpadded = (self.decoder.unpad and decoder_attention_mask is None
                    and isinstance(where, TokenLayout)
                    and where.num_sequences == input_ids.shape[0])  # one source per row
        if not unpadded:
            decoded = self.decoder(decoder_input_ids, encoder_hidden, attention_mask,
                                   decoder_attention_mask)
            return Seq2SeqStates(decoded, None, encoder_hidden)
        target = target_layout(decoder_input_ids.shape, target_positions,
                               decoder_input_ids.device)
        decoded = self.decoder.decode_tokens(decoder_input_ids, encoded,
                                             Seq2SeqLayout(target, where))
        return Seq2SeqStates(decoded, target, encoder_hidden)


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
        projection (the costliest matmul) to the positions that are scored, and an unpadded
        decoder to the columns up to each row's last one. ``layout``: the source's, as
        ``BartEncoder.forward``."""
        if target_positions is not None:
            shape = tuple((input_ids if decoder_input_ids is None else decoder_input_ids).shape)
            if target_positions.dtype != torch.bool or tuple(target_positions.shape) != shape:
                raise ValueError(f"target_positions must be a bool tensor of shape {shape}, got "
                                 f"{target_positions.dtype} {tuple(target_positions.shape)}")
        states = self.model.run(input_ids, attention_mask, decoder_input_ids,
                                decoder_attention_mask, layout, target_positions)
        if target_positions is None:
            logits = self.logits(states.padded_decoder())
        else:
            logits = F.linear(states.at(target_positions), self.lm_head.weight,
                              self._training_bias())
        return Seq2SeqLMOutput(logits=logits, encoder_last_hidden_state=states.encoder)

    def _training_bias(self) -> torch.Tensor | None:
        """``final_logits_bias`` for the teacher-forced scores, None when it is zero (as
        transformers keeps it) on a CPU: adding zeros costs a pass over the (N, V) scores
        there, and looking costs nothing (on a GPU it would cost a sync; the pass is cheap)."""
        bias = self.final_logits_bias[0]
        if bias.device.type == "cpu" and not bool(bias.any()):
            return None
        return bias

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
