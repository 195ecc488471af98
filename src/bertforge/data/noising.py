"""BART's document noising: sentence permutation, span masking, deletion, insertion and rotation.

BART is trained to reconstruct a document (the target) from a corrupted copy of it (the source).
As with MLM masking, the corruption is drawn at load time, per sample, from the generator
``bertforge.data.masking.sample_rng(seed, epoch, index)``: every function here is a pure
function of its arguments and the generator's state, so a sample gets the same noise in any
process layout and a fresh one every epoch.

The options and their meaning are fairseq's ``DenoisingDataset`` (``--mask``,
``--mask-random``, ``--insert``, ``--rotate``, ``--permute-sentences``, ``--replace-length``,
``--mask-length``, ``--poisson-lambda``), applied in its order: permute sentences, mask, then
(our addition, the BART paper's token deletion) delete, insert, rotate. Where we differ:

* sentences come from explicit boundaries stored with the data. fairseq searched the tokens for
  a full-stop id that its byte-level BPE never produced as a token of its own, so the
  permutation it was configured with never happened;
* special tokens (``<s>``, ``</s>``, ``<mask>``, ``<unk>``, ...) are never masked nor deleted,
  and a span stops at one, as fairseq's spans stop at ``</s>``;
* random replacements are drawn from the ordinary ids only (fairseq could draw specials);
* rotation starts the document at a uniformly chosen content token (fairseq's offset range had
  one extra value that also left the document as it was).

A *word* starts at a token whose ``is_word_start`` is True (all tokens for ``subword`` or when
no table is given). ``mask`` is a fraction of words: ``ceil(words * mask)`` of them are covered.
With ``span-poisson`` (text infilling) span lengths in words are Poisson(``poisson_lambda``)
draws, accumulated until they reach that budget, the last one trimmed to it; a zero-length
span inserts one ``<mask>``. A span starts at a randomly chosen word start (distinct for every
span; spans may overlap) and covers its words with their continuation tokens.
``replace_length`` says what becomes of a span: 1 one token (``<mask>``, or with probability
``mask_random`` a random token), 0 nothing (deleted), -1 one token per covered token (every one
``<mask>``, or every one random for a random span).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from bertforge.data.masking import _random_ordinary_ids, normalize_special_ids

MASK_LENGTHS = ("subword", "word", "span-poisson")
REPLACE_LENGTHS = (-1, 0, 1)
_FRACTIONS = ("mask", "mask_random", "insert", "rotate", "permute_sentences", "delete")


@dataclass(frozen=True)
class NoiseSpec:
    """How to corrupt a document; the fields are fairseq's denoising options.

    Attributes:
        mask: fraction of words to mask (``--mask``).
        mask_random: fraction of masks (and of inserted tokens) that are a random ordinary
            token instead of ``<mask>`` (``--mask-random``).
        insert: insert ``ceil(tokens * insert)`` new ``<mask>``/random tokens (``--insert``).
        rotate: probability of rotating the document (``--rotate``).
        permute_sentences: fraction of sentences shuffled among themselves
            (``--permute-sentences``).
        replace_length: -1 every masked token becomes a ``<mask>``; 0 spans are deleted;
            1 each span becomes one ``<mask>`` (``--replace-length``).
        mask_length: ``"subword"`` (single tokens), ``"word"`` (single whole words) or
            ``"span-poisson"`` (text infilling: spans of Poisson-many words).
        poisson_lambda: mean span length in words for ``span-poisson``.
        delete: fraction of the ordinary tokens left after masking that are deleted (the BART
            paper's token deletion; no fairseq option).
    """

    mask: float = 0.3
    mask_random: float = 0.1
    insert: float = 0.0
    rotate: float = 0.0
    permute_sentences: float = 1.0
    replace_length: int = 1
    mask_length: str = "span-poisson"
    poisson_lambda: float = 3.5
    delete: float = 0.0


DEFAULT_NOISE = NoiseSpec()


@dataclass(frozen=True, eq=False)
class NoiseVocab:
    """What noising needs to know about the tokenizer.

    Attributes:
        mask_id: id of ``<mask>``.
        bos_id: id of ``<s>``, the first token of every document.
        eos_id: id of ``</s>``, the last token of every document.
        vocab_size: the tokenizer's vocabulary size; random tokens are drawn below it.
        special_ids: ids never masked, deleted nor drawn as random tokens. Stored sorted,
            unique, int64, with ``mask_id``, ``bos_id`` and ``eos_id`` added.
        is_word_start: (vocab_size,) bool, True for tokens that begin a word (for byte-level
            BPE, those spelled with a leading space marker); None: every token is a word.
    """

    mask_id: int
    bos_id: int
    eos_id: int
    vocab_size: int
    special_ids: np.ndarray
    is_word_start: np.ndarray | None = None

    def __post_init__(self) -> None:
        if int(self.vocab_size) < 1:
            raise ValueError(f"vocab_size={self.vocab_size} must be positive")
        for name in ("mask_id", "bos_id", "eos_id"):
            value = int(getattr(self, name))
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"{name}={value} must be in [0, vocab_size={self.vocab_size})")
        specials = np.union1d(normalize_special_ids(self.special_ids),
                              [self.mask_id, self.bos_id, self.eos_id]).astype(np.int64)
        if specials[0] < 0 or specials[-1] >= self.vocab_size:
            raise ValueError(f"special_ids must lie in [0, vocab_size={self.vocab_size}), got "
                             f"{int(specials[0])}..{int(specials[-1])}")
        if len(specials) >= self.vocab_size:
            raise ValueError(f"special_ids cover all of vocab_size={self.vocab_size}; no "
                             "ordinary token is left to mask or draw")
        object.__setattr__(self, "special_ids", specials)
        if self.is_word_start is not None:
            table = np.asarray(self.is_word_start, dtype=bool)
            if table.shape != (self.vocab_size,):
                raise ValueError(f"is_word_start has shape {table.shape}, expected "
                                 f"({self.vocab_size},) (one flag per vocabulary id)")
            object.__setattr__(self, "is_word_start", table)

    def is_special(self, tokens: np.ndarray) -> np.ndarray:
        """(L,) bool: which of the (L,) ``tokens`` are special ids."""
        at = np.searchsorted(self.special_ids, tokens)
        return self.special_ids[np.minimum(at, len(self.special_ids) - 1)] == tokens


def noise_vocab(tokenizer: Any) -> NoiseVocab:
    """What noising needs from the data's tokenizer (its specials, mask id and word starts)."""
    specials = normalize_special_ids([tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id,
                                      tokenizer.sep_id, tokenizer.mask_id])
    starts = getattr(tokenizer, "is_word_start", None)
    if starts is None and getattr(tokenizer, "is_continuation", None) is not None:
        starts = ~tokenizer.is_continuation  # WordPiece: a word starts where "##" pieces do not
    return NoiseVocab(mask_id=int(tokenizer.mask_id), bos_id=int(tokenizer.cls_id),
                      eos_id=int(tokenizer.sep_id), vocab_size=int(tokenizer.vocab_size),
                      special_ids=specials, is_word_start=starts)


def check_noise_spec(spec: NoiseSpec) -> None:
    """Raise ``ValueError`` naming the first field of ``spec`` that is out of range."""
    for name in _FRACTIONS:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= value <= 1.0:
            raise ValueError(f"NoiseSpec.{name}={value!r} must be a number in [0, 1]")
    if isinstance(spec.replace_length, bool) or spec.replace_length not in REPLACE_LENGTHS:
        raise ValueError(f"NoiseSpec.replace_length={spec.replace_length!r} must be -1 (mask "
                         "every token), 0 (delete spans) or 1 (one <mask> per span)")
    if spec.mask_length not in MASK_LENGTHS:
        raise ValueError(f"NoiseSpec.mask_length={spec.mask_length!r} must be one of "
                         f"{', '.join(MASK_LENGTHS)}")
    lam = spec.poisson_lambda
    if spec.mask_length == "span-poisson" and (
        isinstance(lam, bool) or not isinstance(lam, Real) or not 0.0 < lam < math.inf
    ):
        raise ValueError(f"NoiseSpec.poisson_lambda={lam!r} must be a positive finite number "
                         "for mask_length='span-poisson'")


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={value!r} must be in [0, 1]")


def _document(tokens: np.ndarray, vocab: NoiseVocab) -> np.ndarray:
    """A fresh int64 copy of ``tokens`` after checking it is ``<s> ... </s>`` of valid ids."""
    doc = _sequence(tokens)
    if doc[0] != vocab.bos_id or doc[-1] != vocab.eos_id:
        raise ValueError(f"tokens must start with bos_id={vocab.bos_id} and end with "
                         f"eos_id={vocab.eos_id}, got {int(doc[0])} ... {int(doc[-1])}")
    if doc.min() < 0 or doc.max() >= vocab.vocab_size:
        raise ValueError(f"tokens hold ids outside [0, vocab_size={vocab.vocab_size}): "
                         f"{int(doc.min())}..{int(doc.max())}")
    return doc


def _sequence(tokens: np.ndarray) -> np.ndarray:
    """A fresh int64 copy of a 1-D integer array of at least two tokens (``<s>`` and ``</s>``)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"tokens must be a 1-D integer array, got {arr.dtype} of shape "
                         f"{arr.shape}")
    if len(arr) < 2:
        raise ValueError(f"tokens has {len(arr)} token(s); a document is at least <s> </s>")
    return arr.astype(np.int64, copy=True)


def _check_sentence_ends(sentence_ends: np.ndarray, length: int) -> np.ndarray:
    """``sentence_ends`` as int64 after checking it partitions positions [1, length - 1)."""
    ends = np.asarray(sentence_ends)
    if ends.ndim != 1 or not (np.issubdtype(ends.dtype, np.integer) or ends.size == 0):
        raise ValueError(f"sentence_ends must be a 1-D integer array, got {ends.dtype} of "
                         f"shape {ends.shape}")
    ends = ends.astype(np.int64)
    if len(ends) == 0:
        if length != 2:
            raise ValueError(f"sentence_ends is empty but the document has {length - 2} "
                             "content tokens; give the end of at least one sentence")
        return ends
    if ends[0] < 1 or np.any(np.diff(ends) < 0) or ends[-1] != length - 1:
        raise ValueError(f"sentence_ends must be non-decreasing positions from 1 up to "
                         f"len(tokens) - 1 = {length - 1} (the last sentence ends before "
                         f"</s>), got {ends.tolist()}")
    return ends


def _coverage(starts: np.ndarray, ends: np.ndarray, length: int) -> np.ndarray:
    """(length,) int64: how many of the half-open ranges [starts, ends) cover each position."""
    change = (np.bincount(starts, minlength=length + 1)
              - np.bincount(ends, minlength=length + 1))
    return np.cumsum(change[:length])


def permute_sentences(
    tokens: np.ndarray, sentence_ends: np.ndarray, rng: np.random.Generator, p: float
) -> np.ndarray:
    """Shuffle ``ceil(M * p)`` randomly chosen sentences among their own slots (fairseq's rule).

    Args:
        tokens: (L,) ``<s> ... </s>``; positions 0 and L-1 stay where they are.
        sentence_ends: (M,) exclusive end of each sentence; the first starts at 1, each next one
            where the previous ended, and the last ends at L-1.
        rng: source of randomness.
        p: fraction of sentences that take part in the shuffle.

    Returns:
        (L,) int64: the sentences in their new order (a new array).
    """
    _check_fraction("p", p)
    out = _sequence(tokens)
    ends = _check_sentence_ends(sentence_ends, len(out))
    n_sentences = len(ends)
    n_moved = math.ceil(n_sentences * p)
    if n_moved < 2:
        return out
    moved = rng.permutation(n_sentences)[:n_moved]
    order = np.arange(n_sentences)
    order[moved] = moved[rng.permutation(n_moved)]
    starts = np.concatenate(([1], ends[:-1]))
    lengths = (ends - starts)[order]  # (M,) lengths in the new order
    placed_at = np.cumsum(lengths) - lengths  # (M,) where each lands in the content
    # Content position c of the result comes from starts[order[s]] + (c - placed_at[s]).
    source = np.repeat(starts[order] - placed_at, lengths) + np.arange(len(out) - 2)
    out[1:-1] = out[source]
    return out


def poisson_span_lengths(
    rng: np.random.Generator, num_to_mask: int, poisson_lambda: float
) -> np.ndarray:
    """Span lengths (in words) for text infilling, summing to exactly ``num_to_mask``.

    Poisson(``poisson_lambda``) lengths are drawn and accumulated until their sum reaches
    ``num_to_mask``; the span that crosses it is trimmed to fit and later ones are dropped.
    Zero lengths are kept (each becomes one inserted ``<mask>``).

    Returns:
        (S,) int64, S >= 1 when ``num_to_mask`` > 0 (empty when it is 0).
    """
    if num_to_mask < 0:
        raise ValueError(f"num_to_mask={num_to_mask} must be non-negative")
    if not 0.0 < poisson_lambda < math.inf:
        raise ValueError(f"poisson_lambda={poisson_lambda} must be positive and finite")
    if num_to_mask == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = rng.poisson(poisson_lambda, size=num_to_mask).astype(np.int64)
    total = np.cumsum(lengths)
    while total[-1] < num_to_mask:
        lengths = np.concatenate((lengths, rng.poisson(poisson_lambda, size=num_to_mask)))
        total = np.cumsum(lengths)
    last = int(np.searchsorted(total, num_to_mask))  # first span reaching the budget
    lengths = lengths[: last + 1]
    lengths[last] = num_to_mask - (total[last - 1] if last else 0)
    return lengths


def add_whole_word_mask(
    tokens: np.ndarray, rng: np.random.Generator, spec: NoiseSpec, vocab: NoiseVocab
) -> np.ndarray:
    """Mask ``ceil(words * spec.mask)`` words in spans (see the module docstring).

    Uses ``spec.mask``, ``mask_random``, ``replace_length``, ``mask_length`` and
    ``poisson_lambda``. A span starts at a word start and covers its words and their
    continuation tokens; it stops early at a special token (``</s>`` included), which is never
    covered. Where spans overlap a token is covered once, and it is random if any covering span
    is random. With ``replace_length=1`` a span's first token becomes the ``<mask>`` (or random
    token) unless another span covers it too.

    Args:
        tokens: (L,) ``<s> ... </s>``.
        rng: source of randomness.
        spec: the noise settings.
        vocab: the tokenizer's ids.

    Returns:
        (L',) int64 new array: L' = L for ``replace_length=-1`` plus one per zero-length span;
        shorter for 0 and 1.
    """
    check_noise_spec(spec)
    out = _document(tokens, vocab)
    length = len(out)
    special = vocab.is_special(out)  # (L,) positions 0 and L-1 included
    if spec.mask_length == "subword" or vocab.is_word_start is None:
        word_start = ~special
    else:
        word_start = vocab.is_word_start[out] & ~special
    word_pos = np.flatnonzero(word_start)  # (W,)
    num_to_mask = math.ceil(len(word_pos) * spec.mask)
    if num_to_mask == 0:
        return out
    num_inserts = 0
    if spec.mask_length == "span-poisson":
        lengths = poisson_span_lengths(rng, num_to_mask, spec.poisson_lambda)
        num_inserts = int(np.count_nonzero(lengths == 0))
        lengths = lengths[lengths > 0]  # never empty: the last length is at least 1
    else:
        lengths = np.ones(num_to_mask, dtype=np.int64)
    n_spans = len(lengths)
    starts = word_pos[rng.permutation(len(word_pos))[:n_spans]]  # (S,) distinct
    is_random = rng.random(n_spans) < spec.mask_random  # (S,)

    # A span of k words ends at the k-th word start or special token after its start, and no
    # later than the first special after it. Both lists hold position L-1 (</s>).
    boundary = np.flatnonzero(word_start | special)
    barrier = np.flatnonzero(special)
    kth = np.searchsorted(boundary, starts) + lengths
    ends = np.minimum(boundary[np.minimum(kth, len(boundary) - 1)],
                      barrier[np.searchsorted(barrier, starts, side="right")])  # (S,)

    if spec.replace_length == -1:
        covered = _coverage(starts, ends, length) > 0
        randomized = covered & (_coverage(starts[is_random], ends[is_random], length) > 0)
        out[covered] = vocab.mask_id
        random_pos = np.flatnonzero(randomized)
        out[random_pos] = _random_ordinary_ids(rng, len(random_pos), vocab.vocab_size,
                                               vocab.special_ids)
    else:
        if spec.replace_length == 0:
            drop = _coverage(starts, ends, length) > 0
        else:
            drop = _coverage(starts + 1, ends, length) > 0  # all but each span's first token
            out[starts] = vocab.mask_id
            random_starts = starts[is_random]
            out[random_starts] = _random_ordinary_ids(rng, len(random_starts),
                                                      vocab.vocab_size, vocab.special_ids)
        out = out[~drop]
    if num_inserts:
        out = _insert(out, rng, num_inserts, vocab, spec.mask_random)
    return out


def delete_tokens(
    tokens: np.ndarray, rng: np.random.Generator, p: float, vocab: NoiseVocab
) -> np.ndarray:
    """Delete ``ceil(C * p)`` of the C ordinary (non-special) tokens, chosen uniformly.

    Returns:
        (L - ceil(C * p),) int64 new array; special tokens (``<mask>`` included) all stay.
    """
    _check_fraction("p", p)
    doc = _document(tokens, vocab)
    candidates = np.flatnonzero(~vocab.is_special(doc))  # (C,)
    n_delete = math.ceil(len(candidates) * p)
    keep = np.ones(len(doc), dtype=bool)
    keep[candidates[rng.permutation(len(candidates))[:n_delete]]] = False
    return doc[keep]


def _insert(
    doc: np.ndarray, rng: np.random.Generator, n: int, vocab: NoiseVocab, mask_random: float
) -> np.ndarray:
    """``doc`` with ``n`` new tokens at uniformly chosen positions strictly inside ``<s>``/``</s>``.

    ``ceil(n * mask_random)`` of them are random ordinary ids, the rest ``<mask>``. (L + n,).
    """
    total = len(doc) + n
    where = rng.permutation(total - 2)[:n] + 1  # (n,) positions in the result
    n_random = math.ceil(n * mask_random)
    is_new = np.zeros(total, dtype=bool)
    is_new[where] = True
    out = np.empty(total, dtype=np.int64)
    out[~is_new] = doc
    out[where[n_random:]] = vocab.mask_id
    out[where[:n_random]] = _random_ordinary_ids(rng, n_random, vocab.vocab_size,
                                                 vocab.special_ids)
    return out


def add_insertion_noise(
    tokens: np.ndarray, rng: np.random.Generator, p: float, vocab: NoiseVocab,
    mask_random: float,
) -> np.ndarray:
    """Insert ``ceil(L * p)`` tokens (fairseq's ``--insert``) anywhere between ``<s>`` and ``</s>``.

    Args:
        tokens: (L,) ``<s> ... </s>``.
        rng: source of randomness.
        p: inserted tokens per token of ``tokens``.
        vocab: the tokenizer's ids.
        mask_random: fraction of the inserted tokens (rounded up) that are random ordinary ids
            rather than ``<mask>``.

    Returns:
        (L + ceil(L * p),) int64 new array; the original tokens keep their order.
    """
    _check_fraction("p", p)
    _check_fraction("mask_random", mask_random)
    doc = _document(tokens, vocab)
    n = math.ceil(len(doc) * p)
    return _insert(doc, rng, n, vocab, mask_random) if n else doc


def add_rolling_buffer(tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rotate the content so that it starts at a uniformly chosen content token (``--rotate``).

    fairseq calls this ``add_rolling_noise``. ``<s>`` and ``</s>`` stay at the ends.

    Args:
        tokens: (L,) ``<s> ... </s>``.
        rng: source of randomness (one draw; none when L < 3).

    Returns:
        (L,) int64 new array.
    """
    doc = _sequence(tokens)
    if len(doc) < 3:
        return doc
    offset = int(rng.integers(1, len(doc) - 1))  # in [1, L-2]; 1 leaves the order as it is
    return np.concatenate((doc[:1], doc[offset:-1], doc[1:offset], doc[-1:]))


def noise(
    tokens: np.ndarray,
    sentence_ends: np.ndarray,
    rng: np.random.Generator,
    spec: NoiseSpec,
    vocab: NoiseVocab,
) -> np.ndarray:
    """The noised source of one document; ``tokens`` itself is the target.

    Applies, each only when its setting is non-zero: sentence permutation, masking, token
    deletion, insertion, then rotation (with probability ``spec.rotate``). The result depends
    only on the arguments and the state of ``rng``; the inputs are never modified.

    Args:
        tokens: (L,) integer ``<s> ... </s>``, L >= 2.
        sentence_ends: (M,) non-decreasing exclusive end positions of the sentences in
            ``tokens``; the first sentence starts at 1, the last ends at L-1 (M = 0 only for
            an empty document, L = 2).
        rng: normally ``bertforge.data.masking.sample_rng(seed, epoch, index)``.
        spec: the noise settings (checked with :func:`check_noise_spec`).
        vocab: the tokenizer's ids.

    Returns:
        (L',) int64 new array starting with ``<s>`` and ending with ``</s>``.
    """
    check_noise_spec(spec)
    source = _document(tokens, vocab)
    ends = _check_sentence_ends(sentence_ends, len(source))
    if spec.permute_sentences > 0:
        source = permute_sentences(source, ends, rng, spec.permute_sentences)
    if spec.mask > 0:
        source = add_whole_word_mask(source, rng, spec, vocab)
    if spec.delete > 0:
        source = delete_tokens(source, rng, spec.delete, vocab)
    if spec.insert > 0:
        source = add_insertion_noise(source, rng, spec.insert, vocab, spec.mask_random)
    if spec.rotate > 0 and rng.random() < spec.rotate:
        source = add_rolling_buffer(source, rng)
    return source
