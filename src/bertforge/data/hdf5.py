"""Statically masked hdf5 shards in the layout of NVIDIA's and Google's BERT data tools.

One file holds N instances, padded to max_seq_length S and max_predictions P:

    input_ids            int32 "i4"  [N, S]  token ids, 0-padded
    input_mask           int8  "i1"  [N, S]  1 for real tokens
    segment_ids          int8  "i1"  [N, S]  0 for "[CLS] A [SEP]", 1 for "B [SEP]", 0 padding
    masked_lm_positions  int32 "i4"  [N, P]  predicted positions, increasing, 0-padded
    masked_lm_ids        int32 "i4"  [N, P]  original ids at those positions, 0-padded
    next_sentence_labels int8  "i1"  [N]     0 IsNext, 1 random (-1: no pair objective)

all gzip-compressed, as NVIDIA's create_pretraining_data.py writes them. Position 0 holds [CLS]
and is never predicted, so the first 0 in masked_lm_positions ends the list (NVIDIA's reader
reads it that way too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bertforge.data.batch import IGNORE_INDEX
from bertforge.data.masking import mask_tokens
from bertforge.errors import ConfigError, DataError
from bertforge.core.io import atomic_write


# name -> (dtype, rank); the dtypes NVIDIA's writer uses, so its loader reads our files as-is.
SCHEMA: dict[str, tuple[str, int]] = {
    "input_ids": ("i4", 2),
    "input_mask": ("i1", 2),
    "segment_ids": ("i1", 2),
    "masked_lm_positions": ("i4", 2),
    "masked_lm_ids": ("i4", 2),
    "next_sentence_labels": ("i1", 1),
}


def write_hdf5_shard(
    path: str | Path,
    instances: Sequence[Any],
    *,
    max_seq_length: int,
    max_predictions: int,
    masked_lm_prob: float = 0.15,
    whole_word_masking: bool = False,
    is_continuation: np.ndarray | None = None,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int] | np.ndarray,
    rng: np.random.Generator,
    attrs: Mapping[str, str] | None = None,
) -> int:
    """Mask ``instances`` and write them as one NVIDIA-layout shard.

    ``instances`` are ``Instance``-like objects (tokens incl. [CLS]/[SEP], a_length,
    nsp_label), one row each, masked in order with draws from ``rng``; to write several
    passes with independent masks, pass the instances that many times. ``attrs`` are stored
    as file attributes (NVIDIA's readers ignore them). The file appears atomically: it is
    written under a temporary name in the same directory and renamed. Returns the number of
    rows written.
    """
    path = Path(path)
    if whole_word_masking and is_continuation is None:
        raise ConfigError("whole_word_masking=True needs is_continuation "
                          "(pass is_continuation=tokenizer.is_continuation)")
    specials = np.union1d(np.fromiter((int(i) for i in special_ids), dtype=np.int64), [mask_id])
    n, s, p = len(instances), max_seq_length, max_predictions
    shapes = {"input_ids": (n, s), "input_mask": (n, s), "segment_ids": (n, s),
              "masked_lm_positions": (n, p), "masked_lm_ids": (n, p), "next_sentence_labels": (n,)}
    data = {name: np.zeros(shape, dtype=np.int64) for name, shape in shapes.items()}
    for row, inst in enumerate(instances):
        tokens = np.asarray(inst.tokens, dtype=np.int64)
        length, a_length = len(tokens), int(inst.a_length)
        if length > s:
            raise DataError(f"{path}: instance {row} has {length} tokens, more than "
                            f"max_seq_length={s}; build instances with the same "
                            f"max_seq_length as the shard")
        if not 0 < a_length <= length:
            raise DataError(f"{path}: instance {row} has a_length={a_length} outside "
                            f"[1, {length}]")
        ids, positions, labels = mask_tokens(
            tokens, rng, masked_lm_prob=masked_lm_prob, max_predictions=p, mask_id=mask_id,
            vocab_size=vocab_size, special_ids=specials,
            is_continuation=is_continuation if whole_word_masking else None)
        data["input_ids"][row, :length] = ids
        data["input_mask"][row, :length] = 1
        data["segment_ids"][row, a_length:length] = 1
        data["masked_lm_positions"][row, : len(positions)] = positions
        data["masked_lm_ids"][row, : len(labels)] = labels
        data["next_sentence_labels"][row] = int(inst.nsp_label)

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            for name, (dtype, _) in SCHEMA.items():
                f.create_dataset(name, data=data[name].astype(dtype), compression="gzip")
            for key, value in (attrs or {}).items():
                f.attrs[key] = value

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)
    return n


def _check_schema(path: Path, f: h5py.File) -> tuple[int, int]:
    """DataError unless ``f`` has every dataset with the right rank; returns (rows, S)."""
    for name, (_, rank) in SCHEMA.items():
        if name not in f:
            raise DataError(f"{path}: missing dataset '{name}'; an NVIDIA/Google BERT hdf5 shard "
                            f"needs {', '.join(SCHEMA)}; re-create the shard")
        shape = f[name].shape
        if len(shape) != rank:
            want = "[N]" if rank == 1 else "[N, max_seq_length or max_predictions]"
            raise DataError(f"{path}: dataset '{name}' has shape {shape}, expected rank {rank} "
                            f"{want}; re-create the shard")
    rows = f["input_ids"].shape[0]
    s = f["input_ids"].shape[1]
    for name in SCHEMA:
        if f[name].shape[0] != rows:
            raise DataError(f"{path}: dataset '{name}' has {f[name].shape[0]} rows but "
                            f"'input_ids' has {rows}; the shard is inconsistent, re-create it")
    for name in ("input_mask", "segment_ids"):
        if f[name].shape[1] != s:
            raise DataError(f"{path}: dataset '{name}' is {f[name].shape[1]} wide but "
                            f"'input_ids' is {s}; re-create the shard")
    if f["masked_lm_positions"].shape[1] != f["masked_lm_ids"].shape[1]:
        raise DataError(f"{path}: 'masked_lm_positions' and 'masked_lm_ids' differ in width "
                        f"({f['masked_lm_positions'].shape[1]} vs "
                        f"{f['masked_lm_ids'].shape[1]}); re-create the shard")
    return rows, s


class Hdf5Dataset:
    """Reads NVIDIA/Google hdf5 shards (static masks; no manifest needed).

    Files are checked (metadata only) when constructed. gzip-chunked rows are expensive to read
    one by one, so a shard is decompressed whole on first use and the ``max_cached_files`` most
    recent shards are kept; ``shard_offsets`` tells the loader to read shard by shard, as
    NVIDIA's loader does. The cache is not pickled: worker processes fill their own.
    ``lengths`` reads every input_mask once, on first use.
    """

    def __init__(self, paths: Sequence[str | Path], *, max_cached_files: int = 2) -> None:
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise DataError("no hdf5 shards given; pass one or more *.hdf5 files")
        rows, widths = [], []
        for p in self.paths:
            try:
                with h5py.File(p, "r") as f:
                    n, s = _check_schema(p, f)
                    rows.append(n)
                    widths.append(s)
            except OSError as e:
                raise DataError(f"{p}: cannot open as hdf5 ({e}); give NVIDIA/Google BERT hdf5 "
                                f"shards") from e
        # shard_offsets[f] = global index of file f's first row; (F + 1,)
        self.shard_offsets = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
        self.max_seq_length = max(widths)
        """The shards' row width: no sample is longer."""
        self.fingerprint = f"{len(self)} samples in {len(self.paths)} hdf5 files"
        self.max_cached_files = max(2, max_cached_files)  # a micro-batch may span two shards
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        return state

    def _shard(self, k: int) -> dict[str, np.ndarray]:
        """Whole shard ``k`` in memory, stored dtypes; input_mask reduced to "length" (N,)."""
        shard = self._cache.get(k)
        if shard is not None:
            self._cache.move_to_end(k)
            return shard
        with h5py.File(self.paths[k], "r") as f:
            shard = {name: f[name][...] for name in SCHEMA if name != "input_mask"}
            shard["length"] = f["input_mask"][...].astype(np.int64).sum(axis=1)
        self._cache[k] = shard
        if len(self._cache) > self.max_cached_files:
            self._cache.popitem(last=False)
        return shard

    @property
    def lengths(self) -> np.ndarray:
        """(N,) int64 real tokens per sample (sum of input_mask)."""
        if self._lengths is None:
            parts = []
            for p in self.paths:
                with h5py.File(p, "r") as f:
                    parts.append(f["input_mask"][...].astype(np.int64).sum(axis=1))
            self._lengths = np.concatenate(parts)
        return self._lengths

    def get_static(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(input_ids (L,), token_type_ids (L,), mlm_labels (L,) with -100, nsp_label) int64."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        k = int(np.searchsorted(self.shard_offsets, i, side="right")) - 1
        r = i - int(self.shard_offsets[k])
        shard = self._shard(k)
        length = int(shard["length"][r])
        ids = shard["input_ids"][r, :length].astype(np.int64)
        types = shard["segment_ids"][r, :length].astype(np.int64)
        positions = shard["masked_lm_positions"][r].astype(np.int64)  # (P,)
        targets = shard["masked_lm_ids"][r].astype(np.int64)
        # Entries before the first 0 are real ([CLS] at position 0 is never predicted).
        is_pad = positions == 0
        n = int(np.argmax(is_pad)) if is_pad.any() else len(positions)
        positions, targets = positions[:n], targets[:n]
        if n and (positions.max() >= length or positions.min() < 0):
            raise DataError(f"{self.paths[k]}: row {r} predicts position {int(positions.max())} "
                            f"outside its {length} real tokens; the shard is corrupt")
        labels = np.full(length, IGNORE_INDEX, dtype=np.int64)
        labels[positions] = targets
        return ids, types, labels, int(shard["next_sentence_labels"][r])
