"""Model inputs for checking an export: synthetic padded batches, and the user's sample text.

Synthetic batches always run (batch sizes 1 and 3, two sequence lengths, rows padded to
different lengths, both segments), so every export proves its batch and sequence axes are
really dynamic and that padding is masked the same way in both runtimes. For a model with a
sliding window (ModernBERT's local layers, ``config.window``) the short length is within the
window and the long one several windows wide, so both sides of the window are checked. A sample file adds
real text, encoded exactly as fine-tuning and prediction encode it (question answering through
``qa_features``' windows, other heads through ``encode_windows``), so the int8 accuracy change
is measured on inputs like the ones the model will see.

Sample file: UTF-8 text, one example per line, blank lines skipped. A tab separates the two
texts of a pair; question answering needs ``question<TAB>context`` on every line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertforge.data.finetuning.squad import QAExample, QAFeatures, qa_features
from bertforge.errors import DataError
from bertforge.models.config import BertConfig
from bertforge.tokenization import EncoderTokenizer, Window

Batch = dict[str, np.ndarray]
"""``input_ids``/``attention_mask`` (and BERT's ``token_type_ids``), each (B, S) int64."""
ALL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

MAX_SAMPLE_EXAMPLES = 512
"""Lines of a sample file used at most (the accuracy check must stay quick)."""
SAMPLE_MAX_LENGTH = 384
"""Tokens per encoded sample sequence at most (and never above max_position_embeddings)."""


@dataclass
class EncodedSample:
    """A sample file encoded for the model: (N, S) rows, plus what QA post-processing needs."""

    inputs: Batch
    examples: list[QAExample] | None = None
    """Question answering only: one example per sample line."""
    features: QAFeatures | None = None
    """Question answering only: the windows ``inputs`` holds (N rows)."""


def _lengths(config: BertConfig) -> tuple[int, int]:
    """(short, long) sequence lengths: 11 and 48, or for a model with a sliding window of
    ``window`` tokens each side, at most ``window`` and at least ``3 * window`` (all within
    ``max_position_embeddings``)."""
    limit = config.max_position_embeddings
    window = getattr(config, "window", None)  # ModernBERT: half width of its local layers
    long = min(48 if window is None else max(48, 3 * window), limit)
    short = min(11 if window is None else max(2, min(11, window)), long - 1)
    return short, long


def synthetic_batches(config: BertConfig, pad_id: int, special_ids: int = 5,
                      names: tuple[str, ...] = ALL_INPUTS) -> list[Batch]:
    """Four padded batches, (1, short), (3, short), (1, long), (3, long) (lengths:
    ``_lengths``): random ids above the special tokens, the second segment on the last third of
    each row, rows of a 3-row batch holding all, two thirds and one third of the length.
    Deterministic (seed 0). ``names``: the model's inputs (the others are left out)."""
    rng = np.random.default_rng(0)
    short, long = _lengths(config)
    batches = []
    for length in (short, long):
        for size in (1, 3):
            ids = rng.integers(special_ids, config.vocab_size, size=(size, length), dtype=np.int64)
            mask = np.ones((size, length), dtype=np.int64)
            types = np.zeros((size, length), dtype=np.int64)
            for row in range(1, size):  # row 0 stays full so the batch is `length` wide
                real = max(2, length * (size - row) // size)
                ids[row, real:], mask[row, real:] = pad_id, 0
            types[:, 2 * length // 3:] = 1
            batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}
            batches.append({n: batch[n] for n in names})
    return batches


def read_sample(path: str | os.PathLike[str], needs_pairs: bool) -> list[tuple[str, str | None]]:
    """(text, second text or None) of each non-blank line of a sample file (see module docstring)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"--sample {path} does not exist") from None
    except UnicodeDecodeError:
        raise DataError(f"--sample {path} is not UTF-8 text") from None
    rows: list[tuple[str, str | None]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        first, sep, second = line.partition("\t")
        if needs_pairs and not (sep and first.strip() and second.strip()):
            raise DataError(f"--sample {path}:{lineno}: a question-answering sample line is "
                            "'question<TAB>context'; this line has no tab-separated context")
        rows.append((first, second if sep else None))
        if len(rows) == MAX_SAMPLE_EXAMPLES:
            break
    if not rows:
        raise DataError(f"--sample {path} has no text; give one example per line")
    return rows


def encode_sample(rows: list[tuple[str, str | None]], tokenizer: EncoderTokenizer,
                  config: BertConfig, question_answering: bool,
                  names: tuple[str, ...] = ALL_INPUTS) -> EncodedSample:
    """The sample's model inputs ``names``, padded to the longest row (QA: to the window
    length)."""
    limit = min(SAMPLE_MAX_LENGTH, config.max_position_embeddings)
    if question_answering:
        examples = [QAExample(id=str(i), question=q, context=c or "", answers=[])
                    for i, (q, c) in enumerate(rows)]
        features = qa_features(examples, tokenizer, max_seq_length=limit,
                               doc_stride=max(1, limit // 3),
                               max_query_length=min(64, limit // 2), training=False)
        inputs = {"input_ids": features.input_ids, "attention_mask": features.attention_mask,
                  "token_type_ids": features.token_type_ids}
        return EncodedSample({n: inputs[n] for n in names}, examples, features)
    windows = _windows(rows, tokenizer, limit)
    width = max(len(w.ids) for w in windows)
    padded = tokenizer.pad_windows(windows, width)
    return EncodedSample({n: padded[n] for n in names})


def _windows(rows: list[tuple[str, str | None]], tokenizer: EncoderTokenizer,
             limit: int) -> list[Window]:
    """One truncated window per sample line, in line order (single texts and pairs may mix)."""
    singles = [i for i, (_, s) in enumerate(rows) if s is None]
    pairs = [i for i, (_, s) in enumerate(rows) if s is not None]
    out: dict[int, Window] = {}
    if singles:
        out.update(zip(singles, tokenizer.encode_windows([rows[i][0] for i in singles],
                                                         max_length=limit)))
    if pairs:
        out.update(zip(pairs, tokenizer.encode_windows([rows[i][0] for i in pairs],
                                                       [rows[i][1] or "" for i in pairs],
                                                       max_length=limit)))
    return [out[i] for i in range(len(rows))]


def trimmed(inputs: Batch, rows: slice | np.ndarray) -> Batch:
    """The ``rows`` of ``inputs`` cut to their longest real row (no all-padding columns)."""
    mask = inputs["attention_mask"][rows]
    width = max(1, int(mask.sum(axis=1).max()))
    return {name: value[rows][:, :width] for name, value in inputs.items()}


def sample_batches(inputs: Batch, batch_size: int) -> list[Batch]:
    """Consecutive batches of ``batch_size`` rows, each trimmed to its longest row."""
    n = len(inputs["input_ids"])
    return [trimmed(inputs, slice(i, i + batch_size)) for i in range(0, n, batch_size)]


__all__ = ["ALL_INPUTS", "Batch", "EncodedSample", "MAX_SAMPLE_EXAMPLES", "encode_sample", "read_sample",
           "sample_batches", "synthetic_batches", "trimmed"]
