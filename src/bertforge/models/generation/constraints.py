"""The settings of one ``generate`` call resolved against the model (:class:`Plan`), and the
constraints applied to every step's scores (:func:`process`), as batched tensor operations with
no read on the host: repetition penalty, no-repeat n-grams, minimum length, forced BOS and EOS
(the order and meaning of transformers' logits processors; see ``search``'s module notes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bertforge.errors import ConfigError
from bertforge.models.generation.config import TOKEN_FIELDS, GenerationConfig, bad_setting, is_int


@dataclass(frozen=True)
class Plan:
    """The settings of one call, resolved against the model: ids checked, lengths in force."""

    config: GenerationConfig
    start: int
    eos: int | None
    pad: int
    min_length: int
    max_length: int
    vocab_size: int

    @classmethod
    def build(cls, config: GenerationConfig, model_config: Any) -> Plan:
        start = config.decoder_start_token_id
        if start is None:
            start = config.bos_token_id
        if start is None:
            raise ConfigError("generation settings decoder_start_token_id and bos_token_id are "
                              "both null: build them with GenerationConfig.from_model_config"
                              "(model.config) or set decoder_start_token_id")
        vocab_size = getattr(model_config, "vocab_size", None)
        if not is_int(vocab_size):
            raise ValueError(f"model.config.vocab_size is {vocab_size!r}; the model must give "
                             "its vocabulary size")
        for name in TOKEN_FIELDS:
            value = getattr(config, name)
            if value is not None and value >= vocab_size:
                raise bad_setting(name, value, f"the model's vocabulary has ids 0..{vocab_size - 1}; "
                           "use the ids of the model's config (GenerationConfig."
                           "from_model_config)")
        eos = config.eos_token_id
        # Without EOS no sequence ends early, so the fill value is never seen.
        pad = config.pad_token_id if config.pad_token_id is not None else (
            eos if eos is not None else start)
        shortest, longest = config.length_limits()
        return cls(config, start, eos, pad, shortest, longest, vocab_size)


def logits_unused(plan: Plan, length: int) -> bool:
    """Whether the step after ``length`` tokens needs no logits: it is the last step and
    forced EOS gives every token but EOS -inf and EOS 0, whatever the model says (the decoder
    step can then be skipped: no later step reads its cache entries either)."""
    return plan.config.forced_eos_token_id is not None and length == plan.max_length - 1


def ban_repeated_ngrams(scores: torch.Tensor, sequences: torch.Tensor, n: int) -> None:
    """Set to -inf, in place, every token that would complete an n-gram already present.

    scores: (N, V); sequences: (N, T). An n-gram can only be completed by the next token if its
    first n-1 tokens equal the sequence's last n-1, so those are compared against every window;
    the last tokens of the windows that match are banned, the others leave their score as is
    (a minimum with +inf), so the work is O(N * T), not O(N * V).
    """
    length = sequences.shape[1]
    if length < n:
        return
    windows = sequences.unfold(1, n, 1)  # (N, T-n+1, n)
    suffix = sequences[:, length - n + 1:]  # (N, n-1)
    repeats = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=-1)  # (N, T-n+1)
    ban = torch.where(repeats, -math.inf, math.inf).to(scores.dtype)
    scores.scatter_reduce_(1, windows[:, :, -1], ban, reduce="amin")


def process(scores: torch.Tensor, sequences: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Apply the step's constraints to ``scores`` (N, V) float32 (changed in place and returned)
    for decoder sequences ``sequences`` (N, T), start token included; see the module notes."""
    config = plan.config
    length = sequences.shape[1]
    if config.repetition_penalty != 1.0:
        seen = scores.gather(1, sequences)
        seen = torch.where(seen < 0, seen * config.repetition_penalty,
                           seen / config.repetition_penalty)
        scores.scatter_(1, sequences, seen)
    if config.no_repeat_ngram_size > 0:
        ban_repeated_ngrams(scores, sequences, config.no_repeat_ngram_size)
    if plan.eos is not None and length < plan.min_length:
        scores[:, plan.eos] = -math.inf
    for token, at_length in ((config.forced_bos_token_id, 1),
                             (config.forced_eos_token_id, plan.max_length - 1)):
        if token is not None and length == at_length:
            scores.fill_(-math.inf)
            scores[:, token] = 0.0
    return scores
