"""Writing the native token-shard format (see :mod:`bertforge.data.native` for the layout).

``write_shard`` sorts a chunk's instances by length bin and writes the safetensors container
itself, so the bytes depend only on the data: sorted JSON keys, fixed tensor order, no hash-map
order. Instances that carry ``sentence_ends`` (objective ``denoise``) add the two sentence
tensors, permuted by the same length-bin sort as the instances. ``build_manifest`` and
``write_manifest`` describe a finished ``prepare`` run. Every file appears atomically
(:mod:`bertforge.core.io`), so an existing shard is a finished shard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from bertforge.data.instances import Instance
from bertforge.data.native import (
    DTYPE_CODES,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARD_SUFFIX,
    TENSOR_ORDER,
)
from bertforge.core.io import TMP_MARK, atomic_write, write_json_atomic

DEFAULT_BIN_WIDTH = 32
STAT_KEYS = ("documents", "sentences", "instances", "tokens", "skipped_documents")


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest dtype that holds every token id of a vocabulary of ``vocab_size`` entries."""
    return np.dtype("<u2") if vocab_size < 65536 else np.dtype("<i4")


def length_bin(lengths: np.ndarray, bin_width: int) -> np.ndarray:
    """Bin index of each length: lengths 1..w -> 0, w+1..2w -> 1, ... (a bin pads to its top)."""
    return (np.asarray(lengths, dtype=np.int64) - 1) // bin_width


def length_histogram(lengths: np.ndarray, bin_width: int) -> list[list[int]]:
    """``[[lowest length, highest length, count], ...]`` for the non-empty bins."""
    bins = length_bin(lengths, bin_width)
    ids, counts = np.unique(bins, return_counts=True)
    return [[int(b) * bin_width + 1, (int(b) + 1) * bin_width, int(c)] for b, c in zip(ids, counts)]


def write_shard(
    path: str | Path,
    instances: Sequence[Instance],
    *,
    vocab_size: int,
    bin_width: int = DEFAULT_BIN_WIDTH,
    stats: dict[str, Any] | None = None,
    sentences: bool | None = None,
) -> dict[str, Any]:
    """Write ``instances`` (already shuffled) as one shard, atomically.

    ``sentences``: store the sentence tensors (True: every instance must carry
    ``sentence_ends``; an empty shard then holds empty ones), leave them out (False), or store
    them exactly when the instances carry boundaries (None; all or none must).
    The file appears at ``path`` only when complete (temp file, fsync, ``os.replace``), so an
    existing shard is a finished shard. Returns the metadata written (bins and stats).
    """
    path = Path(path)
    n = len(instances)
    carried = sum(x.sentence_ends is not None for x in instances)
    if sentences is None:
        sentences = carried > 0
    if sentences and carried < n:
        raise ValueError(f"instances: {n - carried} of {n} carry no sentence_ends while writing "
                         f"{path} with sentence boundaries; build all with objective 'denoise'")
    lengths = np.fromiter((len(x.tokens) for x in instances), dtype=np.int64, count=n)
    # Stable sort keeps the caller's (shuffled) order within each bin; sequences of similar
    # length then sit together, so a loader can batch by bin with little padding.
    bins = length_bin(lengths, bin_width)
    order = np.argsort(bins, kind="stable")
    dtype = token_dtype(vocab_size)
    offsets = np.zeros(n + 1, dtype="<i8")
    np.cumsum(lengths[order], out=offsets[1:])
    flat = np.fromiter(
        (t for k in order for t in instances[k].tokens), dtype=np.int64, count=int(offsets[-1])
    )
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(f"token id outside [0, {vocab_size}) while writing {path}")
    arrays = {
        "offsets": offsets,
        "input_ids": flat.astype(dtype),
        "a_lengths": np.array([instances[k].a_length for k in order], dtype="<i2"),
        "nsp_labels": np.array([instances[k].nsp_label for k in order], dtype="i1"),
    }
    if sentences:
        arrays.update(_sentence_arrays(instances, order, lengths[order], path))
    sorted_bins = bins[order]
    starts = np.flatnonzero(np.r_[True, sorted_bins[1:] != sorted_bins[:-1]]) if n else []
    bin_table = [
        [int(sorted_bins[s]), int(s), int(e)] for s, e in zip(starts, [*starts[1:], n])
    ]
    metadata = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "bin_width": str(bin_width),
        "bins": json.dumps(bin_table),  # [[bin index, first instance, end instance), ...]
        "stats": json.dumps(stats or {}, sort_keys=True),
    }
    _write_safetensors(path, arrays, metadata)
    return {"bins": bin_table, "stats": stats or {}}


def _sentence_arrays(instances: Sequence[Instance], order: np.ndarray, lengths: np.ndarray,
                     path: Path) -> dict[str, np.ndarray]:
    """``sentence_offsets`` [N+1] and ``sentence_ends`` [M] in stored order ``order``.

    ``lengths`` [N] are the token counts in that order. Raises ``ValueError`` unless every
    instance's ends increase from at least 2 to exactly its length - 1 (so each sentence is
    non-empty and the ends fit int16 whenever the length does).
    """
    n = len(order)
    counts = np.fromiter((len(instances[k].sentence_ends) for k in order), dtype=np.int64,
                         count=n)
    offsets = np.zeros(n + 1, dtype="<i8")
    np.cumsum(counts, out=offsets[1:])
    ends = np.fromiter((e for k in order for e in instances[k].sentence_ends), dtype=np.int64,
                       count=int(offsets[-1]))
    if n:
        owner = np.repeat(np.arange(n), counts)  # instance of each end
        same = owner[1:] == owner[:-1]
        nonempty = counts > 0
        ok = (nonempty.all() and ends[offsets[:-1]].min() >= 2
              and np.array_equal(ends[offsets[1:] - 1], lengths - 1)
              and bool(np.all(np.diff(ends)[same] > 0)) and lengths.max() <= 32768)
        if not ok:
            raise ValueError(f"instances: sentence_ends must increase from >= 2 to len(tokens) - 1 "
                             f"(<= 32767) in every instance; got other values while writing {path}")
    return {"sentence_offsets": offsets, "sentence_ends": ends.astype("<i2")}


def _write_safetensors(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """The safetensors container by hand: header length (u64 LE), JSON header, raw tensor bytes.

    Tensors go in ``TENSOR_ORDER``, skipping the optional ones ``arrays`` does not hold.
    """
    names = [name for name in TENSOR_ORDER if name in arrays]
    header: dict[str, Any] = {"__metadata__": metadata}
    start = 0
    for name in names:
        arr = arrays[name]
        header[name] = {
            "dtype": DTYPE_CODES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [start, start + arr.nbytes],
        }
        start += arr.nbytes
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the spec allows space padding; 8 aligns the data

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name in names:
                f.write(memoryview(np.ascontiguousarray(arrays[name])).cast("B"))

    atomic_write(path, write)


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically; its presence means "prepare finished"."""
    write_json_atomic(Path(root) / MANIFEST_NAME, manifest)


def build_manifest(settings: dict[str, Any], fingerprint: str, results: list[dict[str, Any]],
                   shard_names: dict[int, dict[str, str]], tokenizer_dir: str) -> dict[str, Any]:
    """The manifest of a finished run (see docs/data-format.md).

    ``results`` hold one entry per chunk: ``{"index": k, "splits": {split: stats}}`` with the
    stats stored in each shard; ``shard_names[k][split]`` is that shard's relative path.
    """
    manifest: dict[str, Any] = {k: v for k, v in settings.items() if k != "inputs"}
    manifest.update(fingerprint=fingerprint, tokenizer=tokenizer_dir, splits={},
                    inputs=[{"path": p, "bytes": b} for p, b in settings["inputs"]])
    width = settings["length_bin_width"]
    ordered = sorted(results, key=lambda r: r["index"])
    for split in ordered[0]["splits"] if ordered else []:
        shards, hist = [], {}
        for r in ordered:
            st = r["splits"][split]
            shards.append({"file": shard_names[r["index"]][split],
                           **{k: int(st[k]) for k in STAT_KEYS}})
            for lo, _hi, count in st["length_histogram"]:
                hist[lo] = hist.get(lo, 0) + count
        manifest["splits"][split] = {
            **{k: sum(s[k] for s in shards) for k in STAT_KEYS}, "shards": shards,
            "length_histogram": [[lo, lo + width - 1, hist[lo]] for lo in sorted(hist)]}
    manifest["counts"] = {k: sum(v[k] for v in manifest["splits"].values()) for k in STAT_KEYS}
    return manifest


def shard_name(split: str, index: int, suffix: str = SHARD_SUFFIX) -> str:
    """Relative path of chunk ``index``'s shard of ``split``: ``train/shard-00007.safetensors``."""
    return f"{split}/shard-{index:05d}{suffix}"


def remove_temp_files(root: str | Path, splits: Iterable[str]) -> None:
    """Delete half-written shards (``*.tmp-*``) left by an interrupted or killed run."""
    for split in splits:
        folder = Path(root) / split
        if folder.is_dir():
            for tmp in folder.glob(f"*{TMP_MARK}*"):
                tmp.unlink(missing_ok=True)


