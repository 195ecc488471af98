"""Vocabulary training, streaming a corpus into `tokenizers`: BERT's WordPiece (`bertforge
vocab`, ``train_wordpiece``), BART's byte-level BPE (``train_bpe``) and ModernBERT's byte-level
BPE with BERT's special tokens (``train_modern_bpe``).

The corpus is never held in memory: only counts grow with it. WordPiece reads it twice (the
first pass fixes the alphabet, which makes training deterministic, see ``train_wordpiece``);
byte-level BPE reads it once, its alphabet being the 256 byte symbols.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer, WordPieceTrainer
from tqdm import tqdm

from bertforge.core.progress import progress_bar
from bertforge.tokenization.base import tokenizer_json_tokens
from bertforge.tokenization.bpe import (BPE_SPECIAL_TOKENS, BpeTokenizer, parse_bpe_tokenizer_json,
                                        parse_merges)
from bertforge.tokenization.modern import MODERN_SPECIAL_TOKENS, ModernBpeTokenizer
from bertforge.data.corpus import (FORMATS, Input, ReadStats, document_sentences,
                                   expand_inputs, iter_documents, known_size)
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization.wordpiece import (SPECIAL_TOKENS, BertTokenizer, _bert_normalizer,
                                              _wordpiece)

__all__ = ["BpeReport", "ModernReport", "VocabReport", "train_bpe", "train_modern_bpe",
           "train_wordpiece"]

BYTE_SYMBOLS = 256  # byte-level BPE's alphabet: one symbol per byte value


@dataclass
class VocabReport:
    """What ``train_wordpiece`` read and wrote."""

    vocab_path: Path
    tokenizer_json: Path
    vocab_size: int
    requested_vocab_size: int
    lowercase: bool
    files_read: int = 0
    files_skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    documents: int = 0
    bytes: int = 0

    def summary(self) -> str:
        """A few lines for the end of `bertforge vocab`."""
        lines = [
            self._wrote(),
            f"read {self.files_read} file(s), {self.documents} document(s), "
            f"{self.bytes / 1e6:.1f} MB of text",
        ]
        if self.vocab_size < self.requested_vocab_size:
            lines.append(
                f"note: asked for {self.requested_vocab_size} tokens but the corpus supports only "
                f"{self.vocab_size} (more text or a lower --min-frequency gives more)"
            )
        if self.files_skipped:
            lines.append(f"skipped {len(self.files_skipped)} file(s):")
            lines += [f"  {path}: {reason}" for path, reason in self.files_skipped[:10]]
            if len(self.files_skipped) > 10:
                lines.append(f"  ... and {len(self.files_skipped) - 10} more")
        return "\n".join(lines)

    def _wrote(self) -> str:
        """The summary's first line: what was written where."""
        casing = "uncased (lower-cased, accents stripped)" if self.lowercase else "cased"
        return (f"wrote {self.vocab_path} ({self.vocab_size} tokens, {casing}) "
                f"and {self.tokenizer_json}")


@dataclass(kw_only=True)
class ModernReport(VocabReport):
    """What ``train_modern_bpe`` read and wrote (``vocab_path`` and ``tokenizer_json`` are both
    the tokenizer.json; ``lowercase`` is always False)."""

    merges: int

    def _wrote(self) -> str:
        return (f"wrote ModernBERT's byte-level BPE to {self.tokenizer_json.parent} "
                f"({self.vocab_size} tokens, {self.merges} merges, specials "
                f"{' '.join(MODERN_SPECIAL_TOKENS)}): {self.tokenizer_json.name} and "
                "transformers configs")


@dataclass(kw_only=True)
class BpeReport(VocabReport):
    """What ``train_bpe`` read and wrote: ``vocab_path`` is the vocab.json, ``merges_path`` the
    merges.txt, both beside the tokenizer.json and configs in one directory (``lowercase`` is
    always False: byte-level BPE keeps text as it is)."""

    merges_path: Path
    merges: int
    add_prefix_space: bool

    def _wrote(self) -> str:
        prefix = ", a space added before each text" if self.add_prefix_space else ""
        return (f"wrote byte-level BPE to {self.vocab_path.parent} ({self.vocab_size} tokens, "
                f"{self.merges} merges{prefix}): {self.vocab_path.name}, "
                f"{self.merges_path.name}, {self.tokenizer_json.name} and transformers configs")


def _warn_stderr(message: str) -> None:
    tqdm.write(f"warning: {message}", file=sys.stderr)  # keeps an active progress bar intact


def _vocab_outputs(output: Path) -> tuple[Path, Path]:
    """(vocab.txt path, tokenizer.json path) for an output file or directory."""
    if output.is_dir():
        return output / "vocab.txt", output / "tokenizer.json"
    if output.name == "vocab.txt":
        return output, output.with_name("tokenizer.json")
    # A custom name must not overwrite an unrelated tokenizer.json in the same directory.
    return output, output.with_name(f"{output.stem}.tokenizer.json")


def _check_input_format(input_format: str) -> None:
    if input_format not in FORMATS:
        known = ", ".join(FORMATS)
        raise ConfigError(f"input format {input_format!r} is not known; use one of {known}")


def _corpus_batches(
    paths: Sequence[Input],
    *,
    input_format: str,
    text_field: str,
    progress: bool,
    desc: str,
    warn: Callable[[str], None],
    stats: ReadStats,
) -> Iterator[list[str]]:
    """The corpus's sentences in batches of about 1000, read as they are consumed.

    Lines go to the consumer as they are read: only counts grow with the corpus, never the text.
    Wiki markup must go first; plain text needs no segmenting. A byte progress bar (``desc``)
    follows the reading; problems go to ``warn`` and are counted in ``stats``.
    """
    total = known_size(paths)  # None: a Hub dataset, whose size is not known
    bar = progress_bar(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress)
    batch: list[str] = []
    for path in paths:
        docs = iter_documents(
            path, input_format=input_format, text_field=text_field, warn=warn, stats=stats
        )
        for doc in docs:
            batch += document_sentences(doc) if doc.kind == "wikitext" else doc.lines
            if len(batch) >= 1000:
                yield batch
                batch = []
            bar.update(stats.input_bytes - bar.n)
    bar.update(stats.input_bytes - bar.n)
    bar.close()
    if batch:
        yield batch


def _require_text(inputs: Sequence[str | Path], stats: ReadStats) -> None:
    """``DataError`` when reading ``inputs`` found no document at all."""
    if stats.documents == 0:
        reasons = "; ".join(f"{p}: {r}" for p, r in stats.skipped[:5]) or "only blank lines"
        raise DataError(f"no text found in {', '.join(map(str, inputs))} ({reasons})")


def _alphabet(batches: Iterator[list[str]], lowercase: bool, limit: int) -> list[str]:
    """The ``limit`` most frequent non-space characters after normalization (ties by code point)."""
    raw: Counter[str] = Counter()
    for batch in batches:
        for line in batch:
            raw.update(line)
    # BertNormalizer works character by character, so normalizing each distinct character once
    # and weighting it by its count gives the same totals as normalizing the text, 20x faster.
    normalizer = _bert_normalizer(lowercase)
    counts: Counter[str] = Counter()
    for char, n in raw.items():
        for out in normalizer.normalize_str(char):
            counts[out] += n
    ranked = sorted((c for c in counts if not c.isspace()), key=lambda c: (-counts[c], c))
    return sorted(ranked[:limit])


# CJK ideograph blocks that BertNormalizer surrounds with spaces (BERT's definition).
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def _always_alone(char: str) -> bool:
    """True for characters BERT always splits off as a word of their own (never a "##" piece)."""
    code = ord(char)
    if (33 <= code <= 47) or (58 <= code <= 64) or (91 <= code <= 96) or (123 <= code <= 126):
        return True  # ASCII punctuation and symbols, as in BERT's _is_punctuation
    return unicodedata.category(char).startswith("P") or any(a <= code <= b for a, b in _CJK_RANGES)


def train_wordpiece(
    inputs: Sequence[str | Path],
    vocab_size: int,
    output: str | Path,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    input_format: str = "auto",
    progress: bool = True,
    text_field: str = "text",
    warn: Callable[[str], None] | None = None,
) -> VocabReport:
    """Train a BERT WordPiece vocabulary on a corpus, streaming it (never all in memory).

    Writes ``output`` (vocab.txt, special tokens first: [PAD] [UNK] [CLS] [SEP] [MASK] = ids
    0..4) and a tokenizer.json beside it, both atomically. The result may hold fewer than
    ``vocab_size`` tokens when the corpus has too few distinct pieces. The same input and
    arguments give the same file, byte for byte.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ConfigError(f"vocab_size={vocab_size} is too small; it must exceed the 5 specials")
    if min_frequency < 1 or limit_alphabet < 1:
        raise ConfigError(
            f"min_frequency={min_frequency} and limit_alphabet={limit_alphabet} must be at least 1"
        )
    _check_input_format(input_format)
    vocab_path, json_path = _vocab_outputs(Path(output))
    if vocab_path.parent.exists() and not vocab_path.parent.is_dir():
        raise DataError(f"--output {output}: {vocab_path.parent} is a file, not a directory")
    paths = expand_inputs(inputs)
    stats = ReadStats()

    def batches(desc: str, warn: Callable[[str], None], stats: ReadStats) -> Iterator[list[str]]:
        return _corpus_batches(paths, input_format=input_format, text_field=text_field,
                               progress=progress, desc=desc, warn=warn, stats=stats)

    # Pass 1 fixes the alphabet. The trainer numbers "##x" pieces in hash-map order and breaks
    # ties between equally frequent merges by those numbers, so two runs on the same text can
    # differ; declaring every "##x" up front (as special tokens, which are numbered first, in
    # our order) makes pass 2 deterministic.
    first_pass = batches("vocab 1/2 (alphabet)", warn or _warn_stderr, stats)
    alphabet = _alphabet(first_pass, lowercase, limit_alphabet)
    _require_text(inputs, stats)
    trainer_tok = Tokenizer(_wordpiece(None))
    trainer_tok.normalizer = _bert_normalizer(lowercase)
    trainer_tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        special_tokens=list(SPECIAL_TOKENS) + ["##" + c for c in alphabet if not _always_alone(c)],
        continuing_subword_prefix="##",
        show_progress=False,
    )
    # Pass 2 repeats pass 1's reading, so its warnings and counts are not reported twice.
    second_pass = batches("vocab 2/2 (pieces)", lambda _: None, ReadStats())
    trainer_tok.train_from_iterator(second_pass, trainer=trainer)
    by_id = {i: t for t, i in trainer_tok.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id[i] for i in range(len(by_id))][:vocab_size]
    tokenizer = BertTokenizer(tokens, do_lower_case=lowercase, source=str(vocab_path))
    vocab_path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save_vocab(vocab_path)
    tokenizer.save_tokenizer_json(json_path)
    return VocabReport(
        vocab_path=vocab_path,
        tokenizer_json=json_path,
        vocab_size=tokenizer.vocab_size,
        requested_vocab_size=vocab_size,
        lowercase=lowercase,
        files_read=stats.files_read,
        files_skipped=list(stats.skipped),
        documents=stats.documents,
        bytes=stats.text_bytes,
    )


def train_bpe(
    inputs: Sequence[str | Path],
    vocab_size: int,
    output: str | Path,
    *,
    min_frequency: int = 2,
    input_format: str = "auto",
    text_field: str = "text",
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
    add_prefix_space: bool = True,
) -> BpeReport:
    """Train BART's byte-level BPE on a corpus, streaming it (never all in memory).

    Writes into directory ``output`` everything ``BpeTokenizer.save`` writes (vocab.json,
    merges.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json), atomically.
    The five special tokens come first (<s> <pad> </s> <unk> <mask> = ids 0..4), then the 256
    byte symbols, so every text is representable and none becomes <unk>, then one token per
    merge. ``add_prefix_space`` makes the first word of a text look like every other word (a
    space before it); it is saved with the tokenizer. The result may hold fewer than
    ``vocab_size`` tokens when the corpus has too few frequent pairs. The same input and
    arguments give the same files, byte for byte.
    """
    out = _byte_level_output(output, vocab_size, min_frequency, input_format,
                             "vocab.json, merges.txt, tokenizer.json and configs")
    paths = expand_inputs(inputs)
    stats = ReadStats()
    batches = _corpus_batches(paths, input_format=input_format, text_field=text_field,
                              progress=progress, desc="bpe (pairs)", warn=warn or _warn_stderr,
                              stats=stats)
    trainer_tok = _train_byte_level(batches, vocab_size=vocab_size, min_frequency=min_frequency,
                                    specials=BPE_SPECIAL_TOKENS, add_prefix_space=add_prefix_space)
    _require_text(inputs, stats)
    tokens, merges, _ = parse_bpe_tokenizer_json(json.loads(trainer_tok.to_str()), out)
    tokenizer = BpeTokenizer(tokens, merges, add_prefix_space=add_prefix_space, source=str(out))
    tokenizer.save(out)
    return BpeReport(
        vocab_path=out / "vocab.json",
        tokenizer_json=out / "tokenizer.json",
        merges_path=out / "merges.txt",
        vocab_size=tokenizer.vocab_size,
        requested_vocab_size=vocab_size,
        merges=len(tokenizer.merges),
        lowercase=False,
        add_prefix_space=add_prefix_space,
        files_read=stats.files_read,
        files_skipped=list(stats.skipped),
        documents=stats.documents,
        bytes=stats.text_bytes,
    )


def _byte_level_output(output: str | Path, vocab_size: int, min_frequency: int,
                       input_format: str, files: str) -> Path:
    """The checked output directory of a byte-level BPE training; ``ConfigError`` for settings
    that cannot work, ``DataError`` when ``output`` is (inside) a file."""
    floor = len(BPE_SPECIAL_TOKENS) + BYTE_SYMBOLS
    if vocab_size <= floor:
        raise ConfigError(f"vocab_size={vocab_size} is too small; byte-level BPE needs the 5 "
                          f"specials and {BYTE_SYMBOLS} byte symbols, so it must exceed {floor}")
    if min_frequency < 1:
        raise ConfigError(f"min_frequency={min_frequency} must be at least 1")
    _check_input_format(input_format)
    out = Path(output)
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise DataError(f"--output {output}: {existing} is a file; BPE training writes a directory "
                        f"({files}), so give a directory")
    return out


def _train_byte_level(batches: Iterator[list[str]], *, vocab_size: int, min_frequency: int,
                      specials: Sequence[str], add_prefix_space: bool,
                      normalizer: normalizers.Normalizer | None = None) -> Tokenizer:
    """A byte-level BPE trained on ``batches``, ``specials`` first (ids 0..4), then the 256 byte
    symbols, then one token per merge."""
    trainer_tok = Tokenizer(BPE())
    if normalizer is not None:
        trainer_tok.normalizer = normalizer
    trainer_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    # The whole byte alphabet is declared up front: every byte gets a symbol even when the
    # corpus lacks it, and symbol ids (which break ties between equally frequent pairs) do not
    # depend on what the corpus happens to contain.
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trainer_tok.train_from_iterator(batches, trainer=trainer)
    return trainer_tok


def train_modern_bpe(
    inputs: Sequence[str | Path],
    vocab_size: int,
    output: str | Path,
    *,
    min_frequency: int = 2,
    input_format: str = "auto",
    text_field: str = "text",
    progress: bool = True,
    warn: Callable[[str], None] | None = None,
) -> ModernReport:
    """Train ModernBERT's tokenizer on a corpus, streaming it (never all in memory): byte-level
    BPE over NFC-normalized text, no prefix space, BERT's special tokens first ([PAD] [UNK]
    [CLS] [SEP] [MASK] = ids 0..4), then the 256 byte symbols, then one token per merge.

    Writes into directory ``output`` tokenizer.json, tokenizer_config.json and
    special_tokens_map.json (``ModernBpeTokenizer.save``), atomically; transformers'
    AutoTokenizer loads them with the same ids. The same input and arguments give the same
    files, byte for byte.
    """
    out = _byte_level_output(output, vocab_size, min_frequency, input_format,
                             "tokenizer.json and configs")
    paths = expand_inputs(inputs)
    stats = ReadStats()
    batches = _corpus_batches(paths, input_format=input_format, text_field=text_field,
                              progress=progress, desc="bpe (pairs)", warn=warn or _warn_stderr,
                              stats=stats)
    trainer_tok = _train_byte_level(batches, vocab_size=vocab_size, min_frequency=min_frequency,
                                    specials=MODERN_SPECIAL_TOKENS, add_prefix_space=False,
                                    normalizer=normalizers.NFC())
    _require_text(inputs, stats)
    data = json.loads(trainer_tok.to_str())
    tokenizer = ModernBpeTokenizer.build(tokenizer_json_tokens(out, data),
                                         parse_merges(data["model"], out), source=str(out))
    tokenizer.save(out)
    return ModernReport(
        vocab_path=out / "tokenizer.json", tokenizer_json=out / "tokenizer.json",
        vocab_size=tokenizer.vocab_size, requested_vocab_size=vocab_size,
        merges=len(tokenizer.merges), lowercase=False, files_read=stats.files_read,
        files_skipped=list(stats.skipped), documents=stats.documents, bytes=stats.text_bytes)
