"""Byte-level BPE tokenizer for BART (the scheme of GPT-2 and RoBERTa) on top of `tokenizers`.

Text is first split GPT-2's way (words with their leading space, digits, punctuation runs) and
each piece is written as bytes, every byte shown as one printable character ("Ġ" is a space,
"Ċ" a newline). BPE merges then join those characters, so with all 256 byte symbols in the
vocabulary (every trained one has them) any input is representable and nothing becomes <unk>.
Sequences are "<s> A </s>" and "<s> A </s></s> B </s>".

BART's special tokens are <s> <pad> </s> <unk> <mask>. Their ids are always looked up, never
assumed: BART's own vocabulary has <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask>=50264 (last), while
the vocabularies ``bertforge.tokenization.training.train_bpe`` writes put the five first, ids 0..4. <mask> eats
the space before it (as in transformers), so "a <mask> b" is "a", "<mask>", "Ġb".

A tokenizer is loaded from GPT-2-style vocab.json + merges.txt, from a tokenizer.json, or from a
directory holding either; ``save`` writes all of them plus the configs transformers reads, so
``AutoTokenizer.from_pretrained`` loads the directory and produces the same ids.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from bertforge.core.arguments import checked
from bertforge.core.paths import check_path_text
from bertforge.errors import DataError
from bertforge.core.io import write_json_atomic, write_text_atomic
from bertforge.tokenization.base import (BackendTokenizer, read_json_object, tokenizer_json_tokens,
                                         saved_max_length, tokens_in_id_order)

__all__ = ["BPE_SPECIAL_TOKENS", "BpeTokenizer", "bpe_hash", "parse_bpe_tokenizer_json",
           "parse_merges", "read_bpe_directory", "read_bpe_tokenizer_json", "read_merges_txt",
           "read_vocab_json"]

BPE_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
DEFAULT_MAX_LENGTH = 1024  # BART's position embeddings
MERGES_HEADER = "#version: 0.2"  # first line of GPT-2's merges.txt
WORD_START = "Ġ"  # the byte-level spelling of a space

Merge = tuple[str, str]


def bpe_hash(tokens: Sequence[str], merges: Sequence[Merge]) -> str:
    """SHA-256 identity of a BPE tokenizer: the tokens in id order (vocab.txt bytes), a NUL byte,
    then the merges (merges.txt lines). Two tokenizers with the same tokens but other merges split
    text differently, so they differ here."""
    digest = hashlib.sha256(("\n".join(tokens) + "\n").encode("utf-8"))
    digest.update(b"\0")
    digest.update("".join(f"{a} {b}\n" for a, b in merges).encode("utf-8"))
    return digest.hexdigest()


def read_vocab_json(path: str | Path) -> list[str]:
    """Tokens in id order of a GPT-2/BART vocab.json (``{token: id}``, ids 0..n-1), validated."""
    path = Path(path)
    vocab = read_json_object(path)
    if isinstance(vocab.get("model"), dict):
        raise DataError(f"{path} is a tokenizer.json, not a vocab.json; load it with "
                        "BpeTokenizer.from_file")
    if not vocab:
        raise DataError(f"{path}: the vocabulary is empty; train one with "
                        "`bertforge.tokenization.training.train_bpe`")
    bad = next(((t, i) for t, i in vocab.items() if type(i) is not int), None)
    if bad is not None:
        raise DataError(f"{path}: token {bad[0]!r} has id {bad[1]!r}; vocab.json maps every token "
                        "to an integer id")
    return tokens_in_id_order(path, vocab)


def read_merges_txt(path: str | Path) -> list[Merge]:
    """Merges of a GPT-2/BART merges.txt: an optional "#version" line, then one "a b" per line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"merges file {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory; pass the merges.txt inside it") from None
    except UnicodeDecodeError:
        raise DataError(f"{path} is not UTF-8 text; is it a merges.txt?") from None
    except OSError as exc:
        raise DataError(f"cannot read merges file {path}: {exc.strerror}") from None
    merges: list[Merge] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise DataError(f"{path}:{lineno}: {line!r} is not two tokens separated by one space; "
                            "is this a GPT-2/BART merges.txt?")
        merges.append((parts[0], parts[1]))
    return merges


def read_bpe_tokenizer_json(path: str | Path) -> tuple[list[str], list[Merge], bool]:
    """(tokens in id order, merges, add_prefix_space) of a byte-level BPE tokenizer.json.

    ``DataError`` for any other kind of tokenizer (a WordPiece or SentencePiece file, a BPE with
    "##"-style affixes or without GPT-2's byte-level pre-tokenizer), since splitting its text our
    way would silently give other ids.
    """
    return parse_bpe_tokenizer_json(read_json_object(Path(path)), Path(path))


def parse_bpe_tokenizer_json(data: dict, path: str | Path) -> tuple[list[str], list[Merge], bool]:
    """``read_bpe_tokenizer_json`` of content already parsed (``path`` names it in errors).
    Merges may be "a b" strings (tokenizers < 0.20) or ["a", "b"] pairs."""
    model = data.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "BPE" or not isinstance(model.get("vocab"), dict):
        hint = " (that is BERT's; load it with BertTokenizer)" if kind == "WordPiece" else ""
        raise DataError(f"{path}: model type is {kind!r}{hint}, not a byte-level BPE; BART needs "
                        "a BPE tokenizer.json, or vocab.json + merges.txt")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise DataError(f"{path}: the BPE marks word pieces with a prefix or suffix, which "
                        "byte-level BPE (GPT-2, RoBERTa, BART) never does; is it the right file?")
    pre = data.get("pre_tokenizer")
    shown = pre.get("type") if isinstance(pre, dict) else None
    if shown != "ByteLevel" or not pre.get("use_regex", True):
        raise DataError(f"{path}: pre-tokenizer is {shown!r}, not GPT-2's ByteLevel; bertforge's "
                        "BPE reads only byte-level tokenizers (GPT-2, RoBERTa, BART)")
    if data.get("normalizer") is not None:
        raise DataError(f"{path}: has a normalizer, which GPT-2/RoBERTa/BART tokenizers never "
                        "have; is it the right file?")
    merges = parse_merges(model, path)
    return tokenizer_json_tokens(path, data), merges, bool(pre.get("add_prefix_space", False))


def parse_merges(model: dict, path: str | Path) -> list[Merge]:
    """The merges of a tokenizer.json's BPE ``model``: "a b" strings (tokenizers < 0.20) or
    ["a", "b"] pairs; ``DataError`` naming the first malformed one."""
    merges: list[Merge] = []
    for k, entry in enumerate(model.get("merges") or [], start=1):
        pair = entry.split(" ") if isinstance(entry, str) else entry
        if not isinstance(pair, list) or len(pair) != 2 or not all(
                isinstance(p, str) and p for p in pair):
            raise DataError(f"{path}: merge {k} is {entry!r}, not \"a b\" or [\"a\", \"b\"]; "
                            "the file is damaged")
        merges.append((pair[0], pair[1]))
    return merges


def read_bpe_directory(directory: str | Path) -> tuple[list[str], list[Merge], bool | None] | None:
    """(tokens, merges, add_prefix_space or None when not recorded) of a directory's tokenizer.json,
    else of its vocab.json + merges.txt; None when it has neither."""
    directory = Path(directory)
    json_path = directory / "tokenizer.json"
    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    if json_path.exists():
        return read_bpe_tokenizer_json(json_path)
    if vocab_path.exists() and merges_path.exists():
        return read_vocab_json(vocab_path), read_merges_txt(merges_path), None
    return None


class BpeTokenizer(BackendTokenizer):
    """Byte-level BPE with BART's special tokens; a thin layer over ``tokenizers.Tokenizer``.

    ``is_word_start`` and ``is_continuation`` are (vocab_size,) bool arrays for whole-word
    masking: a token starts a word when its byte-level spelling starts with a space ("Ġ"), and
    special tokens count as word starts (as in fairseq), so they never join a neighbouring word.
    """

    do_lower_case = False  # byte-level BPE is always cased

    @checked
    def __init__(
        self,
        vocab_tokens: Sequence[str],
        merges: Sequence[Merge],
        *,
        add_prefix_space: bool = False,
        model_max_length: int = DEFAULT_MAX_LENGTH,
        source: str = "vocabulary",
    ) -> None:
        if model_max_length < 1:
            raise ValueError(f"model_max_length must be >= 1, got {model_max_length}")
        self.vocab: tuple[str, ...] = tuple(vocab_tokens)  # tokens in id order
        self.vocab_size = len(self.vocab)
        vocab = {token: i for i, token in enumerate(self.vocab)}
        if len(vocab) != self.vocab_size:
            twice = next(t for t, n in Counter(self.vocab).items() if n > 1)
            raise DataError(f"{source}: token {twice!r} appears twice; each token once")
        missing = [t for t in BPE_SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise DataError(
                f"{source}: special token(s) {' '.join(missing)} missing from the vocabulary; a "
                f"BART vocabulary needs all of {' '.join(BPE_SPECIAL_TOKENS)} (train one with "
                "`bertforge.tokenization.training.train_bpe`)"
            )
        self.merges: tuple[Merge, ...] = tuple((a, b) for a, b in merges)
        unknown = next(((k, a, b) for k, (a, b) in enumerate(self.merges, start=1)
                        if a not in vocab or b not in vocab or a + b not in vocab), None)
        if unknown is not None:
            k, a, b = unknown
            raise DataError(f"{source}: merge {k} ({a!r} + {b!r}) uses or makes a token that is "
                            "not in the vocabulary; vocab and merges must come from one tokenizer")
        self.add_prefix_space = bool(add_prefix_space)
        self.model_max_length = int(model_max_length)
        self.bos_id, self.pad_id, self.eos_id, self.unk_id, self.mask_id = (
            vocab[t] for t in BPE_SPECIAL_TOKENS
        )
        self.cls_id, self.sep_id = self.bos_id, self.eos_id  # the names pretraining data uses
        backend = Tokenizer(BPE(vocab, list(self.merges), unk_token="<unk>", dropout=None,
                                continuing_subword_prefix="", end_of_word_suffix="",
                                fuse_unk=False))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=self.add_prefix_space)
        backend.decoder = decoders.ByteLevel()
        backend.post_processor = processors.RobertaProcessing(
            ("</s>", self.eos_id), ("<s>", self.bos_id), trim_offsets=True,
            add_prefix_space=self.add_prefix_space,
        )
        backend.add_special_tokens([
            AddedToken(t, special=True, normalized=False, lstrip=t == "<mask>")
            for t in BPE_SPECIAL_TOKENS
        ])
        self.backend = backend
        special = np.zeros(self.vocab_size, dtype=bool)
        special[[vocab[t] for t in BPE_SPECIAL_TOKENS]] = True
        # [vocab_size] bool each: whole-word masking keeps continuations with the word before.
        spelled = np.array(self.vocab, dtype=np.str_)
        self.is_word_start: np.ndarray = np.char.startswith(spelled, WORD_START) | special
        self.is_continuation: np.ndarray = ~self.is_word_start
        self.vocab_hash = bpe_hash(self.vocab, self.merges)

    # -- loading and saving --------------------------------------------------------------------

    @classmethod
    @checked
    def from_files(
        cls,
        vocab_json: str | Path,
        merges_txt: str | Path,
        *,
        add_prefix_space: bool = False,
        model_max_length: int = DEFAULT_MAX_LENGTH,
    ) -> BpeTokenizer:
        """Load GPT-2/BART ``vocab.json`` + ``merges.txt`` (BART's own files load as they are)."""
        check_path_text(vocab_json, f"{cls.__name__}.from_files(vocab_json)")
        check_path_text(merges_txt, f"{cls.__name__}.from_files(merges_txt)")
        return cls(read_vocab_json(vocab_json), read_merges_txt(merges_txt),
                   add_prefix_space=add_prefix_space, model_max_length=model_max_length,
                   source=f"{vocab_json} + {merges_txt}")

    @classmethod
    @checked
    def from_file(
        cls,
        tokenizer_json: str | Path,
        *,
        add_prefix_space: bool | None = None,
        model_max_length: int = DEFAULT_MAX_LENGTH,
    ) -> BpeTokenizer:
        """Load a byte-level BPE tokenizer.json; ``add_prefix_space=None`` takes the file's."""
        check_path_text(tokenizer_json, f"{cls.__name__}.from_file(tokenizer_json)")
        tokens, merges, stored_prefix = read_bpe_tokenizer_json(tokenizer_json)
        prefix = stored_prefix if add_prefix_space is None else add_prefix_space
        return cls(tokens, merges, add_prefix_space=prefix, model_max_length=model_max_length,
                   source=str(tokenizer_json))

    @classmethod
    @checked
    def from_pretrained(cls, directory: str | Path) -> BpeTokenizer:
        """Load a directory written by ``save`` or by transformers (BART, RoBERTa).

        tokenizer.json is preferred, else vocab.json + merges.txt. tokenizer_config.json, when
        present, gives ``model_max_length`` and ``add_prefix_space``.
        """
        check_path_text(directory, f"{cls.__name__}.from_pretrained(directory)")
        directory = Path(directory)
        if not directory.is_dir():
            raise DataError(f"tokenizer directory {directory} does not exist; check the path")
        found = read_bpe_directory(directory)
        if found is None:
            raise DataError(f"{directory} has neither tokenizer.json nor vocab.json + merges.txt; "
                            "is it a BART model directory?")
        tokens, merges, prefix = found
        config_path = directory / "tokenizer_config.json"
        config = read_json_object(config_path) if config_path.exists() else {}
        if isinstance(config.get("add_prefix_space"), bool):
            prefix = config["add_prefix_space"]
        # transformers writes a huge number when a model has no limit; keep BART's then.
        max_len = saved_max_length(config, DEFAULT_MAX_LENGTH, config_path)
        return cls(tokens, merges, add_prefix_space=bool(prefix), model_max_length=max_len,
                   source=str(directory))

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json, vocab.json, merges.txt, tokenizer_config.json and
        special_tokens_map.json, each atomically. transformers' AutoTokenizer loads the
        directory as a BART tokenizer with the same ids."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.save_tokenizer_json(directory / "tokenizer.json")
        write_json_atomic(directory / "vocab.json",
                          {t: i for i, t in enumerate(self.vocab)},
                          sort_keys=False, ensure_ascii=False)
        merges = "".join(f"{a} {b}\n" for a, b in self.merges)
        write_text_atomic(directory / "merges.txt", f"{MERGES_HEADER}\n{merges}")
        names = self._special_token_names()
        config = {
            "tokenizer_class": "BartTokenizer",
            "model_max_length": self.model_max_length,
            "add_prefix_space": self.add_prefix_space,
            "errors": "replace",
            "trim_offsets": True,
            "clean_up_tokenization_spaces": False,  # decode gives the text back as it was
            **names,
        }
        for name, payload in (("tokenizer_config.json", config),
                              ("special_tokens_map.json", names)):
            write_json_atomic(directory / name, payload, sort_keys=False, ensure_ascii=False)

    @staticmethod
    def _special_token_names() -> dict[str, Any]:
        """transformers' names of the special tokens; <mask> with the space it strips."""
        mask = {"content": "<mask>", "lstrip": True, "normalized": False, "rstrip": False,
                "single_word": False, "special": True}
        return {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "sep_token": "</s>", "pad_token": "<pad>", "cls_token": "<s>",
                "mask_token": mask}

    # -- encoding -------------------------------------------------------------------------------

    def encode_truncated(self, texts: Sequence[str], max_length: int) -> list[list[int]]:
        """``<s> text </s>`` ids of each text, cut to at most ``max_length`` ids (the end of a
        long text is dropped; the final ``</s>`` is kept)."""
        if max_length < 3:
            raise ValueError(f"max_length must leave room for <s>, one token and </s>, got "
                             f"{max_length}")
        keep = max_length - 2
        return [[self.bos_id, *ids[:keep], self.eos_id] for ids in self.encode_batch(texts)]

