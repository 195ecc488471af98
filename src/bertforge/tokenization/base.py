"""What every bertforge tokenizer shares: the encoded ``Window`` with its alignment, the
``BackendTokenizer`` methods over a ``tokenizers.Tokenizer``, the ``EncoderTokenizer`` windows of
encoders with a ``[CLS] A [SEP] B [SEP]`` template, and reading a tokenizer.json's vocabulary.
``wordpiece.BertTokenizer`` (BERT), ``modern.ModernBpeTokenizer`` (ModernBERT) and
``bpe.BpeTokenizer`` (BART) build on it."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence, Union

import numpy as np
from tokenizers import Tokenizer

from bertforge.core.arguments import checked
from bertforge.core.io import atomic_write
from bertforge.core.jsonfile import read_json_object as json_object
from bertforge.core.limits import setting_changed
from bertforge.errors import DataError


Text = Union[str, Sequence[str]]  # a string, or pre-split words (token classification)

# The accepted values of a tokenizer call's padding and truncation (transformers' names) and the
# strategy each means; None: do not pad / cut.
_PADDING = {False: None, "do_not_pad": None, True: "longest", "longest": "longest",
            "max_length": "max_length"}
_TRUNCATION = {False: None, "do_not_truncate": None, True: "longest_first",
               "longest_first": "longest_first", "only_first": "only_first",
               "only_second": "only_second"}
_TENSORS = (None, "pt", "np")


class BatchEncoding(dict):
    """What calling a tokenizer returns: ``input_ids``, ``attention_mask`` (BERT: and
    ``token_type_ids``; ``offset_mapping`` when asked) as a dict whose keys also read as
    attributes (``enc.input_ids``), like transformers' BatchEncoding; ``**enc`` feeds a model."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no {name!r}; it has "
                                 f"{', '.join(self)}") from None

    def to(self, device: Any) -> BatchEncoding:
        """The same encoding with its tensors on ``device`` (return_tensors="pt")."""
        return BatchEncoding({k: v.to(device) if hasattr(v, "to") else v
                              for k, v in self.items()})


def _texts(value: Any, name: str) -> list[str]:
    """``value`` (a string or a list of strings) as a list; ``TypeError`` for anything else."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"{name} must be a string or a list of strings, got "
                        f"{type(value).__name__}")
    return list(values)


def _choice(value: Any, table: dict, name: str) -> str | None:
    """The strategy of a padding or truncation argument; ``ValueError`` naming the choices."""
    if isinstance(value, (bool, str)) and value in table:
        return table[value]
    choices = ", ".join(repr(k) for k in table)
    raise ValueError(f"{name}={value!r} is not one of {choices}")


def _padded(rows: list[list], width: int, fill: Any) -> list[list]:
    return [row + [fill] * (width - len(row)) for row in rows]

@dataclass(frozen=True)
class Window:
    """One encoded sequence (or one overflowing window of a long input) with its alignment.

    Fine-tuning needs more than ids: QA maps answer characters to tokens through ``offsets`` and
    keeps only context tokens as answer candidates (``sequence_ids``); token classification
    labels the first sub-token of each word (``word_ids``).
    """

    ids: list[int]
    type_ids: list[int]
    offsets: list[tuple[int, int]]     # character span in its own text (or word); (0, 0): special
    sequence_ids: list[int | None]     # 0: first text, 1: second text, None: [CLS]/[SEP]
    word_ids: list[int | None]         # index of the word in its text; None for specials
    source: int                        # index of the input (pair) this window was cut from

    def word_spans(self, text: str | None = None) -> dict[int, tuple[int, int]]:
        """Each word's first and last token position, by its word id, for the words that have
        a token here: a word the tokenizer keeps nothing of (a lone combining accent in an
        uncased vocabulary) or cut off by the window's end is absent, so a word's tag is read
        from its own first sub-token and never from a neighbour's. With ``text`` (what the
        offsets point into), a token of white space only is no part of a word: byte-level BPE
        makes a lone "Ġ" of the second of two spaces and counts it with the next word, whose
        first sub-token is then its first letters, as when the word is encoded alone. For a
        window of one text (a pair's second text numbers its words from 0 again)."""
        spans: dict[int, tuple[int, int]] = {}
        for t, word in enumerate(self.word_ids):
            if word is None:
                continue
            if text is not None and not text[self.offsets[t][0]:self.offsets[t][1]].strip():
                continue
            spans[word] = (spans[word][0], t) if word in spans else (t, t)
        return spans

class BackendTokenizer:
    """What every bertforge tokenizer does through its ``tokenizers.Tokenizer`` (``backend``):
    encoding, decoding and id/token lookups. ``BertTokenizer`` (WordPiece) and
    ``bertforge.tokenization.bpe.BpeTokenizer`` (byte-level BPE) add their pipelines and files."""

    backend: Tokenizer
    vocab: tuple[str, ...]
    unk_id: int
    pad_id: int
    model_max_length: int
    model_input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    """What calling the tokenizer returns by default, as transformers' tokenizer of the model."""

    @contextmanager
    def _truncating(self, max_length: int, stride: int, strategy: str) -> Iterator[None]:
        self.backend.enable_truncation(max_length, stride=stride, strategy=strategy)
        try:
            yield
        finally:
            self.backend.no_truncation()

    @checked
    def __call__(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None,
                 *, add_special_tokens: bool = True, padding: bool | str = False,
                 truncation: bool | str | None = None, max_length: int | None = None,
                 pad_to_multiple_of: int | None = None, return_tensors: str | None = None,
                 return_token_type_ids: bool | None = None,
                 return_attention_mask: bool | None = None,
                 return_offsets_mapping: bool = False) -> BatchEncoding:
        """Encode a text (or pair), or a list of them, as transformers' tokenizers do.

        ``padding``: False, True/"longest" (to the longest in the list) or "max_length".
        ``truncation``: False, True/"longest_first", "only_first" or "only_second"; None (the
        default) cuts only when ``max_length`` is given and ``padding`` is False.
        ``max_length`` defaults to ``model_max_length`` where padding or truncation need one.
        ``return_tensors``: None (lists), "pt" (torch) or "np"; tensors keep a batch dimension
        even for one text. One text without tensors gives flat lists, a list gives lists of them.
        """
        pad, cut = _choice(padding, _PADDING, "padding"), _choice(
            truncation if truncation is not None else max_length is not None and not padding,
            _TRUNCATION, "truncation")
        if return_tensors not in _TENSORS:
            raise ValueError(f"return_tensors={return_tensors!r} is not one of None, 'pt', 'np'")
        single = isinstance(text, str)
        texts = _texts(text, "text")
        pairs = None if text_pair is None else _texts(text_pair, "text_pair")
        if pairs is not None and (isinstance(text_pair, str) != single or len(pairs) != len(texts)):
            raise ValueError(f"text_pair must match text: one string each, or lists of the same "
                             f"length (got {len(texts)} texts and {len(pairs)} pairs)")
        limit = max_length if max_length is not None else self.model_max_length
        if cut and pad and pad_to_multiple_of and limit % pad_to_multiple_of:
            raise ValueError(f"max_length={limit} is not a multiple of pad_to_multiple_of="
                             f"{pad_to_multiple_of}: padding would go past the cut")
        encodings = self._encode_calls(texts, pairs, add_special_tokens, cut and limit, cut)
        wanted = {"input_ids": True,  # in transformers' order
                  "token_type_ids": return_token_type_ids if return_token_type_ids is not None
                  else "token_type_ids" in self.model_input_names,
                  "attention_mask": return_attention_mask is not False,
                  "offset_mapping": return_offsets_mapping}
        rows = {name: [_FIELDS[name](e) for e in encodings] for name, keep in wanted.items()
                if keep}
        if pad is not None and encodings:
            width = max(map(len, rows["input_ids"])) if pad == "longest" else limit
            if pad_to_multiple_of:
                width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
            fills = {"input_ids": self.pad_id, "offset_mapping": (0, 0)}
            rows = {k: _padded(v, width, fills.get(k, 0)) for k, v in rows.items()}
        return BatchEncoding({k: _as_tensor(v, return_tensors, k) if return_tensors
                              else v[0] if single else v for k, v in rows.items()})

    def _encode_calls(self, texts: list[str], pairs: list[str] | None, special: bool,
                      max_length: int | None, strategy: str | None) -> list[Any]:
        """The backend's encodings of the texts (pairs), cut to ``max_length`` by ``strategy``."""
        inputs = texts if pairs is None else list(zip(texts, pairs))
        if not strategy:
            return self.backend.encode_batch(inputs, add_special_tokens=special)
        try:
            with self._truncating(max_length, 0, strategy):
                return self.backend.encode_batch(inputs, add_special_tokens=special)
        except Exception as exc:  # tokenizers raises a bare Exception when it cannot cut
            raise ValueError(f"cannot truncate to max_length={max_length} with {strategy}: "
                             f"{exc}") from None

    def word_bounds(self, text: str, start: int, end: int) -> tuple[int, int]:
        """Characters [start, end) of ``text`` widened to whole words: a span that begins or
        ends inside a word of the tokenizer's pre-tokenization (BERT: words split at whitespace
        and punctuation, each CJK character one word) is extended to that word's edge."""
        lo, hi = start, end  # the whitespace-delimited stretch around the span: words stay whole
        while lo > 0 and not text[lo - 1].isspace():
            lo -= 1
        while hi < len(text) and not text[hi].isspace():
            hi += 1
        enc = self.backend.encode(text[lo:hi], add_special_tokens=False)
        words: dict[int, list[int]] = {}  # word -> [first character, end], in text[lo:hi]
        for word, (a, b) in zip(enc.word_ids, enc.offsets):
            if word is not None:
                span = words.setdefault(word, [a, b])
                span[0], span[1] = min(span[0], a), max(span[1], b)
        for a, b in words.values():
            if lo + a < start < lo + b:
                start = lo + a
            if lo + a < end < lo + b:
                end = lo + b
        return start, end

    def save_tokenizer_json(self, path: str | Path) -> None:
        """Write the whole pipeline as a ``tokenizers`` JSON file, atomically."""
        atomic_write(path, lambda tmp: self.backend.save(str(tmp), pretty=True))

    def encode(self, text: str, pair: str | None = None) -> list[int]:
        """Ids of ``text`` (and ``pair``) with the special tokens of the model's template."""
        return self.backend.encode(text, pair, add_special_tokens=True).ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = False
    ) -> list[list[int]]:
        """Ids of many texts at once (parallel in Rust); no special tokens by default."""
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def tokenize(self, text: str) -> list[str]:
        """Tokens of ``text`` (WordPiece pieces, or byte-level ones where "Ġ" spells a space),
        without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text from ids (WordPiece "##" pieces glued to their word; byte-level bytes that do not
        form valid UTF-8 become U+FFFD)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(
        self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True
    ) -> list[str]:
        """``decode`` of many id sequences at once (parallel in Rust)."""
        return self.backend.decode_batch([list(s) for s in sequences],
                                         skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Vocabulary entry of each id (``IndexError`` for an id outside the vocabulary)."""
        return [self.vocab[i] for i in ids]

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        """Id of each vocabulary entry; tokens not in the vocabulary map to ``unk_id``."""
        ids = (self.backend.token_to_id(t) for t in tokens)
        return [self.unk_id if i is None else i for i in ids]

class EncoderTokenizer(BackendTokenizer):
    """A tokenizer of an encoder with a ``[CLS] A [SEP] B [SEP]`` template (BERT's WordPiece,
    ModernBERT's byte-level BPE): windows with their alignment for fine-tuning (QA,
    classification, tagging) and their padded model inputs. ``cls_id``/``sep_id``/``mask_id``
    name its special tokens."""

    cls_id: int
    sep_id: int
    mask_id: int

    def encode_windows(
        self,
        first: Sequence[Text],
        second: Sequence[Text] | None = None,
        *,
        max_length: int,
        stride: int = 0,
        truncation: str = "longest_first",
        overflow: bool = False,
        is_pretokenized: bool = False,
    ) -> list[Window]:
        """Encode many texts (or pairs) with special tokens, truncated to ``max_length`` tokens.

        ``truncation``: ``longest_first`` (trim the longer text of a pair token by token),
        ``only_first`` or ``only_second`` (QA: the question is kept whole, the context cut).
        With ``overflow`` the cut-off tokens are not dropped but continue in further windows,
        each repeating the last ``stride`` tokens of the previous one, so every token is seen
        with some context on both sides. Windows come out grouped by input, in order, and
        ``Window.source`` names their input. ``is_pretokenized``: each text is a list of words.
        """
        if second is not None and len(second) != len(first):
            raise ValueError(f"first and second must have the same length, got {len(first)} "
                             f"and {len(second)}")
        if max_length < 3 + (second is not None):
            raise ValueError(f"max_length must leave room for special tokens, got {max_length}")
        if stride < 0:
            raise ValueError(f"stride must be >= 0, got {stride}")
        inputs = list(first) if second is None else list(zip(first, second))
        if not inputs:
            return []
        with self._truncating(max_length, stride if overflow else 0, truncation):
            encodings = self.backend.encode_batch(inputs, is_pretokenized=is_pretokenized,
                                                  add_special_tokens=True)
        windows: list[Window] = []
        for source, enc in enumerate(encodings):
            for part in [enc] + (list(enc.overflowing) if overflow else []):
                windows.append(Window(ids=part.ids, type_ids=part.type_ids, offsets=part.offsets,
                                      sequence_ids=part.sequence_ids, word_ids=part.word_ids,
                                      source=source))
        return windows

    def pad_windows(self, windows: Sequence[Window], width: int) -> dict[str, np.ndarray]:
        """``input_ids`` (padded with [PAD]), ``token_type_ids`` and ``attention_mask`` of
        ``windows`` as (N, width) int64 arrays, the model inputs of fine-tuning (a model without
        token types, ModernBERT, takes the ones its tokenizer's ``model_input_names`` name)."""
        n = len(windows)
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        for i, w in enumerate(windows):  # a loop over sequences; tokens are copied as slices
            size = len(w.ids)
            ids[i, :size], types[i, :size], mask[i, :size] = w.ids, w.type_ids, 1
        return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """``text`` cut after its first ``max_tokens`` tokens (at a character offset), so
        that it can be encoded again whole; unchanged when it is short enough."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        offsets = self.backend.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= max_tokens:
            return text
        return text[: offsets[max_tokens - 1][1]]

_FIELDS = {"input_ids": lambda e: e.ids, "attention_mask": lambda e: e.attention_mask,
           "token_type_ids": lambda e: e.type_ids, "offset_mapping": lambda e: e.offsets}


def _as_tensor(rows: list[list], kind: str, name: str) -> Any:
    """``rows`` as one (B, L[, 2]) int64 array ("np") or tensor ("pt"); ``ValueError`` when
    their lengths differ (pad them)."""
    if len({len(r) for r in rows}) > 1:
        raise ValueError(f"cannot make one tensor of {name}: the sequences have different "
                         f"lengths; pass padding=True")
    array = np.array(rows, dtype=np.int64)
    if kind == "np":
        return array
    import torch  # only when tensors are asked for: tokenizing does not need torch

    return torch.from_numpy(array)


def read_json_object(path: Path) -> dict:
    """A tokenizer file's JSON object (``bertforge.core.jsonfile``: a byte-order mark accepted,
    errors at ``FILE:LINE:COLUMN``, a key given twice refused with both places)."""
    return json_object(path, error=DataError, hint="is it the right file?")


# A length at or past this is no real limit: transformers saves int(1e30) when a tokenizer
# was made without one, which most tokenizers on the Hub were.
NO_LIMIT = 10**9


def saved_max_length(config: dict, default: int, source: Path) -> int:
    """The ``model_max_length`` a tokenizer_config.json (``config``, read from ``source``)
    gives, or ``default`` when it gives none; a value that is no usable length is replaced by
    ``default``, and that is said once: at info level for transformers' "no limit" number (the
    normal value, nothing to fix), as a warning for one that is no length at all (not a whole
    number, below 1)."""
    value = config.get("model_max_length", default)
    if type(value) is int and 0 < value < NO_LIMIT:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= NO_LIMIT:
        setting_changed(f"{source}: model_max_length", value, default,
                        "transformers' mark of no limit", level=logging.INFO)
    else:
        setting_changed(f"{source}: model_max_length", value, default, "not a length in tokens")
    return default


def tokens_in_id_order(path: Path, ids: dict[str, int]) -> list[str]:
    """The tokens of a ``{token: id}`` vocabulary in id order; ``DataError`` naming both tokens
    of an id given twice, and the first id missing, unless the ids are 0..n-1, each once."""
    by_id: dict[int, str] = {}
    for token, i in ids.items():
        if i in by_id:
            raise DataError(f"{path}: tokens {by_id[i]!r} and {token!r} both have id {i}; each "
                            "id must name one token (the file is damaged)")
        by_id[i] = token
    if not by_id:
        raise DataError(f"{path}: the vocabulary is empty; build one with `bertforge vocab`")
    missing = next((i for i in range(len(by_id)) if i not in by_id), None)
    if missing is not None:
        raise DataError(f"{path}: token ids are not 0..{len(by_id) - 1} without gaps (no token "
                        f"has id {missing}); the file is damaged")
    return [by_id[i] for i in range(len(by_id))]


def tokenizer_json_tokens(path: Path, data: dict) -> list[str]:
    """Tokens in id order of a tokenizer.json's model vocabulary (``{token: id}``, checked by the
    caller) and its added tokens; ``DataError`` unless the ids are 0..n-1, each once (an added
    token may repeat a vocabulary entry with its id, as transformers writes specials)."""
    vocab = data["model"]["vocab"]
    added = [a for a in data.get("added_tokens") or [] if isinstance(a, dict)]
    if not all(type(i) is int for i in [*vocab.values(), *(a.get("id") for a in added)]):
        raise DataError(f"{path}: a token id is not an integer; the file is damaged")
    ids = dict(vocab)
    for token in added:
        content, i = token.get("content"), token["id"]
        if not isinstance(content, str):
            raise DataError(f"{path}: added token {i} has no text (content); the file is damaged")
        if ids.get(content, i) != i:
            raise DataError(f"{path}: token {content!r} has id {ids[content]} in the vocabulary "
                            f"and id {i} in added_tokens; the file is damaged")
        if content not in ids:
            ids[content] = i
    return tokens_in_id_order(path, ids)
