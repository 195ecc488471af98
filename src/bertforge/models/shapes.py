"""What a model costs, as the family's record tells it: ``ModelShape``, read from a config by the
family's shape function (``FamilySpec.shape``).

The FLOP count (``bertforge.train.flops``) and the batch planner (``bertforge.train.plan``) read
these numbers and never a config's own field names: BERT's ``hidden_size`` is BART's
``d_model``, a GeGLU feed-forward block (ModernBERT) costs half again a plain one, and only some
families have sliding-window layers, an NSP head or a decoder. A new family writes one shape
function beside its config (``bert_shape`` in models/config.py) and names it in its record.

Plain data, no torch: the command line plans a batch before anything is imported.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

ENCODER_ACTIVATIONS = 34
"""Bytes one encoder layer stores per token and unit of width in 16-bit training, without
recomputation and with a fused attention kernel (Korthikanti et al., 2022, without the
5 x heads x S^2 term that fused attention does not store)."""
DECODER_ACTIVATIONS = 46
"""The same for a decoder layer, which also stores its cross-attention."""


@dataclass(frozen=True)
class Stack:
    """A stack of transformer layers of one width: an encoder, or an encoder-decoder's decoder
    (whose layers also attend to the encoder's output)."""

    layers: int
    intermediate: int
    """Feed-forward width I."""
    glu: bool = False
    """Gated feed-forward (GeGLU): its input projection is 2I wide, so the block costs 6HI
    FLOPs per token instead of 4HI."""
    windows: tuple[int | None, ...] = ()
    """Per layer, the half width w of its sliding window (a query sees keys with |i - j| <= w),
    None for global attention; empty: every layer is global."""

    def layer_windows(self) -> Counter[int | None]:
        """Half window -> how many layers have it (None: global layers)."""
        return Counter(self.windows or (None,) * self.layers)


@dataclass(frozen=True)
class ModelShape:
    """The sizes that decide a model's FLOPs and memory."""

    hidden: int
    """Model width H (``d_model`` of an encoder-decoder)."""
    vocab: int
    """Rows of the output projection V (the padded vocabulary where the family pads it)."""
    encoder: Stack
    parameters: int
    """Trainable parameters (the config's ``num_parameters()``)."""
    positions: int
    """Longest sequence it takes; also the entries of its int64 position-id table."""
    decoder: Stack | None = None
    """An encoder-decoder's decoder, whose LM head scores every target token; None for an
    encoder, whose MLM head scores the masked positions only."""
    lm_transform: bool = True
    """The MLM head runs a dense H -> H transform before the vocabulary projection."""
    nsp_head: bool = False
    """A pooler and a next-sentence head, counted when the objective has NSP."""
    partial_last_layer: bool = False
    """The last layer can run its queries, output projection and feed-forward block only at
    the tokens its heads read (``bertforge.speed``, when the speed pass applies it)."""

    def activation_bytes_per_token(self, bytes_per_value: int) -> float:
        """Activation bytes one training token stores in the layers (logits not included):
        ``ENCODER_ACTIVATIONS`` per encoder layer, ``DECODER_ACTIVATIONS`` per decoder layer,
        times H, for values of ``bytes_per_value`` bytes (16-bit: 2)."""
        decoder = self.decoder.layers if self.decoder is not None else 0
        layers = ENCODER_ACTIVATIONS * self.encoder.layers + DECODER_ACTIVATIONS * decoder
        return layers * (self.hidden * bytes_per_value / 2)


__all__ = ["DECODER_ACTIVATIONS", "ENCODER_ACTIVATIONS", "ModelShape", "Stack"]
