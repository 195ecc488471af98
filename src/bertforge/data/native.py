"""The native token-shard format: one safetensors file per shard, plus ``manifest.json``.

A shard holds N instances as four flat arrays (see docs/data-format.md):

    offsets     int64  [N+1]  instance i is input_ids[offsets[i]:offsets[i+1]]
    input_ids   uint16 [T]    (int32 when the vocabulary has >= 65536 entries); T = offsets[N]
    a_lengths   int16  [N]    length of "[CLS] A [SEP]"
    nsp_labels  int8   [N]    0 IsNext, 1 random/swapped, -1 no pair objective

Instances are stored sorted by length bin (stable, so the shuffled order survives inside a bin);
the bins and the shard's statistics live in the safetensors ``__metadata__``. We write the
safetensors container ourselves (it is an 8-byte header length, a JSON header, then raw bytes)
so that the bytes depend only on the data: sorted JSON keys, fixed tensor order, no hash-map order.
Any safetensors reader can open the files. Reading maps the file (``mmap``) and returns numpy views,
so opening a dataset of thousands of shards costs a few header reads.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from bertforge.data.instances import Instance
from bertforge.errors import DataError

FORMAT_NAME = "bertforge-native"
HDF5_DIR_FORMAT = "bertforge-hdf5"  # a prepare output of static-masked hdf5 shards
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARD_SUFFIX = ".safetensors"
DEFAULT_BIN_WIDTH = 32

_DTYPE_CODES = {
    np.dtype("<i8"): "I64",
    np.dtype("<i4"): "I32",
    np.dtype("<u2"): "U16",
    np.dtype("<i2"): "I16",
    np.dtype("i1"): "I8",
}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
# Fixed tensor order, widest element first, so every tensor starts aligned to its element size.
_TENSOR_ORDER = ("offsets", "input_ids", "a_lengths", "nsp_labels")


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
) -> dict[str, Any]:
    """Write ``instances`` (already shuffled) as one shard, atomically.

    The file appears at ``path`` only when complete (temp file, fsync, ``os.replace``), so an
    existing shard is a finished shard. Returns the metadata written (bins and stats).
    """
    path = Path(path)
    n = len(instances)
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


def _write_safetensors(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    header: dict[str, Any] = {"__metadata__": metadata}
    start = 0
    for name in _TENSOR_ORDER:
        arr = arrays[name]
        header[name] = {
            "dtype": _DTYPE_CODES[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [start, start + arr.nbytes],
        }
        start += arr.nbytes
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the spec allows space padding; 8 aligns the data
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for name in _TENSOR_ORDER:
                f.write(memoryview(np.ascontiguousarray(arrays[name])).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(file: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON via a temp file and ``os.replace``."""
    file = Path(file)
    tmp = file.with_name(f"{file.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file)


def write_manifest(root: str | Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically; its presence means "prepare finished"."""
    write_json_atomic(Path(root) / MANIFEST_NAME, manifest)


STAT_KEYS = ("documents", "sentences", "instances", "tokens", "skipped_documents")


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
    """Delete half-written shards (``*.tmp-<pid>``) left by an interrupted or killed run."""
    for split in splits:
        folder = Path(root) / split
        if folder.is_dir():
            for tmp in folder.glob("*.tmp-*"):
                tmp.unlink(missing_ok=True)


@dataclass
class Shard:
    """A shard mapped into memory: numpy views onto the file, valid while the object lives."""

    path: Path
    offsets: np.ndarray
    input_ids: np.ndarray
    a_lengths: np.ndarray
    nsp_labels: np.ndarray
    metadata: dict[str, str]

    def __len__(self) -> int:
        return len(self.a_lengths)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def bins(self) -> list[list[int]]:
        """``[[bin index, first instance, end instance), ...]`` within this shard."""
        return json.loads(self.metadata.get("bins", "[]"))

    @property
    def stats(self) -> dict[str, Any]:
        return json.loads(self.metadata.get("stats", "{}"))


def read_shard_metadata(path: str | Path) -> dict[str, str]:
    """Only the ``__metadata__`` of a shard (one small read), for resuming and summaries."""
    header, _ = _read_header(Path(path))
    return header.get("__metadata__", {})


def open_shard(path: str | Path) -> Shard:
    """Map a shard file; raise ``DataError`` if it is not a native shard."""
    path = Path(path)
    header, data_start = _read_header(path)
    meta = header.get("__metadata__", {})
    if meta.get("format") != FORMAT_NAME:
        raise DataError(f"{path}: not a {FORMAT_NAME} shard; re-create it with `bertforge prepare`")
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    views = {}
    for name in _TENSOR_ORDER:
        if name not in header:
            raise DataError(f"{path}: shard has no tensor {name!r}; re-create it with `bertforge prepare`")
        spec = header[name]
        dtype = _CODE_DTYPES[spec["dtype"]]
        begin, end = spec["data_offsets"]
        # np.frombuffer on the mmap gives a read-only view that keeps the mapping alive.
        views[name] = np.frombuffer(
            mm, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=data_start + begin
        )
    return Shard(path=path, metadata=meta, **views)


def _read_header(path: Path) -> tuple[dict[str, Any], int]:
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size <= 0 or size > 100_000_000:
                raise ValueError("bad header size")
            header = json.loads(f.read(size))
    except FileNotFoundError:
        raise DataError(f"{path}: shard file is missing; re-run `bertforge prepare` into this directory")
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a readable safetensors shard ({e}); re-run `bertforge prepare`")
    return header, 8 + size


@dataclass
class InstanceView:
    """One instance as numpy views (no copy): ``tokens`` [L], plus its segment split and label."""

    tokens: np.ndarray
    a_length: int
    nsp_label: int


def read_manifest(path: str | Path, *, native_only: bool = True) -> dict[str, Any]:
    """Load ``manifest.json`` from a prepared directory (or the file itself) and check its format.

    With ``native_only=False`` a manifest of an hdf5 output (``bertforge-hdf5``) is accepted too.
    """
    path = Path(path)
    file = path / MANIFEST_NAME if path.is_dir() else path
    if not file.is_file():
        raise DataError(
            f"{file}: no manifest; is {path} a directory written by `bertforge prepare`? "
            "If prepare was interrupted, re-run the same command to finish it"
        )
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{file}: not valid JSON ({e}); re-run `bertforge prepare`")
    fmt = manifest.get("format")
    if fmt == HDF5_DIR_FORMAT and native_only:
        raise DataError(f"{file}: this directory holds static-masked hdf5 shards, not native ones; "
                        f"read the *.hdf5 files in {file.parent / 'train'} instead")
    if fmt not in (FORMAT_NAME, HDF5_DIR_FORMAT):
        raise DataError(f"{file}: format is {fmt!r}, expected {FORMAT_NAME!r}; is this a "
                        "`bertforge prepare` output?")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{file}: format version {manifest.get('format_version')} is not supported by this "
            f"bertforge (reads version {FORMAT_VERSION}); re-run `bertforge prepare`"
        )
    return manifest


class NativeDataset:
    """Random access to one split of a prepared directory, across all its shards.

    Opening reads only ``manifest.json``; a shard is mapped the first time one of its instances is
    asked for. The object pickles without its mappings, so it can be handed to loader workers.
    """

    def __init__(self, path: str | Path, split: str = "train") -> None:
        self.root = Path(path)
        self.manifest = read_manifest(self.root)
        splits = self.manifest.get("splits", {})
        if split not in splits:
            raise DataError(
                f"{self.root}: no split {split!r} (available: {', '.join(sorted(splits)) or 'none'})"
            )
        self.split = split
        shards = splits[split]["shards"]
        self.shard_paths = [self.root / s["file"] for s in shards]
        counts = np.array([s["instances"] for s in shards], dtype=np.int64)
        # starts[k] = global index of shard k's first instance; starts[-1] = len(self).
        self.starts = np.concatenate([[0], np.cumsum(counts)])
        self._shards: dict[int, Shard] = {}
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard(self, k: int) -> Shard:
        """Shard ``k`` of this split, mapped on first use; checked against the manifest's count."""
        if k not in self._shards:
            shard = open_shard(self.shard_paths[k])
            expected = int(self.starts[k + 1] - self.starts[k])
            if len(shard) != expected:
                raise DataError(
                    f"{shard.path}: holds {len(shard)} instances but the manifest says {expected}; "
                    "the directory mixes two runs; re-run `bertforge prepare --overwrite`"
                )
            self._shards[k] = shard
        return self._shards[k]

    def locate(self, i: int) -> tuple[int, int]:
        """Global index -> (shard number, index inside the shard)."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"instance {i} out of range for {n} instances")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return k, i - int(self.starts[k])

    @property
    def fingerprint(self) -> str:
        """Identifies the data: same settings and inputs give the same fingerprint."""
        return f"{self.manifest.get('fingerprint', '')}:{self.split}"

    def get(self, i: int) -> tuple[np.ndarray, int, int]:
        """``(tokens [L] view, a_length, nsp_label)`` of instance ``i`` (the loader's protocol)."""
        item = self[i]
        return item.tokens, item.a_length, item.nsp_label

    def __getitem__(self, i: int) -> InstanceView:
        k, j = self.locate(int(i))
        s = self.shard(k)
        return InstanceView(
            tokens=s.input_ids[s.offsets[j] : s.offsets[j + 1]],
            a_length=int(s.a_lengths[j]),
            nsp_label=int(s.nsp_labels[j]),
        )

    @property
    def lengths(self) -> np.ndarray:
        """int64 [len(self)]: token count of every instance (maps every shard on first use)."""
        if self._lengths is None:
            parts = [self.shard(k).lengths for k in range(len(self.shard_paths))]
            self._lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return self._lengths

    def bins(self) -> list[tuple[int, int, int]]:
        """``(bin index, global start, global end)`` for every bin of every shard, in order.

        Instances in one range share a length bin of width ``manifest['length_bin_width']``, so
        batches drawn inside a range need padding to at most the bin's top length.
        """
        out = []
        for k in range(len(self.shard_paths)):
            base = int(self.starts[k])
            out.extend((b, base + s, base + e) for b, s, e in self.shard(k).bins)
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = {}  # mmaps do not pickle; each process maps its own
        return state


def iter_instances(shard: Shard) -> Iterable[InstanceView]:
    """Every instance of one shard, in stored (length-binned) order."""
    for j in range(len(shard)):
        yield InstanceView(
            tokens=shard.input_ids[shard.offsets[j] : shard.offsets[j + 1]],
            a_length=int(shard.a_lengths[j]),
            nsp_label=int(shard.nsp_labels[j]),
        )
