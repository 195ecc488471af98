"""The settings of ``bertforge prepare`` (and the corpus options ``bertforge vocab`` shares), as
typed configs: every check happens here, before any file is read.

Torch- and numpy-free, so the command line is built from them instantly. The choices of
``input_format`` and ``objective`` come from ``bertforge.core.limits``, which the corpus reader
and the instance builder check against too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Mapping, Optional

from bertforge.core import limits
from bertforge.core.limits import INPUT_FORMATS, OBJECTIVES
from bertforge.core.schema import REQUIRED, check_fields, opt
from bertforge.errors import ConfigError

FORMATS = ("native", "hdf5")


@dataclass
class CorpusInput:
    """Where a corpus is and how to read it."""

    input: List[str] = opt(REQUIRED, "Files, directories (read recursively) or globs; "
                           ".gz/.bz2/.xz/.zst are read transparently; Parquet files; a Hugging "
                           "Face save_to_disk folder (DIR or DIR@SPLIT) or Hub dataset "
                           "(hf://ORG/NAME[:CONFIG][@SPLIT], streamed; the local cache when "
                           "offline).", metavar="PATH")
    text_field: str = opt("text", "JSON Lines, Parquet and datasets: the field (column) holding "
                          "each document's text.")
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
    part: Optional[str] = opt(None, "I/N: prepare part I (0..N-1) of N, a deterministic share "
                              "of the chunks, into OUTPUT/parts/I-of-N (one machine each); "
                              "'env': I and N from SLURM (array task, else task) or torchrun "
                              "(RANK, WORLD_SIZE). Then --merge.")
    merge: bool = opt(False, "Join the finished parts in OUTPUT/parts into OUTPUT, the same "
                      "dataset one run without --part makes (run with the parts' settings).")

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
            ("--merge", not (self.merge and self.part), "joins the parts: give it without "
             "--part"),
        ]
        for name, ok, what in checks:
            if not ok:
                raise ConfigError(f"{name}: {what}")
        check_fields(self)
        if self.part is not None:
            parse_part(self.part)


ENV_PARTS = (("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"), ("SLURM_PROCID", "SLURM_NTASKS"),
             ("RANK", "WORLD_SIZE"))
"""Where ``--part env`` finds (I, N), in this order (a SLURM array task's id counts from
SLURM_ARRAY_TASK_MIN)."""


def parse_part(text: str, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``--part``: ``"I/N"`` or ``"env"`` -> (I, N) with 0 <= I < N; ``ConfigError`` else."""
    environ = os.environ if environ is None else environ
    if text == "env":
        for index, count in ENV_PARTS:
            if index in environ and count in environ:
                low = int(environ.get("SLURM_ARRAY_TASK_MIN", "0")) if index.startswith(
                    "SLURM_ARRAY") else 0
                return parse_part(f"{int(environ[index]) - low}/{environ[count]}", {})
        names = ", ".join("/".join(pair) for pair in ENV_PARTS)
        raise ConfigError(f"--part env: none of {names} is set; give --part I/N")
    index, _, count = text.partition("/")
    if not (index.strip().isdigit() and count.strip().isdigit()
            and 0 <= int(index) < int(count)):
        raise ConfigError(f"--part {text}: give I/N with 0 <= I < N (e.g. 0/4 ... 3/4), or env")
    return int(index), int(count)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


__all__ = ["CorpusInput", "ENV_PARTS", "FORMATS", "INPUT_FORMATS", "OBJECTIVES", "PrepareConfig",
           "parse_part"]
