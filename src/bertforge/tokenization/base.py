"""What every bertforge tokenizer shares: the encoded ``Window`` with its alignment, the
``BackendTokenizer`` methods over a ``tokenizers.Tokenizer``, and reading a tokenizer.json's
vocabulary. ``wordpiece.BertTokenizer`` (BERT) and ``bpe.BpeTokenizer`` (BART) build on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

from tokenizers import Tokenizer

from bertforge.core.io import atomic_write
from bertforge.errors import DataError


Text = Union[str, Sequence[str]]  # a string, or pre-split words (token classification)

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

class BackendTokenizer:
    """What every bertforge tokenizer does through its ``tokenizers.Tokenizer`` (``backend``):
    encoding, decoding and id/token lookups. ``BertTokenizer`` (WordPiece) and
    ``bertforge.tokenization.bpe.BpeTokenizer`` (byte-level BPE) add their pipelines and files."""

    backend: Tokenizer
    vocab: tuple[str, ...]
    unk_id: int

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

def read_json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path} does not exist; check the path") from None
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; is it the right file?") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object at the top level")
    return data

def tokenizer_json_tokens(path: Path, data: dict) -> list[str]:
    """Tokens in id order of a tokenizer.json's model vocabulary (``{token: id}``, checked by the
    caller) and its added tokens; ``DataError`` unless the ids are 0..n-1, each once."""
    vocab = data["model"]["vocab"]
    added = [a for a in data.get("added_tokens") or [] if isinstance(a, dict)]
    if not all(type(i) is int for i in [*vocab.values(), *(a.get("id") for a in added)]):
        raise DataError(f"{path}: a token id is not an integer; the file is damaged")
    by_id = {i: t for t, i in vocab.items()}
    for token in added:
        by_id.setdefault(token["id"], token.get("content"))
    if not by_id:
        raise DataError(f"{path}: the vocabulary is empty; build one with `bertforge vocab`")
    # Two tokens sharing an id collapse into one entry of by_id, leaving fewer ids than tokens.
    if len(by_id) < len(vocab) or sorted(by_id) != list(range(len(by_id))):
        raise DataError(
            f"{path}: token ids are not 0..{len(by_id) - 1} without gaps; the file is damaged"
        )
    return [by_id[i] for i in range(len(by_id))]
