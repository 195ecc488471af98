"""BERT WordPiece tokenizer on top of the `tokenizers` library: the vocabulary files (vocab.txt,
a WordPiece tokenizer.json), their casing checks, and ``BertTokenizer``.

The pipeline is exactly BERT's: BertNormalizer (clean control characters, space out CJK
characters, and for uncased models lower-case and strip accents), BertPreTokenizer (split on
whitespace and punctuation), greedy longest-match WordPiece with "##" continuations and [UNK]
for words over 100 characters, and the "[CLS] A [SEP] B [SEP]" template. Special-token ids are
always looked up, never assumed: our trained vocabularies put them at 0..4, Google's at
0 and 100..103.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from bertforge.core.arguments import checked
from bertforge.core.io import write_json_atomic, write_text_atomic
from bertforge.core.paths import check_path_text
from bertforge.errors import DataError
from bertforge.tokenization.base import (EncoderTokenizer, read_json_object, saved_max_length,
                                         tokenizer_json_tokens)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

MAX_INPUT_CHARS_PER_WORD = 100

_CASED_MIN_TOKENS = 10  # below this many upper-case tokens we do not call a vocabulary cased

def vocab_hash(tokens: Sequence[str]) -> str:
    """SHA-256 of the tokens in id order (the vocab.txt bytes): the identity of a vocabulary,
    recorded in prepared data's manifest and compared with every checkpoint's."""
    return hashlib.sha256(("\n".join(tokens) + "\n").encode("utf-8")).hexdigest()

def read_vocab_txt(path: str | Path) -> list[str]:
    """Tokens of a vocab.txt (one per line, line number = id), validated."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"vocabulary file {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory; pass the vocab.txt inside it") from None
    except OSError as exc:
        raise DataError(f"cannot read vocabulary file {path}: {exc.strerror}") from None
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    tokens: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        try:
            token = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            raise DataError(f"{path}:{lineno}: not valid UTF-8; vocab.txt must be UTF-8") from None
        if not token:
            raise DataError(f"{path}:{lineno}: empty line; vocab.txt has one token on every line")
        if " " in token or "\t" in token:
            raise DataError(
                f"{path}:{lineno}: token {token!r} contains a space or tab; a vocab.txt holds one "
                "token per line and nothing else (is this a word-count or SentencePiece file?)"
            )
        if token in seen:
            raise DataError(
                f"{path}:{lineno}: token {token!r} repeats line {seen[token]}; each token once"
            )
        seen[token] = lineno
        tokens.append(token)
    if not tokens:
        raise DataError(f"vocabulary file {path} is empty; build one with `bertforge vocab`")
    return tokens

def vocab_casing(vocab_tokens: Sequence[str]) -> str | None:
    """"cased", "uncased", or None when the tokens do not tell (caseless scripts, few acronyms)."""
    words = [t for t in vocab_tokens if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(any(ch.isupper() for ch in t) for t in words)
    if upper >= max(_CASED_MIN_TOKENS, len(words) // 100):
        return "cased"
    if upper == 0 and any(ch.islower() for t in words for ch in t):
        return "uncased"
    return None

def check_casing(vocab_tokens: Sequence[str], do_lower_case: bool, source: str) -> None:
    """Raise ``DataError`` when lower-casing does not fit the vocabulary's casing.

    A vocabulary with many upper-case tokens was built from cased text: lower-casing the input
    makes those tokens unreachable. One with lower-case letters but no upper-case token was
    built from lower-cased text: keeping case sends every capitalised word to rare pieces.
    """
    casing = vocab_casing(vocab_tokens)
    if do_lower_case and casing == "cased":
        upper = [t for t in vocab_tokens if any(ch.isupper() for ch in t) and t[:1] != "["]
        whole = [t for t in upper if not t.startswith("##")] or upper  # whole words read best
        raise DataError(
            f"{source}: the vocabulary is cased ({len(upper)} tokens have upper-case letters, "
            f"e.g. {', '.join(repr(t) for t in whole[:3])}) but lower-casing is on, so those "
            "tokens could never be used. Keep case (lowercase=False, --cased) or use an "
            "uncased vocabulary."
        )
    if not do_lower_case and casing == "uncased":
        raise DataError(
            f"{source}: the vocabulary is uncased (no token has an upper-case letter) but "
            "lower-casing is off, so capitalised words would become [UNK] or rare pieces. "
            "Lower-case the input (lowercase=True, drop --cased) or use a cased vocabulary."
        )

def _bert_normalizer(lowercase: bool) -> normalizers.Normalizer:
    # BERT strips accents exactly when it lower-cases; cased models keep both.
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )

def _wordpiece(vocab: dict[str, int] | None) -> WordPiece:
    return WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)

class BertTokenizer(EncoderTokenizer):
    """WordPiece tokenizer with BERT's normalization; a thin layer over ``tokenizers.Tokenizer``."""

    model_input_names = ("input_ids", "token_type_ids", "attention_mask")

    @checked
    def __init__(
        self,
        vocab_tokens: Sequence[str],
        do_lower_case: bool = True,
        model_max_length: int = 512,
        source: str = "vocabulary",
    ) -> None:
        missing = [t for t in SPECIAL_TOKENS if t not in set(vocab_tokens)]
        if missing:
            raise DataError(
                f"{source}: special token(s) {', '.join(missing)} missing from the vocabulary; "
                f"a BERT vocabulary needs all of {' '.join(SPECIAL_TOKENS)} (add them as lines, "
                "or build the vocabulary with `bertforge vocab`)"
            )
        self.vocab: tuple[str, ...] = tuple(vocab_tokens)  # tokens in id order
        self.vocab_size = len(self.vocab)
        self.do_lower_case = bool(do_lower_case)
        self.model_max_length = int(model_max_length)
        vocab = {token: i for i, token in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            vocab[t] for t in SPECIAL_TOKENS
        )
        backend = Tokenizer(_wordpiece(vocab))
        backend.normalizer = _bert_normalizer(self.do_lower_case)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        backend.decoder = decoders.WordPiece(prefix="##")
        # Registered as special so that "[MASK]" typed in text is one token, as in transformers.
        backend.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
        )
        self.backend = backend
        # [vocab_size] bool: "##" pieces, which whole-word masking keeps with their word.
        self.is_continuation = np.array([t.startswith("##") for t in self.vocab], dtype=bool)
        self.vocab_hash = vocab_hash(self.vocab)

    # -- loading and saving --------------------------------------------------------------------

    @classmethod
    @checked
    def from_file(cls, path: str | Path, lowercase: bool | None = None) -> BertTokenizer:
        """Load a vocab.txt or a WordPiece tokenizer.json.

        ``lowercase=None`` takes the casing from tokenizer.json, or for a vocab.txt guesses it
        from the tokens (uncased unless the vocabulary is clearly cased). An explicit value is
        checked against the vocabulary with ``check_casing``.
        """
        check_path_text(path, f"{cls.__name__}.from_file(path)")
        path = Path(path)
        if path.suffix == ".json":
            tokens, stored_lower = _read_tokenizer_json(path)
        else:
            tokens, stored_lower = read_vocab_txt(path), None
        if lowercase is not None:
            check_casing(tokens, lowercase, str(path))
            do_lower = lowercase
        else:
            do_lower = vocab_casing(tokens) != "cased" if stored_lower is None else stored_lower
        return cls(tokens, do_lower_case=do_lower, source=str(path))

    @classmethod
    @checked
    def from_pretrained(cls, directory: str | Path, lowercase: bool | None = None) -> BertTokenizer:
        """Load a directory written by ``save`` or by transformers (tokenizer.json or vocab.txt).

        Casing comes from tokenizer_config.json's ``do_lower_case`` (else tokenizer.json, else
        the tokens). A ``lowercase`` that contradicts it is checked against the vocabulary:
        ``DataError`` if it does not fit, otherwise it wins.
        """
        check_path_text(directory, f"{cls.__name__}.from_pretrained(directory)")
        directory = Path(directory)
        if not directory.is_dir():
            raise DataError(f"tokenizer directory {directory} does not exist; check the path")
        config_path = directory / "tokenizer_config.json"
        config = read_json_object(config_path) if config_path.exists() else {}
        found = _directory_tokens(directory)
        if found is None:
            raise DataError(
                f"{directory} has neither tokenizer.json nor vocab.txt; is it a model directory?"
            )
        tokens, stored_lower = found
        if isinstance(config.get("do_lower_case"), bool):
            stored_lower = config["do_lower_case"]
        if stored_lower is None:
            stored_lower = vocab_casing(tokens) != "cased"
        if lowercase is not None and lowercase != stored_lower:
            source = f"{directory} was saved with do_lower_case={stored_lower}, not {lowercase}"
            check_casing(tokens, lowercase, source)
            stored_lower = lowercase
        max_len = saved_max_length(config, 512, config_path)
        return cls(tokens, stored_lower, model_max_length=max_len, source=str(directory))

    def save(self, directory: str | Path) -> None:
        """Write vocab.txt, tokenizer.json, tokenizer_config.json and special_tokens_map.json.

        transformers' AutoTokenizer and BertTokenizerFast load the directory as they are.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.save_vocab(directory / "vocab.txt")
        self.save_tokenizer_json(directory / "tokenizer.json")
        names = {f"{t[1:-1].lower()}_token": t for t in SPECIAL_TOKENS}  # "pad_token": "[PAD]"
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.do_lower_case,
            "tokenize_chinese_chars": True,
            "strip_accents": None,  # None = follow do_lower_case, which is BERT's rule
            "model_max_length": self.model_max_length,
            "clean_up_tokenization_spaces": True,
            **names,
        }
        files = {"tokenizer_config.json": config, "special_tokens_map.json": names}
        for name, payload in files.items():
            write_json_atomic(directory / name, payload, sort_keys=False, ensure_ascii=False)

    def save_vocab(self, path: str | Path) -> None:
        """Write vocab.txt (one token per line, in id order) atomically."""
        write_text_atomic(path, "\n".join(self.vocab) + "\n")

def _directory_tokens(directory: Path) -> tuple[list[str], bool | None] | None:
    """(tokens, lowercase flag or None) of a directory's tokenizer.json, else its vocab.txt."""
    json_path, txt_path = directory / "tokenizer.json", directory / "vocab.txt"
    if json_path.exists():
        return _read_tokenizer_json(json_path)
    if txt_path.exists():
        return read_vocab_txt(txt_path), None
    return None

def _read_tokenizer_json(path: Path) -> tuple[list[str], bool | None]:
    """(tokens in id order, lowercase flag of its BertNormalizer or None) of a WordPiece
    tokenizer.json; ``DataError`` for any other model type."""
    data = read_json_object(path)
    model = data.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "WordPiece" or not isinstance(model.get("vocab"), dict):
        raise DataError(
            f"{path}: model type is {kind!r}, not a WordPiece vocabulary; "
            "BERT needs a WordPiece tokenizer.json or a vocab.txt"
        )
    normalizer = data.get("normalizer") or {}
    lower = normalizer.get("lowercase") if normalizer.get("type") == "BertNormalizer" else None
    return tokenizer_json_tokens(path, data), lower
