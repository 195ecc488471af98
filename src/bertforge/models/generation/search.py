"""Text generation for encoder-decoder models (BART): greedy search and beam search on a KV cache.

The encoder runs once per call. The decoder then runs one step per new token for every input
still in the batch (times the beams) and keeps its keys and values in a cache, which beam search
reorders after every step so that each surviving beam carries the cache of the beam it came
from (``decoders``: bertforge's BART through its own generation step, ``bart_decoding``, any
other model through its ``decode_step``). Every step is batched tensor work; the host reads one
small tensor per step on a CPU, every few steps on a GPU (``CHECK_EVERY``), to stop, and to drop
the inputs that are done from the batch (``beam``, :func:`_greedy`), so that the rest of the
search computes nothing for them.

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

from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from bertforge.core.arguments import checked
from bertforge.errors import ConfigError
from bertforge.models.generation.beam import argmax, beam_search
from bertforge.models.generation.config import GenerationConfig
from bertforge.models.generation.constraints import Plan, logits_unused, process
from bertforge.models.generation.decoders import Decoding, decoding_for

# Decoder steps between two reads on the host (are inputs done? which leave the batch?). A read
# waits for the device: on a CPU it costs nothing, on a GPU it stops the host from queueing
# steps ahead, so there it happens every few steps (done inputs then ride along for up to that
# many steps, changing nothing).
CHECK_EVERY = {"cpu": 1}
CHECK_EVERY_DEFAULT = 4


class EncoderDecoderModel(Protocol):
    """What :func:`generate` needs from a model (bertforge's BART has it).

    ``config`` carries ``vocab_size`` and the special token ids. ``decode_step`` is called with
    ``cache=None`` first and then with the cache it returned; positions continue from the cache
    length. ``reorder_cache`` keeps (and reorders) the batch rows named by ``index``; when inputs
    leave the batch (done), ``index`` names fewer rows and the next ``decode_step`` gets the
    encoder states of the remaining rows, a new tensor. (bertforge's BART decodes through its
    own generation step instead, ``bart_decoding``.)
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


@dataclass
class _Rows:
    """Greedy search state of the B' rows (one per input) still in the batch."""

    sequences: torch.Tensor  # (B', L) tokens, pad after the end
    total: torch.Tensor  # (B',) summed constrained log-probabilities of the generated tokens
    generated: torch.Tensor  # (B',) tokens generated, EOS included
    running: torch.Tensor  # (B',) bool: not ended
    ids: torch.Tensor  # (B',) each row's input index in the call

    def select(self, keep: torch.Tensor) -> _Rows:
        return _Rows(*(getattr(self, f.name).index_select(0, keep) for f in fields(self)))

    def store(self, into: _Rows) -> None:
        """Copy these rows into ``into``, the state of every input, at their inputs' places."""
        for f in fields(self)[:3]:
            getattr(into, f.name).index_copy_(0, self.ids, getattr(self, f.name))


def _greedy(decoding: Decoding, plan: Plan, batch: int, device: torch.device,
            check_every: int, with_scores: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy search for ``batch`` inputs. Returns (B, T) sequences and, ``with_scores``, (B,)
    scores: the summed constrained log-probabilities of each row's generated tokens / length **
    length_penalty. Rows that ended leave the batch at the next read on the host."""
    sequences = torch.full((batch, plan.max_length), plan.pad, dtype=torch.long, device=device)
    sequences[:, 0] = plan.start
    rows = _Rows(sequences, torch.zeros(batch, device=device),
                 torch.zeros(batch, dtype=torch.long, device=device),
                 torch.ones(batch, dtype=torch.bool, device=device),
                 torch.arange(batch, device=device))
    results = rows.select(rows.ids)  # a copy: every input's final state, filled as rows leave
    tokens = sequences[:, 0]
    for length in range(1, plan.max_length):
        if logits_unused(plan, length):
            scores = torch.zeros(tokens.shape[0], plan.vocab_size, device=device)
        else:
            scores = decoding.step(tokens)  # (B', V)
        history = rows.sequences[:, :length]
        if with_scores:
            log_probs = process(F.log_softmax(scores, dim=-1), history, plan)
        tokens = argmax(process(scores, history, plan))  # (B',)
        if plan.eos is not None:
            tokens = torch.where(rows.running, tokens, plan.pad)
        if with_scores:
            rows.total += torch.where(rows.running, log_probs.gather(1, tokens[:, None])[:, 0],
                                      0.0)
        rows.generated += rows.running
        rows.sequences[:, length] = tokens
        if plan.eos is not None:
            rows.running &= tokens != plan.eos
        if plan.eos is None or length + 1 == plan.max_length or length % check_every:
            continue
        flags = rows.running.tolist()  # the one read on the host
        if not any(flags):
            break
        if not all(flags):
            rows.select(torch.tensor([i for i, f in enumerate(flags) if not f],
                                     device=device)).store(results)
            keep = torch.tensor([i for i, f in enumerate(flags) if f], device=device)
            rows, tokens = rows.select(keep), tokens.index_select(0, keep)
            decoding.reorder(keep, keep)
    rows.store(results)
    width = int(results.generated.max()) + 1
    scores = results.total / results.generated.to(torch.float32) ** plan.config.length_penalty
    return results.sequences[:, :width], (scores if with_scores else None)


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
@checked
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
    plan = Plan.build(config, model.config)
    encoder_hidden = model.encode(input_ids, attention_mask)
    batch, device = input_ids.shape[0], input_ids.device
    decoding = decoding_for(model, encoder_hidden, attention_mask, config.num_beams,
                            plan.max_length)
    check_every = CHECK_EVERY.get(device.type, CHECK_EVERY_DEFAULT)
    if config.num_beams == 1:
        sequences, scores = _greedy(decoding, plan, batch, device, check_every, return_scores)
    else:
        sequences, scores = beam_search(decoding, plan, batch, device, check_every)
    return (sequences, scores) if return_scores else sequences
