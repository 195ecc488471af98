"""``truncation="chunk"``: a text over ``max_length`` tokens split into overlapping windows that
each fit, run in the same forward passes as the other inputs of a call, and pooled back into one
result per text (embeddings: the mean of the windows' vectors; classification: the mean or the
maximum of their logits).

How windows are made. The text is tokenized whole. Every window holds the model's special tokens
(and, for a pair, the whole second text; for an embedding, the tokens of its prompt) and
``room = max_length - specials - len(pair or prompt)`` consecutive tokens of the first text.
Window k starts at token ``k * (room - overlap)``; the last one ends at the text's last token (it
starts at ``n - room``, so it may share more than ``overlap`` tokens with the one before).
Every window is therefore full, and a plain mean over windows weighs each window by its tokens
as well. ``overlap`` is the pipeline's ``chunk_overlap`` (default: a quarter of the room, rounded
down). A text that fits is one window, encoded exactly
as ``"error"`` and ``"truncate"`` encode it, and its result is bit-identical to theirs.

How windows run. All windows of a call's texts go through the model in order, in forward passes
of at most ``max(max_windows, number of texts in the call)`` windows: a call of texts that all fit
is one pass as before, and the windows of long texts fill passes as the caller's batch of texts
would (a window counts as an item), never one text at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from bertforge.errors import ConfigError
from bertforge.inference.pipelines.base import InputError, windows_of
from bertforge.tokenization import EncoderTokenizer, Window

CHUNK_POOLS = ("mean", "max")
"""How a classifier's window logits become the text's: their mean (default) or maximum."""
CHUNK_OPTIONS = ("chunk_overlap", "chunk_pool", "max_windows")
"""The pipeline options that only ``truncation="chunk"`` reads."""
DEFAULT_MAX_WINDOWS = 32
LONE_SPECIALS = 2  # [CLS] text [SEP] (BERT, ModernBERT), <s> text </s> (BART)
_WHOLE = 1 << 30  # a max_length no text reaches: the tokenizer's truncation cuts nothing
_WINDOW_LISTS = ("ids", "type_ids", "offsets", "sequence_ids", "word_ids")


def check_chunking(pipeline: Any) -> None:
    """``ConfigError`` for chunk options that cannot work: ``chunk_overlap`` outside
    [0, room of a lone text), ``max_windows`` under 1, a ``chunk_pool`` that is not one of
    ``CHUNK_POOLS``."""
    room = pipeline.max_length - LONE_SPECIALS
    overlap = pipeline.chunk_overlap
    if overlap is not None and not 0 <= overlap < room:
        raise ConfigError(f"chunk_overlap must be from 0 to {room - 1} (a window of max_length="
                          f"{pipeline.max_length} holds {room} tokens of a text besides its "
                          f"{LONE_SPECIALS} special tokens), got {overlap}")
    if pipeline.max_windows < 1:
        raise ConfigError(f"max_windows must be >= 1, got {pipeline.max_windows}")
    pool = getattr(pipeline, "chunk_pool", "mean")
    if pool not in CHUNK_POOLS:
        raise ConfigError(f"chunk_pool must be {' or '.join(CHUNK_POOLS)}, got {pool!r}")


def overlap_for(pipeline: Any, room: int) -> int:
    """The tokens two neighbouring windows with ``room`` tokens of text share."""
    return room // 4 if pipeline.chunk_overlap is None else pipeline.chunk_overlap


def window_starts(n: int, room: int, overlap: int) -> list[int]:
    """First token of each window of ``room`` tokens over a text of ``n`` tokens: every
    ``room - overlap`` tokens, the last window ending at the text's end."""
    if n <= room:
        return [0]
    return [*range(0, n - room, room - overlap), n - room]


def whole_window(pipeline: Any, text: str, pair: str | None) -> Window:
    """``text`` (and ``pair``) encoded whole with special tokens and alignment, uncut:
    ``sequence_ids`` 0 marks the first text's tokens."""
    tokenizer = pipeline.tokenizer
    if isinstance(tokenizer, EncoderTokenizer):
        return tokenizer.encode_windows([text], None if pair is None else [pair],
                                        max_length=_WHOLE)[0]
    # BART's byte-level BPE (<s> text </s></s> pair </s>): its backend aligns as an encoder's.
    enc = tokenizer.backend.encode(text, pair, add_special_tokens=True)
    return Window(ids=enc.ids, type_ids=enc.type_ids, offsets=enc.offsets,
                  sequence_ids=enc.sequence_ids, word_ids=enc.word_ids, source=0)


def chunk_windows(pipeline: Any, text: str, pair: str | None,
                  prefix: int = 0) -> tuple[Window, ...]:
    """The windows of a ``text`` (with ``pair`` whole in each) over ``max_length`` (see the
    module notes); ``prefix``: the characters at the start of ``text`` (an embedding's prompt)
    whose tokens every window repeats. ``InputError`` when the pair (or prompt) leaves too
    little room."""
    whole = whole_window(pipeline, text, pair)
    # The first text's tokens are positions [lo, hi), after [CLS]/<s> and before the rest;
    # the prompt's are its first ones, those that end within the prompt's characters.
    first = [t for t, s in enumerate(whole.sequence_ids) if s == 0]
    lo, hi = (first[0], first[-1] + 1) if first else (1, 1)
    while prefix and lo < hi and whole.offsets[lo][1] <= prefix:
        lo += 1
    room = pipeline.max_length - (len(whole.ids) - (hi - lo))
    overlap = overlap_for(pipeline, room)
    if room <= overlap:  # a lone text always has room (check_chunking)
        name, other, fix = (("text_pair", "{text}", "shorten it") if pair is not None else
                            ("prompt_name", "text", "choose a shorter prompt"))
        what = (f"no room for {other}" if room < 1 else f"{room} tokens for {other} in each "
                f"window, no more than the {overlap} that neighbouring windows share")
        raise InputError(name, f"leaves {what} within this model's limit of "
                         f"{pipeline.max_length} tokens; {fix}, or {{cut}} to cut the input",
                         refers=("text",) if pair is not None else (), cuts=True)
    windows = []
    for start in window_starts(hi - lo, room, overlap):  # slices: work linear in the windows
        at, to = lo + start, min(lo + start + room, hi)
        windows.append(dataclasses.replace(whole, **{
            name: values[:lo] + values[at:to] + values[hi:]
            for name in _WINDOW_LISTS if (values := getattr(whole, name))}))
    return tuple(windows)


def run_windows(pipeline: Any, requests: Sequence[Any],
                call: Callable[[list[Window]], Any]) -> tuple[list[Any], list[int]]:
    """``call`` (windows -> (n, ...) outputs of one forward pass) on every window of
    ``requests``, in order, at most ``max(max_windows, len(requests))`` windows a pass; the
    outputs of each pass, and how many windows each request has."""
    windows = [w for r in requests for w in windows_of(r)]
    counts = [len(windows_of(r)) for r in requests]
    per_pass = max(getattr(pipeline, "max_windows", DEFAULT_MAX_WINDOWS), len(requests))
    return [call(windows[lo:lo + per_pass]) for lo in range(0, len(windows), per_pass)], counts


def per_input(rows: Any, counts: Sequence[int], how: str = "mean") -> list[Any]:
    """``rows`` (N, ...) of all windows, grouped by ``counts``: a text's one row as it is
    (results of texts that fit stay bit-identical), else the ``how`` ("mean", or "max": numpy
    rows only) of its rows over the windows axis."""
    out, lo = [], 0
    for n in counts:
        part = rows[lo:lo + n]
        lo += n
        out.append(part[0] if n == 1 else part.mean(0) if how == "mean" else part.max(0))
    return out


def chunk_description(pipeline: Any) -> dict:
    """What /health shows of a chunking pipeline's windows (nothing when it does not chunk)."""
    if pipeline.truncation != "chunk":
        return {}
    room = pipeline.max_length - LONE_SPECIALS
    described = {"chunk_overlap": overlap_for(pipeline, room), "max_windows": pipeline.max_windows}
    if hasattr(pipeline, "chunk_pool"):
        described["chunk_pool"] = pipeline.chunk_pool
    return described


__all__ = ["CHUNK_OPTIONS", "CHUNK_POOLS", "DEFAULT_MAX_WINDOWS", "check_chunking",
           "chunk_description", "chunk_windows", "per_input", "run_windows", "whole_window",
           "window_starts"]
