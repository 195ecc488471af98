"""The decoder steps a search runs: one object per ``generate`` call that turns each row's newest
token into next-token logits and follows the search's choice of rows.

Two kinds: :class:`BartDecoding` (``bart_decoding``), written for bertforge's BART, and
:class:`ModelDecoding`, which runs any model through its ``decode_step`` / ``reorder_cache``
(the ``EncoderDecoderModel`` protocol of ``search``). :func:`decoding_for` picks one.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from bertforge.models.generation.bart_decoding import BartDecoding, handles


class Decoding(Protocol):
    """What greedy and beam search need from the decoder side.

    Rows are the decoder sequences being extended, ``rows_per_input`` consecutive ones per input
    at the start (beam search repeats a single row into its beams with :meth:`reorder`).
    """

    rows_per_input: int

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N,) newest token of each row -> (N, V) float32 next-token logits, a tensor the
        caller may change in place until its next call (which may reuse it)."""
        ...

    def reorder(self, rows: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
        """Continue with rows ``rows`` (N',) of the current ones, in that order; ``inputs``
        (B',): the inputs that stay when some leave, whose rows ``rows`` then are, in order."""
        ...


class ModelDecoding:
    """Steps through the model's ``decode_step`` and ``reorder_cache``; the encoder states are
    repeated once per beam (the protocol has one encoder row per decoder row)."""

    def __init__(self, model: Any, encoder_hidden: torch.Tensor, encoder_mask: torch.Tensor,
                 beams: int) -> None:
        self.model = model
        self.rows_per_input = beams
        if beams > 1:
            encoder_hidden = encoder_hidden.repeat_interleave(beams, dim=0)
            encoder_mask = encoder_mask.repeat_interleave(beams, dim=0)
        self.hidden, self.mask = encoder_hidden, encoder_mask
        self.cache: Any = None

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = tokens.shape[0]
        logits, self.cache = self.model.decode_step(tokens[:, None], self.hidden, self.mask,
                                                    self.cache)
        if logits.dim() != 3 or logits.shape[0] != rows:
            raise ValueError(f"decode_step returned logits of shape {tuple(logits.shape)}; "
                             f"expected ({rows}, T_new, vocab_size)")
        return logits[:, -1].to(torch.float32, copy=True)

    def reorder(self, rows: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
        self.cache = self.model.reorder_cache(self.cache, rows)
        if inputs is not None:
            # Fewer rows: new encoder tensors (a model's cache may key on them). Every row of an
            # input holds that input's states, so selecting rows selects inputs.
            self.hidden = self.hidden.index_select(0, rows)
            self.mask = self.mask.index_select(0, rows)


def decoding_for(model: Any, encoder_hidden: torch.Tensor, encoder_mask: torch.Tensor,
                 beams: int, max_length: int) -> Decoding:
    """The decoder steps for ``model``: bertforge's BART's own when it has them, else its
    ``decode_step``. ``encoder_hidden`` (B, S, H) and ``encoder_mask`` (B, S): one row per input."""
    if handles(model):
        return BartDecoding(model, encoder_hidden, encoder_mask, max_length)
    return ModelDecoding(model, encoder_hidden, encoder_mask, beams)
