"""Tokenizing no more of a long text than a token limit needs.

A model reads at most ``max_length`` tokens of an input, so tokenizing all of a 100,000-character
text to keep its first 512 tokens does some 20,000 tokens of work (and builds their offsets as
Python lists) for 512 kept; a server does it on the one thread every request's text goes
through. Here a long text is tokenized by prefixes instead: its first ``limit x 8`` characters,
then 4 times more each time, until the prefix holds more tokens than the limit or is the whole
text. The work is bounded by the limit, not by the text: ordinary words take 4 to 6 characters
a token, so the first prefix almost always settles it; text of few tokens per character (long
runs of spaces, words the vocabulary does not know) grows the prefix a few times.

A prefix is cut at whitespace where it can be, and there it tokenizes exactly as the start of the
whole text does: normalizers work character by character, and every pre-tokenizer in use (BERT's
split at whitespace and punctuation, the byte-level BPE and ModernBERT expressions) ends a word
at whitespace, so the words before the cut, their tokens and their offsets are the same. Text
with no whitespace to cut at (Chinese or Japanese, say) is cut inside a word instead, where an
encoder's tokenizer reports words: then only the tokens of the words before the prefix's last
one (which the cut may have split) are taken as the whole text's, and the prefix grows until
those are enough. BERT makes each CJK character a word of its own, so such a text costs what a
spaced one does. A single word longer than the prefix (a byte-level BPE tokenizer reads a run of
CJK characters as one word) is tokenized whole: its size is bounded by the server's
``--max-text-chars``, not by the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

FIRST_CHARS_PER_TOKEN = 8
"""The first prefix's characters per token of the limit (twice a word-piece's usual 4)."""
GROWTH = 4
"""How much longer each next prefix is: the work of all prefixes stays under 4/3 of the last."""
_SPACES = " \t\n\r"
_UNCUT = 1 << 30  # a max_length no text reaches: encode a prefix whole, to count it


def text_prefix(text: str, chars: int, *, inside_words: bool = False) -> str:
    """``text`` cut at its last whitespace within the first ``chars`` characters; when there is
    none before, at ``chars`` itself with ``inside_words``, else at its first whitespace after
    them (the whole text when it has none). The whole text when it is no longer than ``chars``."""
    if len(text) <= chars:
        return text
    cut = max(text.rfind(space, 0, chars + 1) for space in _SPACES)
    if cut <= 0 and inside_words:
        return text[:chars]
    if cut <= 0:
        later = [i for space in _SPACES if (i := text.find(space, chars)) > 0]
        cut = min(later) if later else len(text)
    return text[:cut]


@dataclass(frozen=True)
class Capped:
    """An input tokenized only as far as its limit needs (see the module notes)."""

    tokens: Any
    """Its window (an encoder's tokenizer) or ids (BART's), cut to the limit."""
    length: int
    """Its tokens, special tokens included: of the whole input when ``counted``, else of the
    prefix tokenized, a lower bound that is over the limit."""
    counted: bool


def encode_window_capped(tokenizer: Any, text: str, pair: str | None,
                         max_length: int) -> Capped:
    """The window of ``text`` (and ``pair``) cut to ``max_length`` tokens as the tokenizer's
    own longest-first truncation cuts the whole input, tokenizing prefixes only (``tokenizer``:
    an :class:`~bertforge.tokenization.base.EncoderTokenizer`). The prefixes are tokenized
    without truncation and cut here: the tokenizer's truncation would also build every
    overflowing window of a pair, as many as the product of both texts' windows."""
    texts = (text,) if pair is None else (text, pair)
    chars = max_length * FIRST_CHARS_PER_TOKEN
    while True:
        parts = [text_prefix(t, chars, inside_words=True) for t in texts]
        window = tokenizer.encode_windows([parts[0]], parts[1:] or None, max_length=_UNCUT)[0]
        cut = [len(p) < len(t) for p, t in zip(parts, texts)]
        counts = [_sure_tokens(window, i, cut[i]) for i in range(len(texts))]
        specials = sum(1 for s in window.sequence_ids if s is None)
        if _settled(counts, cut, max_length - specials):
            break
        chars *= GROWTH
    length = sum(counts) + specials if any(cut) else len(window.ids)
    if length > max_length:
        window = _keep_first(window, _longest_first(counts, max_length - specials))
    return Capped(window, length, not any(cut))


def _longest_first(counts: list[int], room: int) -> list[int]:
    """How many tokens of each text longest-first truncation keeps, for texts of ``counts``
    tokens and ``room`` for them in all: a lone text its first ``room``; of a pair, the shorter
    keeps what it has, up to half the room, and the longer the rest; when both are over half,
    each keeps half and the longer the odd token (the second, when they are equal). The rule of
    the ``tokenizers`` library, which the tests compare with it."""
    if len(counts) == 1:
        return [min(counts[0], room)]
    if sum(counts) <= room:
        return list(counts)
    first, second = counts
    swap = first > second
    short, long_ = (second, first) if swap else (first, second)
    long_ = short if short > room else max(short, room - short)
    if short + long_ > room:
        short = room // 2
        long_ = short + room % 2
    return [long_, short] if swap else [short, long_]


def _keep_first(window: Any, keep: list[int]) -> Any:
    """``window`` with only the first ``keep[i]`` tokens of text ``i`` (special tokens kept)."""
    seen = [0] * len(keep)
    chosen = []
    for t, seq in enumerate(window.sequence_ids):
        if seq is None:
            chosen.append(t)
        elif seen[seq] < keep[seq]:
            seen[seq] += 1
            chosen.append(t)
    return dataclasses.replace(window, **{
        name: [getattr(window, name)[t] for t in chosen]
        for name in ("ids", "type_ids", "offsets", "sequence_ids", "word_ids")})


def _sure_tokens(window: Any, text: int, cut: bool) -> int:
    """How many of the first tokens of text ``text`` (0 or 1 of a pair) in ``window`` are the
    whole text's too: all of them when it was not cut, else those before the prefix's last word
    (a cut inside it gives that word other tokens)."""
    words = [w for s, w in zip(window.sequence_ids, window.word_ids) if s == text]
    if not cut or not words:
        return len(words)
    return sum(1 for w in words if w != words[-1])


def _settled(counts: list[int], cut: list[bool], room: int) -> bool:
    """Whether the prefixes' first tokens are those the whole input would be cut to.

    A cut text must hold more tokens than the room by itself: longest-first truncation of a
    pair compares the two texts' lengths, and a cut text's true length is only known to be
    more than what its prefix holds. When both texts are over the room, each keeps half of it
    and the longer one the odd token (the second one when they are equal): that needs their
    order, which a cut text leaves open unless its prefix already beats the other whole text.
    """
    if not any(cut):
        return True
    if any(c and n <= room for c, n in zip(cut, counts)):
        return False
    if len(counts) == 1 or room % 2 == 0:
        return True
    (a, b), (cut_a, cut_b) = counts, cut
    if cut_a and cut_b:
        return False
    if cut_a:
        return b <= room or a > b
    return a <= room or b > a


def encode_ids_capped(tokenizer: Any, text: str, max_length: int) -> Capped:
    """``<s> text </s>`` ids cut to ``max_length`` (the end of a long text dropped), tokenizing
    prefixes only (``tokenizer``: BART's :class:`~bertforge.tokenization.bpe.BpeTokenizer`)."""
    chars = max_length * FIRST_CHARS_PER_TOKEN
    while True:
        part = text_prefix(text, chars)
        length = len(tokenizer.encode(part))
        if length > max_length or len(part) == len(text):
            break
        chars *= GROWTH
    ids = tokenizer.encode_truncated([part], max_length)[0]
    return Capped(ids, length, len(part) == len(text))


__all__ = ["Capped", "FIRST_CHARS_PER_TOKEN", "GROWTH", "encode_ids_capped",
           "encode_window_capped", "text_prefix"]
