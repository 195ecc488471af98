"""The data commands: ``vocab`` (train a tokenizer), ``prepare`` (corpus -> shards) and
``inspect`` (look at prepared data)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from bertforge.commands.base import Command, beside
from bertforge.core.schema import REQUIRED, check_fields, opt, save_config
from bertforge.data.prepare_config import CorpusInput, PrepareConfig
from bertforge.errors import ConfigError

VOCAB_CONFIG_NAME = "vocab-config.yaml"
PREPARE_CONFIG_NAME = "config.yaml"


@dataclass
class VocabConfig(CorpusInput):
    """``bertforge vocab``."""

    type: str = opt("wordpiece", "wordpiece (BERT), bpe (BART's byte-level BPE, specials <s> "
                    "<pad> </s> <unk> <mask>) or modernbert (byte-level BPE with BERT's specials "
                    "[CLS] [SEP] [MASK] [PAD] [UNK] and template, no token types).",
                    choices=("wordpiece", "bpe", "modernbert"))
    vocab_size: int = opt(30522, "Target vocabulary size (BART's is 50265, ModernBERT's 50368).",
                          minimum=1)
    output: str = opt(REQUIRED, "wordpiece: vocab.txt to write (tokenizer.json goes beside it); "
                      "bpe: a directory for tokenizer.json, vocab.json, merges.txt and configs; "
                      "modernbert: a directory for tokenizer.json and configs.")
    cased: bool = opt(False, "WordPiece: keep case and accents (default: lower-case and strip "
                      "accents, as BERT uncased). Byte-level BPE always keeps case.")
    min_frequency: int = opt(2, "Minimum count of a merged piece.", minimum=1)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.type != "wordpiece" and self.cased:
            raise ConfigError(f"--cased applies to WordPiece only: byte-level BPE (--type "
                              f"{self.type}) always keeps case")


def vocab_config_path(output: str | Path) -> Path:
    """``vocab-config.yaml`` in a directory output (BPE, or WordPiece into a directory), else
    beside the file: ``vocab.txt`` -> ``vocab.txt.config.yaml``."""
    output = Path(output)
    return output / VOCAB_CONFIG_NAME if output.is_dir() else beside(output)


def run_vocab(cfg: VocabConfig) -> int:
    from bertforge.tokenization.training import train_bpe, train_modern_bpe, train_wordpiece

    common = dict(vocab_size=cfg.vocab_size, output=Path(cfg.output),
                  min_frequency=cfg.min_frequency, input_format=cfg.input_format,
                  text_field=cfg.text_field)
    if cfg.type == "bpe":
        report = train_bpe(cfg.input, **common)
    elif cfg.type == "modernbert":
        report = train_modern_bpe(cfg.input, **common)
    else:
        report = train_wordpiece(cfg.input, lowercase=not cfg.cased, **common)
    save_config(cfg, vocab_config_path(cfg.output))
    print(report.summary())
    return 0


def run_prepare(cfg: PrepareConfig) -> int:
    from bertforge.data.prepare import prepare_data

    report = prepare_data(cfg)
    # Without the output path: the file lies in it, and two outputs of the same settings and
    # inputs stay identical byte for byte (a resumed run is compared with a fresh one; a
    # merged one with a single run: a part's goes in its folder, which the merge removes).
    save_config(replace(cfg, merge=False), report.output / PREPARE_CONFIG_NAME,
                unset=["output"])
    print(report.summary())
    return 0


@dataclass
class InspectConfig:
    """``bertforge inspect``."""

    path: str = opt(REQUIRED, "A `prepare` output directory, or hdf5 file(s)/directory.",
                    positional=True)
    num: int = opt(3, "Instances to show.", minimum=1)
    seed: int = opt(0, "Which instances / masks to draw.")
    vocab: Optional[str] = opt(None, "Decode with this vocabulary (default: the tokenizer saved "
                               "by `prepare` beside the data, else token ids).")

    def __post_init__(self) -> None:
        check_fields(self)


def run_inspect(cfg: InspectConfig) -> int:
    from bertforge.data.inspect import inspect_dataset

    print(inspect_dataset(Path(cfg.path), num=cfg.num, seed=cfg.seed, vocab=cfg.vocab))
    return 0


VOCAB = Command(
    "vocab", "Train a vocabulary: WordPiece for BERT (vocab.txt + tokenizer.json), byte-level "
    "BPE for BART or for ModernBERT (a tokenizer directory).", VocabConfig, run_vocab,
    saves=f"beside the vocabulary: OUTPUT.config.yaml for a file, {VOCAB_CONFIG_NAME} in a "
          "directory")
PREPARE = Command(
    "prepare", "Turn a corpus into pretraining data (sentence pairs, shards).", PrepareConfig,
    run_prepare, saves=f"OUTPUT/{PREPARE_CONFIG_NAME} (output left as ???), beside "
                       "prepare-settings.json")
INSPECT = Command("inspect", "Show a prepared dataset's manifest and a few decoded instances.",
                  InspectConfig, run_inspect)
