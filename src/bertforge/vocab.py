"""WordPiece vocabulary training (`bertforge vocab`), streaming a corpus into `tokenizers`.

The corpus is read twice (the first pass fixes the alphabet, which makes training
deterministic, see ``train_wordpiece``) and never held in memory: only counts grow with it.
"""

from __future__ import annotations

import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.trainers import WordPieceTrainer
from tqdm import tqdm

from bertforge.data.corpus import FORMATS, ReadStats, document_sentences, expand_inputs, iter_documents
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer, _bert_normalizer, _wordpiece

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
        casing = "uncased (lower-cased, accents stripped)" if self.lowercase else "cased"
        lines = [
            f"wrote {self.vocab_path} ({self.vocab_size} tokens, {casing}) "
            f"and {self.tokenizer_json}",
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
    if input_format not in FORMATS:
        known = ", ".join(FORMATS)
        raise ConfigError(f"input format {input_format!r} is not known; use one of {known}")
    vocab_path, json_path = _vocab_outputs(Path(output))
    if vocab_path.parent.exists() and not vocab_path.parent.is_dir():
        raise DataError(f"--output {output}: {vocab_path.parent} is a file, not a directory")
    paths = expand_inputs(inputs)
    total = sum(p.stat().st_size for p in paths)
    stats = ReadStats()

    def batches(desc: str, warn: Callable[[str], None], stats: ReadStats) -> Iterator[list[str]]:
        # Lines go to the consumer as they are read, in batches of ~1000: only counts grow with
        # the corpus, never the text. Wiki markup must go first; plain text needs no segmenting.
        bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress)
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

    # Pass 1 fixes the alphabet. The trainer numbers "##x" pieces in hash-map order and breaks
    # ties between equally frequent merges by those numbers, so two runs on the same text can
    # differ; declaring every "##x" up front (as special tokens, which are numbered first, in
    # our order) makes pass 2 deterministic.
    first_pass = batches("vocab 1/2 (alphabet)", warn or _warn_stderr, stats)
    alphabet = _alphabet(first_pass, lowercase, limit_alphabet)
    if stats.documents == 0:
        reasons = "; ".join(f"{p}: {r}" for p, r in stats.skipped[:5]) or "only blank lines"
        raise DataError(f"no text found in {', '.join(map(str, inputs))} ({reasons})")
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
