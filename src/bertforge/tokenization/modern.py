"""ModernBERT's tokenizer: byte-level BPE (the OLMo / GPT-NeoX scheme) with BERT's special tokens.

Text is NFC-normalized, split GPT-2's way and written as bytes ("Ġ" is a space), then BPE merges
join the byte symbols, so no text becomes [UNK]. Unlike BART's ``BpeTokenizer`` the special
tokens are BERT's [CLS] [SEP] [MASK] [PAD] [UNK] and the template is BERT's, "[CLS] A [SEP]" and
"[CLS] A [SEP] B [SEP]"; the model takes no token types. Special ids are always looked up, never
assumed: the published ModernBERT vocabulary (50368 tokens) has [UNK] [CLS] [SEP] [PAD] [MASK] at
50280..50284, the ones ``bertforge vocab --type modernbert`` trains put [PAD] [UNK] [CLS] [SEP]
[MASK] first, ids 0..4. [MASK] eats the space before it, as in the published tokenizer.

A loaded tokenizer.json is used as it is (its normalizer, added tokens and post-processor run
unchanged in ``tokenizers``) and ``save`` writes it back byte for byte, with the directory's
tokenizer_config.json and special_tokens_map.json when it had them, so a Hugging Face ModernBERT
directory survives a round trip through bertforge unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from bertforge.core.arguments import checked
from bertforge.core.io import write_json_atomic, write_text_atomic
from bertforge.core.jsonfile import parse_json
from bertforge.core.paths import check_path_text
from bertforge.errors import DataError
from bertforge.tokenization.base import (EncoderTokenizer, read_json_object, saved_max_length,
                                         tokenizer_json_tokens)
from bertforge.tokenization.bpe import WORD_START, Merge, bpe_hash, parse_merges

__all__ = ["MODERN_SPECIAL_TOKENS", "ModernBpeTokenizer", "is_modern_tokenizer_json"]

# transformers' name of each special token -> its text; also the order of a trained vocabulary's
# first ids (BERT's: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4).
_NAMES = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
          "sep_token": "[SEP]", "mask_token": "[MASK]"}
MODERN_SPECIAL_TOKENS = tuple(_NAMES.values())
DEFAULT_MAX_LENGTH = 8192  # ModernBERT's context
_CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def is_modern_tokenizer_json(data: dict) -> bool:
    """True for a BPE tokenizer.json whose added tokens include BERT's [CLS] [SEP] [MASK]
    (ModernBERT's); a BART/RoBERTa one has <s> </s> <mask> instead."""
    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        return False
    added = {a.get("content") for a in data.get("added_tokens") or [] if isinstance(a, dict)}
    return {"[CLS]", "[SEP]", "[MASK]"} <= added


def _byte_level(pre: Any) -> bool:
    """Whether a tokenizer.json's pre-tokenizer is (or, in a Sequence, holds) GPT-2's ByteLevel."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "Sequence":
        return any(_byte_level(p) for p in pre.get("pretokenizers") or [])
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True)


def _parse(data: dict, source: str) -> tuple[list[str], list[Merge]]:
    """(tokens in id order, merges) of a ModernBERT-style tokenizer.json; ``DataError`` naming
    what does not fit."""
    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(
            model.get("vocab"), dict):
        raise DataError(f"{source}: not a BPE tokenizer.json; ModernBERT needs byte-level BPE")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise DataError(f"{source}: the BPE marks word pieces with a prefix or suffix, which "
                        "byte-level BPE never does; is it the right file?")
    if not _byte_level(data.get("pre_tokenizer")):
        raise DataError(f"{source}: the pre-tokenizer is not GPT-2's ByteLevel; bertforge reads "
                        "byte-level BPE tokenizers only")
    tokens = tokenizer_json_tokens(Path(source), data)
    missing = [t for t in MODERN_SPECIAL_TOKENS if t not in set(tokens)]
    if missing:
        raise DataError(f"{source}: special token(s) {' '.join(missing)} missing; a ModernBERT "
                        f"tokenizer needs all of {' '.join(MODERN_SPECIAL_TOKENS)}")
    return tokens, parse_merges(model, source)


class ModernBpeTokenizer(EncoderTokenizer):
    """Byte-level BPE with BERT's special tokens and template; ``backend`` runs the tokenizer.json.

    ``is_word_start`` and ``is_continuation`` are (vocab_size,) bool arrays for whole-word
    masking: a token starts a word when its byte-level spelling starts with a space ("Ġ");
    special tokens count as word starts, so they never join a neighbouring word.
    """

    model_input_names = ("input_ids", "attention_mask")  # no token types
    do_lower_case = False  # byte-level BPE is always cased
    sentence_joiner = " "
    """What ``bertforge prepare`` puts before each sentence after a document's first, which it
    tokenizes one by one: in running text a space precedes it, and a byte-level BPE spells a
    word differently with one ("ĠThe") and without ("The")."""

    @checked
    def __init__(self, tokenizer_json: str, *, model_max_length: int = DEFAULT_MAX_LENGTH,
                 configs: dict[str, str] | None = None, source: str = "tokenizer.json") -> None:
        if model_max_length < 1:
            raise ValueError(f"model_max_length must be >= 1, got {model_max_length}")
        # A byte-order mark is text to the tokenizers library's parser, which then refuses it.
        tokenizer_json = tokenizer_json.removeprefix("\ufeff")
        data = parse_json(tokenizer_json, source, error=DataError, hint="is it the right file?")
        tokens, merges = _parse(data if isinstance(data, dict) else {}, source)
        self.vocab: tuple[str, ...] = tuple(tokens)
        self.vocab_size = len(self.vocab)
        self.merges: tuple[Merge, ...] = tuple(merges)
        self.model_max_length = int(model_max_length)
        self._json, self._configs = tokenizer_json, dict(configs or {})
        ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids[t] for t in MODERN_SPECIAL_TOKENS)
        try:
            self.backend = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the tokenizers library raises plain exceptions
            raise DataError(f"{source}: tokenizers cannot read it ({exc})") from None
        # Padding or truncation stored in the file is not applied (as for BERT's): callers
        # decide; ``save`` still writes the file as it was.
        self.backend.no_padding()
        self.backend.no_truncation()
        self._check_template(source)
        special = np.zeros(self.vocab_size, dtype=bool)
        special[[a["id"] for a in data.get("added_tokens") or [] if a.get("special")]] = True
        spelled = np.array(self.vocab, dtype=np.str_)
        # (vocab_size,) bool each: whole-word masking keeps continuations with the word before.
        self.is_word_start: np.ndarray = np.char.startswith(spelled, WORD_START) | special
        self.is_continuation: np.ndarray = ~self.is_word_start
        self.vocab_hash = bpe_hash(self.vocab, self.merges)

    def _check_template(self, source: str) -> None:
        """``DataError`` unless the post-processor gives "[CLS] A [SEP]" and "[CLS] A [SEP] B
        [SEP]" (checked on what it does, whatever its JSON spelling)."""
        single = self.backend.encode("a", add_special_tokens=True).ids
        pair = self.backend.encode("a", "b", add_special_tokens=True).ids
        cls, sep = self.cls_id, self.sep_id
        if (single[:1], single[-1:], pair[:1], pair[-1:], pair.count(sep)) != (
                [cls], [sep], [cls], [sep], 2):
            raise DataError(f"{source}: its post-processor does not make '[CLS] A [SEP]' and "
                            "'[CLS] A [SEP] B [SEP]', ModernBERT's template")

    # -- building, loading and saving ---------------------------------------------------------

    @classmethod
    def build(cls, vocab_tokens: Sequence[str], merges: Sequence[Merge], *,
              model_max_length: int = DEFAULT_MAX_LENGTH,
              source: str = "vocabulary") -> ModernBpeTokenizer:
        """The published ModernBERT pipeline over a vocabulary that holds the five special
        tokens: NFC, ByteLevel (no prefix space), BPE, ByteLevel decoding, BERT's template."""
        ids = {t: i for i, t in enumerate(vocab_tokens)}
        missing = [t for t in MODERN_SPECIAL_TOKENS if t not in ids]
        if missing or len(ids) != len(vocab_tokens):
            raise DataError(f"{source}: needs each of {' '.join(MODERN_SPECIAL_TOKENS)} once and "
                            "no token twice")
        backend = Tokenizer(BPE(ids, [tuple(m) for m in merges], dropout=None, fuse_unk=False))
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False,
                                               lstrip=t == "[MASK]")
                                    for t in sorted(MODERN_SPECIAL_TOKENS, key=ids.get)])
        return cls(backend.to_str(pretty=True), model_max_length=model_max_length, source=source)

    @classmethod
    @checked
    def from_file(cls, path: str | Path, *,
                  model_max_length: int = DEFAULT_MAX_LENGTH) -> ModernBpeTokenizer:
        """Load a ModernBERT tokenizer.json."""
        check_path_text(path, f"{cls.__name__}.from_file(path)")
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")  # as it is: save writes it back unchanged
        except FileNotFoundError:
            raise DataError(f"{path} does not exist; check the path") from None
        except (UnicodeDecodeError, IsADirectoryError):
            raise DataError(f"{path} is not a UTF-8 tokenizer.json; is it the right file?") from None
        return cls(text, model_max_length=model_max_length, source=str(path))

    @classmethod
    @checked
    def from_pretrained(cls, directory: str | Path) -> ModernBpeTokenizer:
        """Load a directory written by ``save`` or a Hugging Face ModernBERT one (its
        tokenizer.json; tokenizer_config.json, when present, gives ``model_max_length``)."""
        check_path_text(directory, f"{cls.__name__}.from_pretrained(directory)")
        directory = Path(directory)
        if not (directory / "tokenizer.json").is_file():
            raise DataError(f"{directory} has no tokenizer.json; is it a ModernBERT directory?")
        configs = {name: (directory / name).read_bytes().decode("utf-8", "replace")
                   for name in _CONFIG_FILES if (directory / name).is_file()}
        config = (read_json_object(directory / _CONFIG_FILES[0])
                  if _CONFIG_FILES[0] in configs else {})
        # transformers writes a huge number when a model has no limit; keep ModernBERT's then.
        max_len = saved_max_length(config, DEFAULT_MAX_LENGTH, directory / _CONFIG_FILES[0])
        tokenizer = cls.from_file(directory / "tokenizer.json", model_max_length=max_len)
        tokenizer._configs = configs
        return tokenizer

    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json (as loaded, byte for byte), tokenizer_config.json and
        special_tokens_map.json (the loaded directory's, else ones transformers' AutoTokenizer
        reads as a ``PreTrainedTokenizerFast`` with the same ids), each atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(directory / "tokenizer.json", self._json)
        names: dict[str, Any] = dict(_NAMES)
        names["mask_token"] = {"content": "[MASK]", "lstrip": True, "normalized": False,
                               "rstrip": False, "single_word": False, "special": True}
        config = {"tokenizer_class": "PreTrainedTokenizerFast",
                  "model_max_length": self.model_max_length,
                  "model_input_names": list(self.model_input_names),
                  "clean_up_tokenization_spaces": False,  # decode gives the text back as it was
                  **names}
        for name, payload in zip(_CONFIG_FILES, (config, names)):
            if name in self._configs:
                write_text_atomic(directory / name, self._configs[name])
            else:
                write_json_atomic(directory / name, payload, sort_keys=False, ensure_ascii=False)
