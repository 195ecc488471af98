"""Incremental decoding of bertforge's BART for generation: the decoder step that greedy and beam
search run once per token, written for that use only, with the model's own weights.

The model's ``decode_step`` is general (several new tokens, padded decoder inputs, a cache that
is reordered layer by layer). Generation needs less, and this step does only that:

* one new token per row, no decoder padding: the vocabulary projection runs on that token's
  state only, and a self-attention block projects queries, keys and values with one matmul;
* the beams of an input share its encoder states: cross-attention keys and values are projected
  once per input, (B, heads, S, head_dim), never repeated per beam nor reordered, and the K
  beams of an input attend to them together, as K query positions of that input;
* self-attention keys and values of every layer live in one buffer allocated for the whole call
  (static: no growing, no concatenation), and they never move when beam search reorders its
  beams: the K beams of an input read the same (time, beam slot) block through a mask that
  picks the slots of each beam's own history (see :class:`BartDecoding`); reordering moves that
  small mask, not the keys and values;
* inputs that finished leave the batch: their entries leave the buffer and the cross-attention
  keys and values (one copy when it happens);
* on a CPU the weights are multiplied in the layout the BLAS is fastest with for a few rows,
  (in, out), copied once per call;
* the logits, each step's largest tensor, land in one buffer kept for the call (a fresh one
  costs its memory pages again every step), which beam search turns into log-probabilities in
  place;
* nothing here reads a tensor on the host after the start: a step is queued work only (a GPU
  runs ahead).

The numbers are those of the model's layers (same weights, LayerNorms, activations, and the
attention through ``scaled_dot_product_attention``), up to the rounding of differently shaped
matmuls: tests/parity/test_generation_parity.py and test_bart_parity.py check that the tokens
are transformers' ``generate``'s.

The step is used for bertforge's ``BartForConditionalGeneration`` itself (not subclasses, which
may change what a step computes) in eval mode; anything else decodes through the model's
``decode_step`` (``bertforge.models.generation.decoders``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

POSITION_OFFSET = 2  # BART's learned positions start at row 2 (bertforge.models.bart)
# The one class this step reproduces, named so that no import of the model module is needed
# (the model module imports generation: importing it back would be a cycle).
BART_CLASS = "bertforge.models.bart.BartForConditionalGeneration"


def handles(model: Any) -> bool:
    """Whether :class:`BartDecoding` computes ``model``'s decoder steps: bertforge's BART with
    its LM head (the class itself), in eval mode (dropout would make a step random), whose
    decoder layers hold their weights as tensors (an int8 model's quantized layers run their
    own products: its steps are the model's ``decode_step``)."""
    cls = type(model)
    if f"{cls.__module__}.{cls.__qualname__}" != BART_CLASS or model.training:
        return False
    return all(isinstance(getattr(layer.fc1, "weight", None), torch.Tensor)
               for layer in model.model.decoder.layers)


def _input_major(weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's (out, in) weight as the (in, out) matrix ``x @ w`` multiplies by: on a
    CPU a copy in that layout (the BLAS multiplies a few rows by it 1.4x to 2.5x faster than by
    the transposed view ``F.linear`` uses), elsewhere the view."""
    return weight.t().contiguous() if weight.device.type == "cpu" else weight.t()


class _Layer:
    """One decoder layer's weights as the step uses them (the model's tensors; the query, key
    and value projections of self-attention concatenated into one matmul)."""

    def __init__(self, layer: Any, encoder_hidden: torch.Tensor) -> None:
        attn, cross = layer.self_attn, layer.encoder_attn
        self.heads, self.head_dim = attn.num_heads, attn.head_dim
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.qkv = (torch.cat([m.bias for m in qkv]),
                    _input_major(torch.cat([m.weight for m in qkv])))
        self.out, self.cross_q, self.cross_out, self.fc1, self.fc2 = (
            (m.bias, _input_major(m.weight))
            for m in (attn.out_proj, cross.q_proj, cross.out_proj, layer.fc1, layer.fc2))
        self.act, self.pre_ln = layer.act, layer.pre_ln
        self.norms = [(norm.normalized_shape, norm.weight, norm.bias, norm.eps) for norm in
                      (layer.self_attn_layer_norm, layer.encoder_attn_layer_norm,
                       layer.final_layer_norm)]
        # Cross-attention keys and values of each input: (B, heads, S, head_dim).
        self.cross_k, self.cross_v = (x.contiguous() for x in cross.project_kv(encoder_hidden))

    def keep_inputs(self, inputs: torch.Tensor) -> None:
        self.cross_k = self.cross_k.index_select(0, inputs)
        self.cross_v = self.cross_v.index_select(0, inputs)

    def __call__(self, x: torch.Tensor, kv: torch.Tensor, self_mask: torch.Tensor | None,
                 cross_keep: torch.Tensor | None) -> torch.Tensor:
        """The layer on (N, D) states. ``kv`` (2, B, heads, t+1, group, head_dim): this
        layer's keys and values, whose last time step this call fills; the masks as
        :meth:`BartDecoding.step` makes them."""
        rows, width = x.shape
        inputs, heads, steps, group, head_dim = kv.shape[1:]

        def by_input(h: torch.Tensor) -> torch.Tensor:  # (N, D) -> (B, heads, group, head_dim)
            return h.view(inputs, group, heads, head_dim).transpose(1, 2)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return context.transpose(1, 2).reshape(rows, width)

        def attend_self(h: torch.Tensor) -> torch.Tensor:
            qkv = torch.addmm(self.qkv[0], h, self.qkv[1])  # (N, 3D)
            kv[:, :, :, -1] = qkv[:, width:].view(inputs, group, 2, heads, head_dim).permute(
                2, 0, 3, 1, 4)
            keys, values = kv.view(2, inputs, heads, steps * group, head_dim)
            return torch.addmm(self.out[0], attend(by_input(qkv[:, :width]), keys, values,
                                                   self_mask), self.out[1])

        def attend_encoder(h: torch.Tensor) -> torch.Tensor:
            q = by_input(torch.addmm(self.cross_q[0], h, self.cross_q[1]))
            return torch.addmm(self.cross_out[0], attend(q, self.cross_k, self.cross_v,
                                                         cross_keep), self.cross_out[1])

        def feed_forward(h: torch.Tensor) -> torch.Tensor:
            return torch.addmm(self.fc2[0], self.act(torch.addmm(self.fc1[0], h, self.fc1[1])),
                               self.fc2[1])

        # As the model's layers: post-LN norm(x + f(x)), or pre-LN x + f(norm(x)).
        for norm, branch in zip(self.norms, (attend_self, attend_encoder, feed_forward)):
            x = x + branch(F.layer_norm(x, *norm)) if self.pre_ln else \
                F.layer_norm(x + branch(x), *norm)
        return x


class BartDecoding:
    """Decoder steps of a bertforge BART for one ``generate`` call (see the module notes).

    Rows are the decoder sequences being extended, ``group`` consecutive rows per input (1 at
    the start; beam search spreads them into its beams with :meth:`reorder`). Self-attention
    keys and values never move when rows are reordered: the entry of time step s computed by
    row j of an input is in slot j of that input's time step s, and a row attends to the slots
    of its own history only, through an additive mask, (B, group, time, group) = 0 where row i
    reads slot j at that time, -inf elsewhere, which is what reordering moves (N x time x group
    numbers instead of the keys and values).
    """

    rows_per_input = 1

    def __init__(self, model: Any, encoder_hidden: torch.Tensor,
                 encoder_mask: torch.Tensor, max_length: int) -> None:
        decoder = model.model.decoder
        self.model, self.decoder = model, decoder
        self.capacity = max_length
        self.layers = [_Layer(layer, encoder_hidden) for layer in decoder.layers]
        self._lm_head = _input_major(model.lm_head.weight)  # (D, vocab_size)
        keep = encoder_mask.bool()
        # (B, 1, 1, S), True = may attend; None without padding (SDPA's unmasked kernels).
        self.cross_keep = None if bool(keep.all()) else keep[:, None, None, :]
        self.inputs, self.group, self.length = encoder_hidden.shape[0], 1, 0
        device = encoder_hidden.device
        # Keys and values are stored as the layers compute them (autocast's dtype under it).
        dtype = (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                 else self.layers[0].qkv[1].dtype)
        first = self.layers[0]
        # (layers, key|value, B, heads, time, group, head_dim): the (time, group) entries of an
        # input and head are one block, which attention reads as (time * group) keys.
        # Each step fills its time step before reading it: no initial values needed.
        self._kv = torch.empty((len(self.layers), 2, self.inputs, first.heads, self.capacity,
                                1, first.head_dim), dtype=dtype, device=device)
        self._mask = torch.zeros((self.inputs, 1, self.capacity, 1), dtype=dtype, device=device)
        self._own = torch.zeros((1, 1), dtype=dtype, device=device)  # (group, group) diagonal
        self._logit_buffer: torch.Tensor | None = None  # (N, vocab_size), see _logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N,) newest token of each row -> (N, vocab_size) float32 logits of the next token."""
        t = self.length
        if t >= self.capacity:
            raise ValueError(f"BartDecoding holds {self.capacity} tokens per row; "
                             "a step past them was asked for")
        decoder = self.decoder
        decoder.embed_positions.check(t + 1)
        hidden = decoder.embed_tokens(tokens)  # (N, D)
        if decoder.embed_scale != 1.0:
            hidden = hidden * decoder.embed_scale
        hidden = decoder.layernorm_embedding(
            hidden + decoder.embed_positions.weight[t + POSITION_OFFSET])
        self_mask = None
        if self.group > 1:  # every row reads its own slot of this step
            self._mask[:, :, t] = self._own
            self_mask = self._mask[:, :, : t + 1].view(self.inputs, 1, self.group, -1)
        kv = self._kv[:, :, :, :, : t + 1]
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, kv[index], self_mask, self.cross_keep)
        self.length = t + 1
        return self._logits(decoder.finish(hidden))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's LM head (``logits``): the tied embedding, then final_logits_bias; as
        float32. Outside autocast the product and the bias land in one buffer kept for the
        call (the step's largest tensor: a fresh one each step costs its pages again; the
        same numbers), which the next step overwrites."""
        weight, bias = self._lm_head, self.model.final_logits_bias[0]
        if torch.is_autocast_enabled(hidden.device.type) or hidden.dtype != weight.dtype:
            return (torch.mm(hidden, weight) + bias).float()
        shape = (hidden.shape[0], weight.shape[1])
        if self._logit_buffer is None or self._logit_buffer.shape != shape:
            self._logit_buffer = hidden.new_empty(shape)
        return torch.mm(hidden, weight, out=self._logit_buffer).add_(bias).float()

    def reorder(self, rows: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
        """Continue with rows ``rows`` (N',) of the current ones, in that order: each row of an
        input becomes one of the same input's rows (beams follow their parents; a row may be
        taken several times). ``inputs`` (B',): the inputs that stay, when some leave
        (finished); the rows are then those of these inputs, in order. Only the mask moves
        (and, when inputs leave or the rows per input change, the buffer once)."""
        filled = self.length
        if inputs is not None:
            for layer in self.layers:
                layer.keep_inputs(inputs)
            if self.cross_keep is not None:
                self.cross_keep = self.cross_keep.index_select(0, inputs)
            kept = self._kv.new_empty((*self._kv.shape[:2], inputs.shape[0], *self._kv.shape[3:]))
            kept[:, :, :, :, :filled] = self._kv[:, :, :, :, :filled].index_select(2, inputs)
            self._kv, self.inputs = kept, inputs.shape[0]
        group = rows.shape[0] // self.inputs
        mask = self._mask.view(-1, self.capacity, self.group).index_select(0, rows)
        if group != self.group:  # more slots per time step: wider buffers
            wider = self._kv.new_empty((*self._kv.shape[:5], group, self._kv.shape[6]))
            # Zeros in the new slots of past time steps: masked, but read (garbage could be
            # NaN, and NaN * 0 is NaN).
            wider[:, :, :, :, :filled].zero_()
            wider[:, :, :, :, :filled, : self.group] = self._kv[:, :, :, :, :filled]
            self._kv = wider
            mask = torch.cat([mask, mask.new_full((*mask.shape[:2], group - self.group),
                                                  -math.inf)], dim=2)
            self._own = torch.full((group, group), -math.inf, dtype=mask.dtype,
                                   device=mask.device).fill_diagonal_(0.0)
            self.group = group
        self._mask = mask.view(self.inputs, group, self.capacity, group)
