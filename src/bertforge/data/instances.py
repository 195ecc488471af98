"""Turning tokenized documents into pretraining instances.

A document is a list of sentences, each already a list of token ids (no special tokens). The
functions here cut documents into model-sized sequences for one of four objectives:

* ``nsp``  BERT's next-sentence prediction: segment B either continues A (label 0) or comes from a
           different document (label 1).
* ``sop``  ALBERT's sentence-order prediction: A and B are always consecutive text from the same
           document; they are swapped with probability 0.5 (label 1 when swapped).
* ``none`` single-segment sequences of whole, contiguous sentences (no pair objective, label -1).
* ``denoise`` the sequences of ``none``, plus where each sentence ends inside them: BART's
           denoising permutes whole sentences, so the boundaries are stored with the tokens. The
           noise itself (masking spans, permutation) is drawn at load time; nothing noisy is
           stored.

Everything is a pure function of ``(documents, rng)``: the same inputs and the same seed give the
same instances on any machine, which is what makes ``prepare`` reproducible across worker counts.
Masking is *not* done here; it happens at load time (or in the static hdf5 export).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from bertforge.core.limits import OBJECTIVES
from bertforge.errors import ConfigError


# One document: sentences -> token ids. Kept as plain lists because instance building is a
# sequential walk over small lists, which is where Python lists beat numpy.
TokenizedDocument = Sequence[Sequence[int]]


@dataclass
class Instance:
    """One pretraining sequence.

    Attributes:
        tokens: token ids including special tokens: ``[CLS] A [SEP] B [SEP]`` for pair objectives,
            ``[CLS] X [SEP]`` for ``none`` and ``denoise`` (for a BPE vocabulary the ids of
            ``<s>`` and ``</s>``).
        a_length: length of ``[CLS] A [SEP]``; tokens after it have segment id 1. Equals
            ``len(tokens)`` for single-segment instances.
        nsp_label: 0 = B follows A (IsNext / in order), 1 = B is random (nsp) or swapped (sop),
            -1 = no pair objective.
        sentence_ends: ``denoise`` only (None otherwise): the exclusive end position in ``tokens``
            of each sentence, increasing. The first sentence starts at 1 (after ``[CLS]``), each
            next one where the previous ended, and the last ends at ``len(tokens) - 1`` (before
            ``[SEP]``). A sentence cut to fit the sequence counts as one sentence per piece.
    """

    tokens: list[int]
    a_length: int
    nsp_label: int
    sentence_ends: list[int] | None = None


def check_instance_settings(max_seq_length: int, short_seq_prob: float, objective: str) -> None:
    """Validate the knobs shared by all objectives; raise ``ConfigError`` naming the bad one."""
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"objective: unknown value {objective!r}; choose one of {', '.join(OBJECTIVES)}"
        )
    # A pair needs [CLS] a [SEP] b [SEP] with at least one token per side, and the random short
    # target is drawn from [2, max_seq_length - 3]; 8 keeps both well defined.
    # Upper bound: shards store segment lengths as int16.
    if not isinstance(max_seq_length, int) or not 8 <= max_seq_length <= 32767:
        raise ConfigError(
            f"max_seq_length: must be an integer in [8, 32767], got {max_seq_length!r}"
        )
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ConfigError(f"short_seq_prob: must be in [0, 1], got {short_seq_prob!r}")


def create_instances(
    documents: Sequence[TokenizedDocument],
    rng: random.Random,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    objective: str,
    cls_id: int,
    sep_id: int,
) -> list[Instance]:
    """Build instances from every document, in document order (one pass, no shuffling).

    For ``nsp`` the random B segments are drawn from the other documents of ``documents``, so pass
    all documents that may be mixed (one chunk of one split). Empty sentences and empty documents
    are ignored. Call repeatedly with the same rng for ``dupe_factor`` passes.
    """
    check_instance_settings(max_seq_length, short_seq_prob, objective)
    docs = [[list(s) for s in d if len(s) > 0] for d in documents]
    docs = [d for d in docs if d]
    out: list[Instance] = []
    for index, doc in enumerate(docs):
        if objective in ("none", "denoise"):
            out.extend(_pack_document(doc, rng, max_seq_length, short_seq_prob, cls_id, sep_id,
                                      with_sentences=objective == "denoise"))
        else:
            out.extend(
                _pairs_from_document(
                    docs, index, rng, max_seq_length, short_seq_prob, objective, cls_id, sep_id
                )
            )
    return out


def _target_length(rng: random.Random, max_tokens: int, short_seq_prob: float) -> int:
    # Mostly fill the sequence; sometimes aim shorter so the model also sees short inputs like
    # those of fine-tuning. Drawn once per document, as in the reference recipe.
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_tokens)
    return max_tokens


def _pairs_from_document(
    docs: list[list[list[int]]],
    index: int,
    rng: random.Random,
    max_seq_length: int,
    short_seq_prob: float,
    objective: str,
    cls_id: int,
    sep_id: int,
) -> list[Instance]:
    """BERT's sentence-pair walk over one document (``nsp`` or ``sop``)."""
    doc = docs[index]
    max_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    target = _target_length(rng, max_tokens, short_seq_prob)
    out: list[Instance] = []
    chunk: list[list[int]] = []
    chunk_len = 0
    i = 0
    while i < len(doc):
        chunk.append(doc[i])
        chunk_len += len(doc[i])
        if i == len(doc) - 1 or chunk_len >= target:
            # Split the accumulated sentences at a random boundary into A | B.
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            b: list[int] = []
            label = 0
            use_random = objective == "nsp" and len(docs) > 1 and (
                len(chunk) == 1 or rng.random() < 0.5
            )
            if use_random:
                label = 1
                b = _random_segment(docs, index, rng, target - len(a))
                # The sentences of this chunk that B did not use are walked again next round.
                i -= len(chunk) - a_end
            elif len(chunk) >= 2:
                b = [t for s in chunk[a_end:] for t in s]
            elif len(a) >= 2:
                # A single sentence and no other document to draw from (or sop, which never
                # mixes documents): split the sentence itself so B is still A's true continuation.
                cut = rng.randint(1, len(a) - 1)
                a, b = a[:cut], a[cut:]
            if b:
                if objective == "sop" and rng.random() < 0.5:
                    a, b, label = b, a, 1
                _truncate_pair(a, b, max_tokens, rng)
                tokens = [cls_id, *a, sep_id, *b, sep_id]
                out.append(Instance(tokens=tokens, a_length=len(a) + 2, nsp_label=label))
            chunk = []
            chunk_len = 0
        i += 1
    return out


def _random_segment(
    docs: list[list[list[int]]], index: int, rng: random.Random, target: int
) -> list[int]:
    """Tokens from a random start in another document, until ``target`` tokens (at least 1 sentence)."""
    # Draw among the n-1 other documents directly (no retry loop), so B is never from ``index``.
    other = rng.randint(0, len(docs) - 2)
    if other >= index:
        other += 1
    source = docs[other]
    start = rng.randint(0, len(source) - 1)
    out: list[int] = []
    for sentence in source[start:]:
        out.extend(sentence)
        if len(out) >= target:
            break
    return out


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer side, one token at a time from its front or back, until the pair fits.

    Trimming only the longer side means a side of one token is trimmed only if the other side is
    also a single token, i.e. when the pair already fits (max_tokens >= 2): no side becomes empty.
    Random front/back trimming avoids always cutting sentence ends (a bias the model could learn).
    """
    excess = len(a) + len(b) - max_tokens
    while excess > 0:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()
        excess -= 1


def _pack_document(
    doc: list[list[int]],
    rng: random.Random,
    max_seq_length: int,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
    *,
    with_sentences: bool = False,
) -> list[Instance]:
    """Greedy packing of whole consecutive sentences into ``[CLS] X [SEP]`` sequences.

    Sequences never cross a document boundary. A sentence longer than ``max_seq_length - 2`` is
    cut into full-length pieces (the last piece may start a new sequence with following text).
    With ``with_sentences`` each instance records where its sentences (or pieces) end.
    """
    max_tokens = max_seq_length - 2
    target = _target_length(rng, max_tokens, short_seq_prob)
    out: list[Instance] = []
    current: list[int] = []
    ends: list[int] = []  # exclusive end of each sentence of ``current``, counting [CLS]

    def add(piece: Sequence[int]) -> None:
        current.extend(piece)
        ends.append(len(current) + 1)

    def flush() -> None:
        if current:
            tokens = [cls_id, *current, sep_id]
            out.append(Instance(tokens=tokens, a_length=len(tokens), nsp_label=-1,
                                sentence_ends=list(ends) if with_sentences else None))
            current.clear()
            ends.clear()

    for sentence in doc:
        if current and len(current) + len(sentence) > target:
            flush()
        pieces = [sentence[k : k + max_tokens] for k in range(0, len(sentence), max_tokens)]
        for piece in pieces[:-1]:
            add(piece)  # a full-length piece: emitted on its own
            flush()
        add(pieces[-1])
    flush()
    return out
