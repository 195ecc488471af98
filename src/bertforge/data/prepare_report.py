"""What ``bertforge prepare`` reports: the one-screen summary and the up-front size estimate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Rough English WordPiece density (bytes of raw text per token) for the up-front size estimate.
BYTES_PER_TOKEN = 4.5
# Rough English sentence length in tokens, for the size of denoise's sentence boundaries.
TOKENS_PER_SENTENCE = 25


@dataclass
class PrepareReport:
    """What ``prepare`` did; ``summary()`` is the one-screen text the CLI prints."""

    output: Path
    fmt: str
    objective: str
    totals: dict[str, int]
    splits: dict[str, dict[str, int]]
    chunks: int
    resumed_chunks: int
    input_bytes: int
    estimated_bytes: int
    output_bytes: int
    seconds: float
    skipped_inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        t = self.totals
        lines = [
            f"prepared {self.output} ({self.fmt}, objective {self.objective})",
            f"  documents  {t['documents']:,} (+{t['skipped_documents']:,} skipped: no text left)",
            f"  sentences  {t['sentences']:,}",
            f"  instances  {t['instances']:,}",
            f"  tokens     {t['tokens']:,}",
        ]
        for name, s in self.splits.items():
            lines.append(f"  {name:<10} {s['instances']:,} instances, {s['tokens']:,} tokens, "
                         f"{s['documents']:,} documents")
        resumed = f" ({self.resumed_chunks} done by an earlier run)" if self.resumed_chunks else ""
        lines.append(f"  shards     {self.chunks} per split{resumed}")
        lines.append(f"  size       {human(self.output_bytes)} from {human(self.input_bytes)} of "
                     f"input (estimated {human(self.estimated_bytes)}), {self.seconds:.1f}s")
        for title, items in (("skipped inputs", self.skipped_inputs),
                             ("reader warnings", self.warnings)):
            if items:
                lines.append(f"  {title} ({len(items)}):")
                lines += [f"    {x}" for x in items[:20]]
                if len(items) > 20:
                    lines.append(f"    ... and {len(items) - 20} more")
        return "\n".join(lines)


def estimate_bytes(input_bytes: int, settings: dict) -> int:
    """Rough output size, printed before the work starts."""
    tokens = input_bytes / BYTES_PER_TOKEN
    instances = tokens / (0.9 * settings["max_seq_length"])
    if settings["output_format"] == "native":
        itemsize = np.dtype(settings["token_dtype"]).itemsize
        size = tokens * itemsize + instances * 11  # + offsets (8), a_length (2), label (1)
        if settings["objective"] == "denoise":
            # sentence_offsets (8 per instance) and one int16 end per sentence
            size += instances * 8 + 2 * tokens / TOKENS_PER_SENTENCE
        return int(size)
    # Static masks, before gzip: int32 ids + int8 mask and segments [S], int32 positions and
    # ids [P], one label; per instance pass.
    per_instance = 6 * settings["max_seq_length"] + 8 * settings["max_predictions"] + 1
    return int(instances * per_instance * settings["dupe_factor"])


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
