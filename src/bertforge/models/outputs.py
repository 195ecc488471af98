"""What the models return: the encoder's states (``BertModelOutput``, shared by the encoder
families) and the heads' logits. Models return logits only; losses live with the training code.

The encoder's final states stay in the layout the pass ran in (``states``: (B, S, H) padded
rows, or the (T, H) real tokens of an unpadded pass, with their ``layout``) and are padded into
``last_hidden_state`` only when a caller asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertforge.ops.unpad import Layout, RowLayout


class BertModelOutput:
    """Encoder outputs: ``last_hidden_state`` (or ``states`` with their ``layout``) and
    ``pooler_output``."""

    def __init__(self, last_hidden_state: torch.Tensor | None = None,
                 pooler_output: torch.Tensor | None = None, *,
                 states: torch.Tensor | None = None, layout: Layout | None = None) -> None:
        if (last_hidden_state is None) == (states is None) or (states is None) != (layout is None):
            raise ValueError("BertModelOutput needs last_hidden_state, or states with their layout")
        if last_hidden_state is not None:
            states, layout = last_hidden_state, RowLayout(None, tuple(last_hidden_state.shape[:2]))
        self.states, self.layout, self._padded = states, layout, last_hidden_state
        self.pooler_output = pooler_output
        """(N, H) tanh(dense(hidden of each sequence's first token)), N = B unless rows are
        packed, or None for models built without a pooler."""

    @property
    def last_hidden_state(self) -> torch.Tensor:
        """(B, S, H) final hidden states (after the final LayerNorm for pre-LN models); zeros at
        padding when the pass ran unpadded."""
        if self._padded is None:
            self._padded = self.layout.exit(self.states)
        return self._padded

    def select(self, masked_positions: torch.Tensor | None) -> torch.Tensor:
        """Hidden states where a head predicts: (N, H) at the True entries of a (B, S) bool mask
        or at (N,) int64 flat positions ``row * S + column`` (ascending), in row-major order;
        every position, (B, S, H), when ``masked_positions`` is None.

        Running the MLM head only where labels exist skips the (B*S, H) x (H, V) matmul for the
        ~85% of tokens that are not predicted. A bool mask costs one device->host sync for N;
        flat positions (what the pretraining loader ships) cost none.
        """
        if masked_positions is None:
            return self.last_hidden_state
        check_positions(masked_positions, self.layout.shape)
        return self.states.flatten(0, -2).index_select(0, self.layout.rows_of(masked_positions))


def check_positions(positions: torch.Tensor, shape: tuple[int, int]) -> None:
    """ValueError unless ``positions`` is a (B, S) bool mask or (N,) integer flat positions."""
    if positions.dtype == torch.bool:
        if positions.shape != shape:
            raise ValueError(f"masked_positions must be a bool tensor of shape {shape} or "
                             f"int64 flat positions, got bool {tuple(positions.shape)}")
    elif positions.dim() != 1 or positions.is_floating_point():
        raise ValueError("masked_positions must be a (B, S) bool mask or (N,) int64 flat "
                         f"positions, got {positions.dtype} {tuple(positions.shape)}")


@dataclass
class BertPreTrainingOutput:
    mlm_logits: torch.Tensor
    """(B, S, vocab_size), or (N, vocab_size) at the N ``masked_positions`` in row-major order."""
    nsp_logits: torch.Tensor
    """(B, 2), one row per sequence (more than B for packed rows): 0 = IsNext, 1 = random."""


@dataclass
class MaskedLMOutput:
    logits: torch.Tensor
    """(B, S, vocab_size), or (N, vocab_size) at the N ``masked_positions``."""


@dataclass
class QuestionAnsweringOutput:
    start_logits: torch.Tensor
    """(B, S) answer-start scores."""
    end_logits: torch.Tensor
    """(B, S) answer-end scores."""


@dataclass
class ClassifierOutput:
    logits: torch.Tensor
    """(B, num_labels) per sequence, (B, C) per choice, or (B, S, num_labels) per token."""


__all__ = ["BertModelOutput", "BertPreTrainingOutput", "ClassifierOutput", "MaskedLMOutput",
           "QuestionAnsweringOutput", "check_positions"]
