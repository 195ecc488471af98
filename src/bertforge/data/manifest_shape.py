"""What each key of a prepared directory's ``manifest.json`` must hold.

``bertforge prepare`` writes the manifest, but what a command reads may have been edited by
hand, cut short or written by another tool: a list where an object belongs (``"splits": [1]``,
a shard entry as ``["file", 29]``), a number where a file name does, text where a count does.
A reader indexing it would end in an AttributeError, a TypeError or a KeyError far from the
file, or run on with a count it cannot use. :func:`check_manifest_shape` checks every key the
readers read (the dataset, the loader defaults, ``inspect``, pretraining) at the one place the
manifest is read, and refuses the first wrong one in one line naming the file and the key's
path (``splits.train.shards[0].file``). Keys a reader does not read are left alone, and keys a
manifest of an older bertforge lacks stay optional, except the shard list and each shard's
``file`` and ``instances``, without which no split can be read.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from bertforge.errors import DataError

_FIX = "re-run `bertforge prepare` (or restore the manifest it wrote)"


def _whole(minimum: int | None) -> tuple[Callable[[Any], bool], str]:
    def ok(value: Any) -> bool:
        return (isinstance(value, int) and not isinstance(value, bool)
                and (minimum is None or value >= minimum))
    return ok, "a whole number" + (f" >= {minimum}" if minimum is not None else "")


def _of(kind: type, words: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: isinstance(value, kind)), words


_COUNT = _whole(0)
_NAME = (lambda v: isinstance(v, str) and v.strip() != ""), "a non-empty string"
_FLAG = _of(bool, "true or false")
_FRACTION = ((lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 <= v <= 1),
             "a number from 0 to 1")
_COUNTS = ((lambda v: isinstance(v, dict) and all(_COUNT[0](x) for x in v.values())),
           "an object of whole numbers >= 0")

# The top-level keys some reader reads (checked when present), with what each must hold.
_TOP: dict[str, tuple[Callable[[Any], bool], str]] = {
    "fingerprint": _of(str, "a string"), "tokenizer": _NAME, "objective": _NAME,
    "vocab_hash": _of(str, "a string"), "vocab_size": _whole(1), "max_seq_length": _whole(1),
    "seed": _whole(None), "do_lower_case": _FLAG, "whole_word_masking": _FLAG,
    "masked_lm_prob": _FRACTION, "max_predictions": _COUNT, "dupe_factor": _whole(1),
    "length_bin_width": _whole(1), "counts": _COUNTS,
}
_SPLIT_COUNTS = ("documents", "sentences", "skipped_documents", "instances", "tokens")


def check_manifest_shape(manifest: dict[str, Any], file: Path,
                         required: Sequence[str] = ()) -> None:
    """``DataError`` (one line: ``file``, the key's path, what it must hold, what it holds)
    unless every key of ``manifest`` a reader reads has the shape ``prepare`` writes.
    ``required``: keys (``special_ids.mask``: a key of an object) the caller reads without a
    default, which must be there too."""
    def refuse(key: str, what: str, value: Any) -> NoReturn:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
        raise DataError(f"{file}: {key} must be {what}, got {shown}; {_FIX}")

    version = manifest.get("format_version")
    if isinstance(version, bool):  # true == 1 in Python, not in a manifest
        refuse("format_version", "a whole number", version)
    for key, (ok, what) in _TOP.items():
        if key in manifest and not ok(manifest[key]):
            refuse(key, what, manifest[key])
    special = manifest.get("special_ids", {})
    if not isinstance(special, dict):
        refuse("special_ids", "an object of token ids (pad, unk, cls, sep, mask)", special)
    for name, value in special.items():
        if not _COUNT[0](value):
            refuse(f"special_ids.{name}", "a token id (a whole number >= 0)", value)
    splits = manifest.get("splits", {})
    if not isinstance(splits, dict):
        refuse("splits", "an object of splits (train, validation)", splits)
    for name, split in splits.items():
        _check_split(f"splits.{name}", split, refuse)
    for key in required:  # an outer key with inner ones is an object: checked above
        outer, _, inner = key.partition(".")
        if outer not in manifest or (inner and inner not in manifest[outer]):
            raise DataError(f"{file}: {key} is missing (every manifest `bertforge prepare` "
                            f"writes has it); {_FIX}")


def _check_split(where: str, split: Any,
                 refuse: Callable[[str, str, Any], NoReturn]) -> None:
    if not isinstance(split, dict):
        refuse(where, "an object with a shards list", split)
    for key in _SPLIT_COUNTS:
        if key in split and not _COUNT[0](split[key]):
            refuse(f"{where}.{key}", _COUNT[1], split[key])
    histogram = split.get("length_histogram", [])
    if not isinstance(histogram, list):
        refuse(f"{where}.length_histogram", "a list of [shortest, longest, count] rows",
               histogram)
    for k, row in enumerate(histogram):
        if not (isinstance(row, list) and len(row) == 3 and all(_COUNT[0](x) for x in row)):
            refuse(f"{where}.length_histogram[{k}]",
                   "a [shortest, longest, count] row of whole numbers", row)
    shards = split.get("shards")
    if not isinstance(shards, list):
        refuse(f"{where}.shards", "a list of shard objects (file, instances)", shards)
    for k, shard in enumerate(shards):
        entry = f"{where}.shards[{k}]"
        if not isinstance(shard, dict):
            refuse(entry, "an object with file and instances", shard)
        if not _NAME[0](shard.get("file")):
            refuse(f"{entry}.file", "the shard's file name (a non-empty string)",
                   shard.get("file"))
        for key in _SPLIT_COUNTS:
            if (key == "instances" or key in shard) and not _COUNT[0](shard.get(key)):
                refuse(f"{entry}.{key}", _COUNT[1], shard.get(key))


__all__ = ["check_manifest_shape"]
