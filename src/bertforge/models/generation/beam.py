"""Beam search (transformers' algorithm and results; see ``search``'s module notes).

Every step extends the K running beams of each input by every token, keeps the 2K best
extensions (so that K of them can go on even if K end here), moves the ended ones among the top
K to the input's K finished hypotheses when they score better, and continues with the K best
that did not end. All of it is batched tensor work over the inputs still in the batch; the host
reads one small tensor every ``check_every`` steps (whether inputs are done) and then drops the
done inputs (their state here, and their decoder rows in the same call that reorders the beams).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import torch

from bertforge.models.generation.constraints import Plan, logits_unused, process
from bertforge.models.generation.decoders import Decoding

# Score given to a beam or hypothesis slot that must lose every comparison. It is finite, so sums
# and divisions of such scores stay ordinary numbers.
LOSING = -1.0e9


@dataclass
class _Beams:
    """Beam search state of the B' inputs still in the batch (K beams, L = max_length)."""

    running: torch.Tensor  # (B', K, L) tokens of the running beams, pad after their end
    running_scores: torch.Tensor  # (B', K) summed log-probabilities; LOSING for dead beams
    done: torch.Tensor  # (B', K, L) finished hypotheses, best first
    done_scores: torch.Tensor  # (B', K) length-penalised scores; LOSING for empty slots
    done_real: torch.Tensor  # (B', K) bool: the slot holds a hypothesis
    done_lengths: torch.Tensor  # (B', K) their lengths, start token included
    improvable: torch.Tensor  # (B', 1) bool: the best running beam can still enter
    ids: torch.Tensor  # (B',) each input's index in the call

    @classmethod
    def start(cls, batch: int, beams: int, plan: Plan, device: torch.device) -> _Beams:
        running = torch.full((batch, beams, plan.max_length), plan.pad, dtype=torch.long,
                             device=device)
        running[:, :, 0] = plan.start
        # Only the first beam is live at the start, so the K beams do not all pick the same
        # tokens.
        scores = torch.zeros(batch, beams, device=device)
        scores[:, 1:] = LOSING
        return cls(running, scores, running.clone(),
                   torch.full((batch, beams), LOSING, device=device),
                   torch.zeros(batch, beams, dtype=torch.bool, device=device),
                   torch.ones(batch, beams, dtype=torch.long, device=device),
                   torch.ones(batch, 1, dtype=torch.bool, device=device),
                   torch.arange(batch, device=device))

    def select(self, keep: torch.Tensor) -> _Beams:
        """The state of inputs ``keep`` (B'',) only."""
        return _Beams(*(getattr(self, f.name).index_select(0, keep) for f in fields(self)))

    def finished(self, stop_when_full: bool) -> torch.Tensor:
        """(B',) bool: no better hypothesis can enter (the input is done)."""
        out = ~self.improvable[:, 0]
        return out | self.done_real.all(dim=1) if stop_when_full else out


@functools.lru_cache(maxsize=64)
def _block_size(width: int) -> int | None:
    """A divisor of ``width`` to cut rows into blocks for :func:`top_k`; None: no good one."""
    return next((size for size in range(128, 1025) if width % size == 0), None)


def _blocks(x: torch.Tensor, k: int) -> torch.Tensor | None:
    """(B, n) scores as (B, n / size, size) blocks when that pays (a CPU, long rows)."""
    rows, width = x.shape
    size = _block_size(width) if x.device.type == "cpu" else None
    if size is None or width < 8 * k * size:
        return None
    return x.view(rows, width // size, size)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of (B, n) scores, the first index of each row's maximum: the first
    block holding the maximum (maxima per block first, as :func:`top_k`), then its first."""
    blocks = _blocks(x, 1)
    if blocks is None:
        return x.argmax(dim=-1)
    first = blocks.amax(dim=-1).argmax(dim=-1)  # (B,)
    inside = torch.take_along_dim(blocks, first[:, None, None], dim=1)[:, 0].argmax(dim=-1)
    return first * blocks.shape[2] + inside


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k)`` of (B, n) scores, the same values and indices.

    On a CPU, torch's topk sorts (value, index) pairs and takes ~20x longer than a maximum over
    the same numbers; on long rows (beams x vocabulary) this takes the maximum of every block
    of a few hundred scores first: the k blocks with the highest maxima hold the k highest
    scores (any other score has k larger or equal ones, those maxima), then the topk of those
    blocks' scores, kept in their order in the row so that ties are met as the plain topk
    meets them.
    """
    blocks = _blocks(x, k)
    if blocks is None:
        return torch.topk(x, k)
    size = blocks.shape[2]
    best = torch.topk(blocks.amax(dim=-1), k).indices.sort(dim=-1).values  # (B, k)
    index = (best[:, :, None] * size + torch.arange(size, device=x.device)).view(x.shape[0], -1)
    values, picked = torch.topk(x.gather(1, index), k)
    return values, index.gather(1, picked)


def _advance(state: _Beams, log_probs: torch.Tensor, length: int, plan: Plan) -> torch.Tensor:
    """One step on ``state`` (updated in place) with the constrained log-probabilities
    (B', K, V) of its beams; the sequences are ``length`` long before it. Returns (B', K): the
    beam (0..K-1) each new running beam continues."""
    config = plan.config
    beams = config.num_beams
    penalty = config.length_penalty
    inputs, rows, vocab = log_probs.shape
    totals = log_probs.add_(state.running_scores[:, :, None]).view(inputs, rows * vocab)
    cand_scores, flat = top_k(totals, 2 * beams)  # (B', 2K)
    parent = flat // vocab
    token = flat % vocab
    candidates = torch.take_along_dim(state.running, parent[:, :, None], dim=1)  # (B', 2K, L)
    candidates[:, :, length] = token
    if length + 1 >= plan.max_length:
        ends = torch.ones_like(token, dtype=torch.bool)
    elif plan.eos is not None:
        ends = token == plan.eos
    else:
        ends = torch.zeros_like(token, dtype=torch.bool)

    # The K best candidates that did not end go on.
    go_on_scores = cand_scores + ends.to(torch.float32) * LOSING
    pick = torch.topk(go_on_scores, beams).indices  # (B', K)
    state.running = torch.take_along_dim(candidates, pick[:, :, None], dim=1)
    state.running_scores = torch.take_along_dim(go_on_scores, pick, dim=1)
    parent = torch.take_along_dim(parent, pick, dim=1)

    # Ended candidates among the top K compete with the finished hypotheses; none may enter an
    # input that is full (early_stopping True) or can no longer improve.
    ended = ends.clone()
    ended[:, beams:] = False
    scored = cand_scores / (length ** penalty)
    if config.early_stopping is True:
        scored = scored + state.done_real.all(dim=-1, keepdim=True).to(torch.float32) * LOSING
    scored = scored + (~state.improvable).to(torch.float32) * LOSING
    scored = scored + (~ended).to(torch.float32) * LOSING
    merged_scores = torch.cat([state.done_scores, scored], dim=1)  # (B', 3K)
    keep = torch.topk(merged_scores, beams).indices  # (B', K)
    state.done_scores = torch.take_along_dim(merged_scores, keep, dim=1)
    state.done = torch.take_along_dim(torch.cat([state.done, candidates], dim=1),
                                      keep[:, :, None], dim=1)
    state.done_real = torch.take_along_dim(torch.cat([state.done_real, ended], dim=1), keep,
                                           dim=1)
    state.done_lengths = torch.take_along_dim(
        torch.cat([state.done_lengths, torch.full_like(token, length + 1)], dim=1), keep, dim=1)

    # Could the best running beam, at the length it may reach, still beat the worst finished
    # hypothesis?
    if config.early_stopping == "never" and penalty > 0:
        best_length = plan.max_length - 1
    else:
        best_length = length
    best_running = state.running_scores[:, :1] / (best_length ** penalty)  # (B', 1)
    worst_done = torch.where(state.done_real,
                             state.done_scores.min(dim=1, keepdim=True).values, LOSING)
    state.improvable &= (best_running > worst_done).any(dim=-1, keepdim=True)
    return parent


class _Results:
    """The best R hypotheses of every input, filled as inputs leave the batch."""

    def __init__(self, batch: int, returned: int, plan: Plan, device: torch.device) -> None:
        self.returned = returned
        self.sequences = torch.full((batch, returned, plan.max_length), plan.pad,
                                    dtype=torch.long, device=device)
        self.scores = torch.zeros(batch, returned, device=device)
        self.lengths = torch.ones(batch, returned, dtype=torch.long, device=device)

    def store(self, state: _Beams, which: torch.Tensor | None = None) -> None:
        """Copy out the hypotheses of inputs ``which`` (indices into ``state``; None: all)."""
        if which is not None:
            state = state.select(which)
        r = self.returned
        self.sequences.index_copy_(0, state.ids, state.done[:, :r])
        self.scores.index_copy_(0, state.ids, state.done_scores[:, :r])
        self.lengths.index_copy_(0, state.ids, state.done_lengths[:, :r])

    def output(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch, r, _ = self.sequences.shape
        width = int(self.lengths.max())
        return self.sequences[:, :, :width].reshape(batch * r, width), self.scores.reshape(-1)


def beam_search(decoding: Decoding, plan: Plan, batch: int, device: torch.device,
                check_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search for ``batch`` inputs. Returns (B*R, T) sequences, R = num_return_sequences,
    best first per input, and their (B*R,) length-penalised scores."""
    config = plan.config
    beams = config.num_beams
    state = _Beams.start(batch, beams, plan, device)
    results = _Results(batch, config.num_return_sequences, plan, device)
    # A decoding may start with one row per input (all beams of an input are equal until the
    # first step chose their tokens): its logits then serve every beam.
    rows = decoding.rows_per_input
    tokens = torch.full((batch * rows,), plan.start, dtype=torch.long, device=device)
    length = 1
    while True:
        if logits_unused(plan, length):
            logits = torch.zeros(tokens.shape[0], plan.vocab_size, device=device)
        else:
            logits = decoding.step(tokens)
        log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # the caller's to change
        if rows != beams:
            log_probs = log_probs.repeat_interleave(beams, dim=0)
        inputs = state.ids.shape[0]
        history = state.running[:, :, :length].reshape(inputs * beams, length)
        log_probs = process(log_probs, history, plan).view(inputs, beams, -1)
        parent = _advance(state, log_probs, length, plan)
        length += 1
        if length >= plan.max_length:
            break
        if rows != beams:
            parent = torch.zeros_like(parent)
        order = parent + torch.arange(inputs, device=device)[:, None] * rows  # (B', K)
        keep = None
        if (length - 1) % check_every == 0:  # the one read on the host
            finished = state.finished(config.early_stopping is True).tolist()
            if all(finished):
                break
            if any(finished):
                gone = [i for i, f in enumerate(finished) if f]
                results.store(state, torch.tensor(gone, device=device))
                keep = torch.tensor([i for i, f in enumerate(finished) if not f], device=device)
                state = state.select(keep)
                order = order.index_select(0, keep)
        decoding.reorder(order.reshape(-1), keep)
        rows = beams
        tokens = state.running[:, :, length - 1].reshape(-1)
    results.store(state)
    return results.output()
