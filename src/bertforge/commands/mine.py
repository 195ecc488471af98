"""``bertforge mine``: hard negatives for (anchor, positive) pairs from an embedding model, written
as the anchor/positive/negative_1..N rows the sentence-similarity task trains on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bertforge.commands.base import Command, beside
from bertforge.core.schema import REQUIRED, check_fields, opt, save_config
from bertforge.errors import ConfigError, DataError


@dataclass
class MineConfig:
    """``bertforge mine``: ranks are 0-based over the anchor's ranking without its positives;
    negatives come from ranks [--range-min, --range-max)."""

    model: str = opt(REQUIRED, "The embedding model directory that ranks the passages (anchors "
                     "get its query prompt, passages its document prompt).")
    data: str = opt(REQUIRED, "(anchor, positive) pairs: JSONL/CSV/TSV/Parquet whose first two "
                    "text columns are the anchor and the positive (sentence-transformers), or "
                    "FlagEmbedding JSON Lines {query, pos: [...]}. Other columns are ignored.")
    output: str = opt(REQUIRED, "JSON Lines to write: anchor, positive, negative_1..N per pair.")
    corpus: Optional[str] = opt(None, "More passages to mine from: a text file with one passage a "
                                "line, or a BEIR corpus.jsonl (default: only the data's "
                                "positives; these are always included).")
    overwrite: bool = opt(False, "Replace --output if it exists.")
    range_min: int = opt(10, "First rank a negative may come from (skips the very top, where "
                         "unlabelled positives gather).", minimum=0)
    range_max: int = opt(100, "Ranks from --range-max on are not used (exclusive end).",
                         minimum=1)
    negatives: int = opt(5, "Negatives per row; a pair with fewer candidates is dropped.",
                         minimum=1)
    margin: Optional[float] = opt(None, "Skip candidates scoring above (the pair's positive score "
                                  "- MARGIN), likely false negatives; e.g. 0.05 (default: no "
                                  "margin filter).")
    batch_size: int = opt(64, "Texts per forward pass.", minimum=1)
    block_size: int = opt(16384, "Passages embedded and searched at a time (memory: one block of "
                          "vectors).", minimum=1)
    device: str = opt("auto", "auto (cuda if available), cpu, cuda, cuda:1...")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.range_max <= self.range_min:
            raise ConfigError(f"--range-max {self.range_max} must be above --range-min "
                              f"{self.range_min}: negatives come from ranks [range-min, "
                              "range-max)")
        if self.negatives > self.range_max - self.range_min:
            raise ConfigError(f"--negatives {self.negatives} cannot come from the "
                              f"{self.range_max - self.range_min} ranks [{self.range_min}, "
                              f"{self.range_max}); widen the range or ask for fewer")
        if self.margin is not None and self.margin != self.margin:
            raise ConfigError("--margin must be a number, got nan")


def _pairs(path: str) -> tuple[list[str], list[list[str]]]:
    """Anchors and their positives from a pairs file (``data.finetuning.pairs.read_pairs``)."""
    from bertforge.data.finetuning.pairs import read_pairs
    from bertforge.retrieval.mining import group_pairs

    rows = read_pairs(path)
    if rows.kind not in ("pairs", "triplets"):
        raise DataError(f"{path} holds {rows.kind} rows ({', '.join(rows.columns)}); mining "
                        "needs (anchor, positive) pairs")
    return group_pairs([t[0] for t in rows.texts], [[t[1]] for t in rows.texts])


def _passages(path: str | None) -> list[str]:
    """The extra passages of --corpus: a BEIR corpus.jsonl's texts, or one passage per
    non-blank line of a text file."""
    if path is None:
        return []
    from bertforge.data.beir import read_corpus, text_lines

    if Path(path).suffix.lower() in (".jsonl", ".ndjson"):
        return list(read_corpus(path).values())
    if not Path(path).is_file():
        raise DataError(f"--corpus {path} does not exist; give a text file (one passage a line) "
                        "or a BEIR corpus.jsonl")
    passages = [line for _, line in text_lines(Path(path)) if line.strip()]
    if not passages:
        raise DataError(f"--corpus {path} holds no passages (every line is blank)")
    return passages


def _write(rows: list[dict[str, str]], output: Path) -> None:
    from bertforge.core.io import write_text_atomic

    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    write_text_atomic(output, text)


def run_mine(cfg: MineConfig) -> int:
    from bertforge.core.io import check_output_file, output_lock
    from bertforge.inference.embedding import DirectoryEncoder
    from bertforge.retrieval.mining import mine

    output = check_output_file(cfg.output, "--output")
    with output_lock(output, "--output", "bertforge mine", beside=True):
        if output.exists() and not cfg.overwrite:
            raise ConfigError(f"--output {output} already exists; pass --overwrite to replace "
                              "it, or choose another file")
        anchors, positives = _pairs(cfg.data)
        extra = _passages(cfg.corpus)
        encoder = DirectoryEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size)
        settings: dict[str, Any] = {"range_min": cfg.range_min, "range_max": cfg.range_max,
                                    "count": cfg.negatives, "margin": cfg.margin}
        rows, report = mine(encoder.embed_queries, encoder.embed_documents, anchors, positives,
                            extra, block_size=cfg.block_size, similarity=encoder.similarity,
                            device=encoder.device, **settings)
        if not rows:
            raise DataError("no pair kept enough negatives, so nothing was written: "
                            + "; ".join(line.strip() for line in report.lines()))
        _write(rows, output)
        save_config(cfg, beside(output))
    print("\n".join(report.lines()))
    margin = "none" if cfg.margin is None else f"{cfg.margin:g}"
    print(f"ranks [{cfg.range_min}, {cfg.range_max}), {cfg.negatives} negatives per row, margin "
          f"{margin}, {encoder.similarity} similarity")
    print(f"wrote {output}")
    return 0


MINE = Command("mine", "Mine hard negatives for (anchor, positive) pairs with an embedding "
               "model: anchor, positive, negative_1..N rows for sentence-similarity training.",
               MineConfig, run_mine, saves="beside the output: OUTPUT.config.yaml")
