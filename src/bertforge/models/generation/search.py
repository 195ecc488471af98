"""Text generation for encoder-decoder models (BART): greedy search and beam search on a KV cache.

The encoder runs once per call; its output is repeated for every beam. The decoder then runs one
step per new token for the whole batch (times the beams) and keeps its keys and values in the
model's cache, which beam search reorders after every step so that each surviving beam carries
the cache of the beam it came from.

The settings and their meaning are those of Hugging Face transformers' ``GenerationConfig``, and
``generation_config.json`` files move between the two libraries; greedy and beam search produce
the same tokens as transformers' ``generate`` for the same model and settings. In particular:

* lengths (``max_length``, ``min_length``) count the whole decoder sequence, the decoder start
  token included; ``max_new_tokens`` / ``min_new_tokens`` count generated tokens only and take
  precedence when set;
* each step's scores go through, in this order: the repetition penalty, the no-repeat n-gram
  ban, the minimum-length ban of EOS, forced BOS (the first generated token) and forced EOS (the
  token that reaches ``max_length``). Greedy search applies them to the logits; beam search to
  the log-probabilities (``log_softmax`` first), which it adds up along each beam;
* a finished beam's score is its summed log-probability divided by ``L ** length_penalty``,
  ``L`` the number of generated tokens (EOS included, the start token not), so a positive
  penalty favours longer sequences;
* ``early_stopping``: with True, a batch row stops once it holds ``num_beams`` finished
  hypotheses; with False, once the best running beam, scored at its current length, cannot beat
  the worst finished hypothesis; with "never", the same test but scored at ``max_length`` when
  the length penalty is positive (the running beam could still grow that long);
* rows that finished before the longest one are filled with ``pad_token_id`` (or
  ``eos_token_id`` when no pad id is set).

Dropout would make the output random: put the model in eval mode (``model.eval()``) before
calling :func:`generate`; that is the caller's job. Gradients are never tracked here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from bertforge.errors import ConfigError
from bertforge.models.generation.config import TOKEN_FIELDS, GenerationConfig, bad_setting, is_int

# Score given to a beam or hypothesis slot that must lose every comparison. It is finite, so sums
# and divisions of such scores stay ordinary numbers.
_LOSING = -1.0e9

class EncoderDecoderModel(Protocol):
    """What :func:`generate` needs from a model (bertforge's BART has it).

    ``config`` carries ``vocab_size`` and the special token ids. ``decode_step`` is called with
    ``cache=None`` first and then with the cache it returned; positions continue from the cache
    length. ``reorder_cache`` keeps (and reorders) the batch rows named by ``index``.
    """

    config: Any

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, S) ids and mask (1 = real token) -> (B, S, H) encoder output."""
        ...

    def decode_step(self, decoder_input_ids: torch.Tensor, encoder_hidden: torch.Tensor,
                    encoder_attention_mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        """(B, T_new) new decoder tokens -> ((B, T_new, V) logits, updated cache)."""
        ...

    def reorder_cache(self, cache: Any, index: torch.Tensor) -> Any:
        """The cache with batch rows ``index`` (N,) in that order (may work in place)."""
        ...

@dataclass(frozen=True)
class _Plan:
    """The settings of one call, resolved against the model: ids checked, lengths in force."""

    config: GenerationConfig
    start: int
    eos: int | None
    pad: int
    min_length: int
    max_length: int

    @classmethod
    def build(cls, config: GenerationConfig, model_config: Any) -> "_Plan":
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
        return cls(config, start, eos, pad, shortest, longest)


def _ban_repeated_ngrams(scores: torch.Tensor, sequences: torch.Tensor, n: int) -> None:
    """Set to -inf, in place, every token that would complete an n-gram already present.

    scores: (N, V); sequences: (N, T). An n-gram can only be completed by the next token if its
    first n-1 tokens equal the sequence's last n-1, so those are compared against every window.
    """
    length = sequences.shape[1]
    if length < n:
        return
    windows = sequences.unfold(1, n, 1)  # (N, T-n+1, n)
    suffix = sequences[:, length - n + 1:]  # (N, n-1)
    repeats = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=-1)  # (N, T-n+1)
    vocab = scores.shape[1]
    # Windows that do not repeat point at a spare column past the vocabulary.
    target = torch.where(repeats, windows[:, :, -1].clamp(max=vocab), vocab)
    banned = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, target, True)
    scores.masked_fill_(banned[:, :vocab], -math.inf)

def _process(scores: torch.Tensor, sequences: torch.Tensor, plan: _Plan) -> torch.Tensor:
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
        _ban_repeated_ngrams(scores, sequences, config.no_repeat_ngram_size)
    if plan.eos is not None and length < plan.min_length:
        scores[:, plan.eos] = -math.inf
    for token, at_length in ((config.forced_bos_token_id, 1),
                             (config.forced_eos_token_id, plan.max_length - 1)):
        if token is not None and length == at_length:
            scores.fill_(-math.inf)
            scores[:, token] = 0.0
    return scores

def _last_logits(logits: torch.Tensor, rows: int) -> torch.Tensor:
    """The last position's logits of a ``decode_step`` output as a fresh (rows, V) float32."""
    if logits.dim() != 3 or logits.shape[0] != rows:
        raise ValueError(f"decode_step returned logits of shape {tuple(logits.shape)}; expected "
                         f"({rows}, T_new, vocab_size)")
    return logits[:, -1].to(torch.float32, copy=True)

def _greedy(model: EncoderDecoderModel, encoder_hidden: torch.Tensor,
            encoder_mask: torch.Tensor, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy search for a batch. Returns (B, T) sequences and (B,) scores: the summed
    constrained log-probabilities of each row's generated tokens / length ** length_penalty."""
    rows = encoder_hidden.shape[0]
    device = encoder_hidden.device
    sequences = torch.full((rows, 1), plan.start, dtype=torch.long, device=device)
    running = torch.ones(rows, dtype=torch.bool, device=device)
    total = torch.zeros(rows, device=device)
    generated = torch.zeros(rows, dtype=torch.long, device=device)
    cache = None
    new_tokens = sequences
    while True:
        logits, cache = model.decode_step(new_tokens, encoder_hidden, encoder_mask, cache)
        scores = _last_logits(logits, rows)
        log_probs = _process(F.log_softmax(scores, dim=-1), sequences, plan)
        choice = _process(scores, sequences, plan).argmax(dim=-1)  # (B,)
        if plan.eos is not None:
            choice = torch.where(running, choice, plan.pad)
        total += torch.where(running, log_probs.gather(1, choice[:, None])[:, 0], 0.0)
        generated += running.long()
        sequences = torch.cat([sequences, choice[:, None]], dim=1)
        if plan.eos is not None:
            running &= choice != plan.eos
        if sequences.shape[1] >= plan.max_length or not bool(running.any()):
            break
        new_tokens = choice[:, None]
    return sequences, total / generated.to(torch.float32) ** plan.config.length_penalty

def _beam_search(model: EncoderDecoderModel, encoder_hidden: torch.Tensor,
                 encoder_mask: torch.Tensor, plan: _Plan,
                 batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search; ``encoder_hidden`` (B*K, S, H) holds each input's output K times in a row.

    Every step extends the K running beams of each input by every token, keeps the 2K best
    extensions (so that K of them can go on even if K end here), moves the ended ones among the
    top K to the input's K finished hypotheses when they score better, and continues with the K
    best that did not end. Returns (B*R, T) sequences, R = num_return_sequences, best first per
    input, and their (B*R,) length-penalised scores.
    """
    config = plan.config
    beams = config.num_beams
    width = 2 * beams
    longest = plan.max_length
    penalty = config.length_penalty
    device = encoder_hidden.device
    row_offset = torch.arange(batch, device=device)[:, None] * beams  # (B, 1)
    in_top = torch.arange(width, device=device) < beams  # (2K,)

    running = torch.full((batch, beams, longest), plan.pad, dtype=torch.long, device=device)
    running[:, :, 0] = plan.start
    # Only the first beam is live at the start, so the K beams do not all pick the same tokens.
    running_scores = torch.zeros(batch, beams, device=device)
    running_scores[:, 1:] = _LOSING
    done = running.clone()  # (B, K, L) finished hypotheses, best first
    done_scores = torch.full((batch, beams), _LOSING, device=device)
    done_real = torch.zeros(batch, beams, dtype=torch.bool, device=device)
    done_lengths = torch.ones(batch, beams, dtype=torch.long, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)

    cache = None
    length = 1
    new_tokens = running[:, :, 0].reshape(batch * beams, 1)
    while True:
        logits, cache = model.decode_step(new_tokens, encoder_hidden, encoder_mask, cache)
        log_probs = F.log_softmax(_last_logits(logits, batch * beams), dim=-1)
        log_probs = _process(log_probs, running[:, :, :length].reshape(batch * beams, length),
                             plan)
        vocab = log_probs.shape[-1]
        totals = (log_probs.view(batch, beams, vocab) + running_scores[:, :, None])
        cand_scores, flat = torch.topk(totals.view(batch, beams * vocab), width)  # (B, 2K)
        parent = flat // vocab
        token = flat % vocab
        candidates = torch.take_along_dim(running, parent[:, :, None], dim=1)  # (B, 2K, L)
        candidates[:, :, length] = token
        ends = (token == plan.eos if plan.eos is not None
                else torch.zeros_like(token, dtype=torch.bool))
        ends = ends | (length + 1 >= longest)  # (B, 2K)

        # The K best candidates that did not end go on.
        go_on_scores = cand_scores + ends.to(torch.float32) * _LOSING
        pick = torch.topk(go_on_scores, beams).indices  # (B, K)
        running = torch.take_along_dim(candidates, pick[:, :, None], dim=1)
        running_scores = torch.take_along_dim(go_on_scores, pick, dim=1)
        parent = torch.take_along_dim(parent, pick, dim=1)

        # Ended candidates among the top K compete with the finished hypotheses; none may enter
        # a row that is full (early_stopping True) or can no longer improve.
        ended = ends & in_top
        scored = cand_scores / (length ** penalty)
        full = done_real.all(dim=-1, keepdim=True) & (config.early_stopping is True)
        scored = scored + full.to(torch.float32) * _LOSING
        scored = scored + (~improvable).to(torch.float32) * _LOSING
        scored = scored + (~ended).to(torch.float32) * _LOSING
        merged_scores = torch.cat([done_scores, scored], dim=1)  # (B, 3K)
        keep = torch.topk(merged_scores, beams).indices  # (B, K)
        done_scores = torch.take_along_dim(merged_scores, keep, dim=1)
        done = torch.take_along_dim(torch.cat([done, candidates], dim=1), keep[:, :, None], dim=1)
        done_real = torch.take_along_dim(torch.cat([done_real, ended], dim=1), keep, dim=1)
        new_lengths = torch.full_like(token, length + 1)
        done_lengths = torch.take_along_dim(torch.cat([done_lengths, new_lengths], dim=1), keep,
                                            dim=1)
        length += 1

        # Could the best running beam still beat the worst finished hypothesis?
        if config.early_stopping == "never" and penalty > 0:
            best_length = longest - 1
        else:
            best_length = length - 1
        best_running = running_scores[:, :1] / (best_length ** penalty)  # (B, 1)
        worst_done = torch.where(done_real, done_scores.min(dim=1, keepdim=True).values,
                                 _LOSING)  # (B, K)
        improvable = improvable & (best_running > worst_done).any(dim=-1, keepdim=True)
        if (not bool(improvable.any()) or bool(ends.all())
                or (config.early_stopping is True and bool(done_real.all()))):
            break
        cache = model.reorder_cache(cache, (parent + row_offset).reshape(-1))
        new_tokens = running[:, :, length - 1].reshape(batch * beams, 1)

    returned = config.num_return_sequences
    output_length = int(done_lengths[:, :returned].max())
    sequences = done[:, :returned, :output_length].reshape(batch * returned, output_length)
    return sequences, done_scores[:, :returned].reshape(-1)

def _check_inputs(input_ids: Any, attention_mask: Any) -> torch.Tensor:
    """The attention mask to use ((B, S), all ones when None); ValueError for bad inputs."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 \
            or input_ids.is_floating_point() or input_ids.is_complex():
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else None
        raise ValueError(f"input_ids must be a (batch, length) integer tensor, got "
                         f"{type(input_ids).__name__} of shape {shape}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; give at least one "
                         "sequence of at least one token")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else None
        raise ValueError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
                         f"got {shape}")
    empty = (attention_mask == 0).all(dim=1).nonzero()
    if len(empty):
        raise ValueError(f"attention_mask row {int(empty[0, 0])} has no real token (all zeros); "
                         "every input needs at least one")
    return attention_mask

def _own_settings(model: Any, overrides: dict[str, Any]) -> GenerationConfig:
    """The model's saved settings, or its token ids when a call gives the length limit."""
    saved = getattr(model, "generation_config", None)
    if saved is not None:
        return saved
    if "max_length" in overrides or "max_new_tokens" in overrides:
        return GenerationConfig.from_model_config(model.config)
    raise ConfigError("this model has no generation settings (no generation_config.json: "
                      "pretrained, not fine-tuned); pass a length limit, e.g. generate(model, "
                      "ids, mask, max_length=60, num_beams=4), or a GenerationConfig")


@torch.no_grad()
def generate(model: EncoderDecoderModel, input_ids: torch.Tensor,
             attention_mask: torch.Tensor | None, config: GenerationConfig | None = None, *,
             return_scores: bool = False,
             **overrides: Any) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Generate output sequences for a batch of encoder inputs.

    Args:
        model: an encoder-decoder model with ``encode``/``decode_step``/``reorder_cache`` (see
            :class:`EncoderDecoderModel`), in eval mode (the caller's job).
        input_ids: (B, S) encoder token ids, padded on the right.
        attention_mask: (B, S), 1 for real tokens and 0 for padding; None when nothing is padded.
        config: the settings; None (the default): the model's own (``model.generation_config``,
            read from its generation_config.json), else, for a model without one (a pretrained,
            not fine-tuned, BART), the model config's token ids with the ``overrides``, which
            must then set a length limit (``max_length`` or ``max_new_tokens``).
        return_scores: also return each sequence's score.
        overrides: settings replacing the config's for this call (``num_beams=4``, ...).

    Returns:
        (B*R, T) int64 sequences, R = ``num_return_sequences``: the R hypotheses of input i are
        rows i*R..i*R+R-1, best first. Each starts with the decoder start token; rows that ended
        before T are filled with the pad id. T <= the length limit. With ``return_scores``, also
        (B*R,) float32 scores: summed log-probabilities (after the constraints) of the generated
        tokens divided by their count ** ``length_penalty``, the quantity beam search ranks by.

    Raises:
        ConfigError: a bad setting, or token ids outside the model's vocabulary.
        ValueError: malformed ``input_ids`` / ``attention_mask`` or model outputs.
    """
    if config is None:
        config = _own_settings(model, overrides)
    if overrides:
        config = config.replace(**overrides)
    attention_mask = _check_inputs(input_ids, attention_mask)
    plan = _Plan.build(config, model.config)
    encoder_hidden = model.encode(input_ids, attention_mask)
    batch = input_ids.shape[0]
    if config.num_beams == 1:
        sequences, scores = _greedy(model, encoder_hidden, attention_mask, plan)
    else:
        sequences, scores = _beam_search(
            model, encoder_hidden.repeat_interleave(config.num_beams, dim=0),
            attention_mask.repeat_interleave(config.num_beams, dim=0), plan, batch)
    return (sequences, scores) if return_scores else sequences
