"""The settings of ``bertforge prepare`` (and the corpus options ``bertforge vocab`` shares), as
typed configs: every check happens here, before any file is read.

Torch- and numpy-free, so the command line is built from them instantly. The choices of
``input_format`` and ``objective`` come from ``bertforge.core.limits``, which the corpus reader
and the instance builder check against too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from bertforge.core import limits
from bertforge.core.limits import INPUT_FORMATS, OBJECTIVES
from bertforge.core.schema import REQUIRED, check_fields, opt
from bertforge.errors import ConfigError

FORMATS = ("native", "hdf5")


@dataclass
class CorpusInput:
    """Where a corpus is and how to read it."""

    input: List[str] = opt(REQUIRED, "Files, directories (read recursively) or globs; "
                           ".gz/.bz2/.xz are read transparently.", metavar="PATH")
    text_field: str = opt("text", "JSON Lines only: the field holding each document's text.")
    input_format: str = opt("auto", "auto: by extension (.txt/.md: a blank line ends a document "
                            "and each line is split into sentences; .jsonl: JSON Lines; .xml: "
                            "Wikipedia dump). sentences: one sentence per line. paragraphs: "
                            "blank-line-separated blocks.", choices=INPUT_FORMATS)


@dataclass
class PrepareConfig(CorpusInput):
    """``bertforge prepare``: corpus -> pretraining instances -> token shards."""

    vocab: str = opt(REQUIRED, "vocab.txt, tokenizer.json or a model/tokenizer directory "
                     "(WordPiece or BPE).")
    output: str = opt(REQUIRED, "Output directory.")
    max_seq_length: int = opt(128, "Tokens per sequence.", minimum=1)
    max_predictions: int = opt(20, "Masked tokens per sequence at most (stored for the loader; "
                               "used by hdf5).", minimum=1)
    masked_lm_prob: float = opt(0.15, "Fraction of tokens masked.")
    short_seq_prob: float = opt(0.1, "Probability of a shorter target length (as Google's "
                                "BERT).")
    objective: str = opt("nsp", "nsp / sop: BERT sentence pairs (next-sentence, "
                         "sentence-order); none: packed text; denoise: packed documents with "
                         "sentence boundaries for BART (noise is drawn at load time; native "
                         "format only).", choices=OBJECTIVES)
    whole_word_masking: bool = opt(False, "Mask whole words only.")
    dupe_factor: int = opt(5, "hdf5 only: copies of the data with different static masks.",
                           minimum=1)
    validation_fraction: float = opt(0.01, "Fraction of documents held out for validation.")
    workers: int = opt(1, "Worker processes.", minimum=1)
    seed: int = opt(12345, "Seed (output is identical for a seed).")
    format: str = opt("native", "native: token ids, masks drawn at load time; hdf5: "
                      "NVIDIA/Google static masks.", choices=FORMATS)
    overwrite: bool = opt(False, "Replace an existing output made with different settings.")
    docs_per_shard: int = opt(2048, "A chunk (one shard per split, one worker's task) closes "
                              "after this many documents or chunk_bytes of text.", minimum=1)
    chunk_bytes: int = opt(8 << 20, "A chunk closes after this many characters of text.",
                           minimum=1)
    length_bin_width: int = opt(32, "Width in tokens of the length bins recorded in the native "
                                "shards (the loader's bin_by_length).", minimum=1)

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            self.input = [self.input]
        for name in ("input", "vocab", "output"):
            if isinstance(getattr(self, name), str) and getattr(self, name) == REQUIRED:
                raise ConfigError(f"config key '{name}' must be set: give --{name}")
        self._check()

    def _check(self) -> None:
        """Impossible settings, refused before any work and named by their flag."""
        from bertforge.data.instances import check_instance_settings

        check_instance_settings(self.max_seq_length, self.short_seq_prob, self.objective)
        checks = [
            ("--input-format", self.input_format in INPUT_FORMATS,
             f"must be one of {', '.join(INPUT_FORMATS)}"),
            ("--format", self.format in FORMATS, "must be native or hdf5"),
            ("--format", not (self.format == "hdf5" and self.objective == "denoise"),
             "hdf5 stores static BERT masks and cannot hold --objective denoise data; use "
             "--format native"),
            ("--workers", _whole(self.workers), "must be >= 1"),
            ("--dupe-factor", _whole(self.dupe_factor), "must be >= 1"),
            ("--validation-fraction", self.validation_fraction in limits.FRACTION,
             f"must be a finite number {limits.FRACTION}"),
            ("--masked-lm-prob", self.masked_lm_prob in limits.MASKED_LM_PROB,
             f"must be a finite number {limits.MASKED_LM_PROB}"),
            ("--max-predictions", self.max_predictions >= 1, "must be >= 1"),
            ("docs_per_shard", self.docs_per_shard >= 1, "must be >= 1"),
            ("chunk_bytes", self.chunk_bytes >= 1, "must be >= 1"),
            ("length_bin_width", self.length_bin_width >= 1, "must be >= 1"),
        ]
        for name, ok, what in checks:
            if not ok:
                raise ConfigError(f"{name}: {what}")
        check_fields(self)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


__all__ = ["CorpusInput", "FORMATS", "INPUT_FORMATS", "OBJECTIVES", "PrepareConfig"]
