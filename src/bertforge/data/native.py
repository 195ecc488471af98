"""The native token-shard format: one safetensors file per shard, plus ``manifest.json``.

A shard holds N instances as four flat arrays (see docs/data-format.md):

    offsets     int64  [N+1]  instance i is input_ids[offsets[i]:offsets[i+1]]
    input_ids   uint16 [T]    (int32 when the vocabulary has >= 65536 entries); T = offsets[N]
    a_lengths   int16  [N]    length of "[CLS] A [SEP]"
    nsp_labels  int8   [N]    0 IsNext, 1 random/swapped, -1 no pair objective

Data prepared with objective ``denoise`` adds where each sentence of an instance ends, so that
sentence permutation can move whole sentences at load time:

    sentence_offsets  int64  [N+1]  instance i's ends are sentence_ends[so[i]:so[i+1]]
    sentence_ends     int16  [M]    exclusive end positions inside the instance's tokens,
                                    increasing; the first sentence starts at 1 (after [CLS]),
                                    the last ends at the length - 1 (before [SEP])

These two are optional (a shard of another objective, or one written before they existed, has
neither), so the addition keeps format version 1; a reader that knows only the four arrays
reads such shards correctly. On disk the tensors follow ``TENSOR_ORDER``.

Instances are stored sorted by length bin (stable, so the shuffled order survives inside a bin);
the bins and the shard's statistics live in the safetensors ``__metadata__``. The writer
(:mod:`bertforge.data.native_writer`) builds the safetensors container itself (an 8-byte header
length, a JSON header, then raw bytes) so the bytes depend only on the data; any safetensors
reader can open the files. This module reads: it maps the file (``mmap``) and returns numpy
views, so opening a dataset of thousands of shards costs a few header reads.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from bertforge.core.jsonfile import read_json_object
from bertforge.core.paths import named_file
from bertforge.data.manifest_shape import check_manifest_shape
from bertforge.errors import DataError

FORMAT_NAME = "bertforge-native"
HDF5_DIR_FORMAT = "bertforge-hdf5"  # a prepare output of static-masked hdf5 shards
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARD_SUFFIX = ".safetensors"

DTYPE_CODES = {
    np.dtype("<i8"): "I64",
    np.dtype("<i4"): "I32",
    np.dtype("<u2"): "U16",
    np.dtype("<i2"): "I16",
    np.dtype("i1"): "I8",
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
# Fixed tensor order, widest element first, so every tensor starts aligned to its element size.
# The sentence pair is optional; without it the order (and the bytes) are those of the four
# required tensors alone.
TENSOR_ORDER = ("offsets", "sentence_offsets", "input_ids", "a_lengths", "sentence_ends",
                "nsp_labels")
REQUIRED_TENSORS = ("offsets", "input_ids", "a_lengths", "nsp_labels")
SENTENCE_TENSORS = ("sentence_offsets", "sentence_ends")


@dataclass
class Shard:
    """A shard mapped into memory: numpy views onto the file, valid while the object lives.

    ``sentence_offsets`` [N+1] and ``sentence_ends`` [M] are None when the shard holds no
    sentence boundaries (any objective but ``denoise``).
    """

    path: Path
    offsets: np.ndarray
    input_ids: np.ndarray
    a_lengths: np.ndarray
    nsp_labels: np.ndarray
    metadata: dict[str, str]
    sentence_offsets: np.ndarray | None = None
    sentence_ends: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.a_lengths)

    @property
    def has_sentences(self) -> bool:
        return self.sentence_ends is not None

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
    for name in REQUIRED_TENSORS:
        if name not in header:
            raise DataError(f"{path}: shard has no tensor {name!r}; re-create it with `bertforge prepare`")
    present = [name for name in SENTENCE_TENSORS if name in header]
    if len(present) == 1:
        raise DataError(f"{path}: shard has tensor {present[0]!r} without its partner (it needs "
                        f"both of {', '.join(SENTENCE_TENSORS)}); re-create it with `bertforge "
                        "prepare`")
    views = {}
    for name in (n for n in TENSOR_ORDER if n in header):
        spec = header[name]
        dtype = CODE_DTYPES[spec["dtype"]]
        begin, end = spec["data_offsets"]
        # np.frombuffer on the mmap gives a read-only view that keeps the mapping alive.
        views[name] = np.frombuffer(
            mm, dtype=dtype, count=(end - begin) // dtype.itemsize, offset=data_start + begin
        )
    if present and len(views["sentence_offsets"]) != len(views["offsets"]):
        raise DataError(f"{path}: shard has {len(views['sentence_offsets'])} sentence offsets for "
                        f"{len(views['a_lengths'])} instances; re-create it with "
                        "`bertforge prepare`")
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


def read_manifest(path: str | Path, *, native_only: bool = True,
                  required: Sequence[str] = ()) -> dict[str, Any]:
    """Load ``manifest.json`` from a prepared directory (or the file itself) and check its format
    and the shape of every key a reader reads (``data.manifest_shape``).

    With ``native_only=False`` a manifest of an hdf5 output (``bertforge-hdf5``) is accepted too.
    ``required``: keys the caller reads without a default (``check_manifest_shape``).
    """
    path = Path(path)
    file = path / MANIFEST_NAME if path.is_dir() else path
    if not file.is_file():
        raise DataError(
            f"{file}: no manifest; is {path} a directory written by `bertforge prepare`? "
            "If prepare was interrupted, re-run the same command to finish it"
        )
    manifest = read_json_object(file, hint="re-run `bertforge prepare`")
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
    check_manifest_shape(manifest, file, required)
    return manifest


def manifest_tokenizer(root: Path, manifest: dict[str, Any],
                       default: str | None = None) -> Path | None:
    """The tokenizer folder a prepared directory's manifest names (``default`` when it names
    none), confined to ``root`` (``bertforge.core.paths.named_file``); None when neither."""
    name = manifest.get("tokenizer", default)
    if name is None:
        return None
    return named_file(root, name, named_by=f"{root / MANIFEST_NAME} (tokenizer)",
                      error=DataError, fix="re-run `bertforge prepare`")


class NativeDataset:
    """Random access to one split of a prepared directory, across all its shards.

    Opening reads only ``manifest.json``; a shard is mapped the first time one of its instances is
    asked for. The object pickles without its mappings, so it can be handed to loader workers.
    """

    def __init__(self, path: str | Path, split: str = "train",
                 manifest: dict[str, Any] | None = None) -> None:
        self.root = Path(path)
        # A caller that read the manifest (and so checked it) hands it over.
        self.manifest = manifest if manifest is not None else read_manifest(self.root)
        splits = self.manifest.get("splits", {})
        if split not in splits:
            raise DataError(
                f"{self.root}: no split {split!r} (available: {', '.join(sorted(splits)) or 'none'})"
            )
        self.split = split
        shards = splits[split]["shards"]
        self.shard_paths = [named_file(self.root, s.get("file"), error=DataError,
                                       named_by=f"{self.root / MANIFEST_NAME} (split {split})",
                                       fix="re-run `bertforge prepare`") for s in shards]
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

    @property
    def has_sentences(self) -> bool:
        """Whether the split stores sentence boundaries (prepared with objective ``denoise``).

        One run writes every shard of a split the same way, so the first shard tells (mapping it).
        """
        return bool(self.shard_paths) and self.shard(0).has_sentences

    def get_sentences(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens [L] view, sentence_ends [M] int64)`` of instance ``i``, for denoising.

        ``sentence_ends`` are the exclusive end positions of its sentences inside ``tokens``
        (see :class:`bertforge.data.instances.Instance`). Raises ``DataError`` when the data
        was prepared without sentence boundaries.
        """
        k, j = self.locate(int(i))
        s = self.shard(k)
        if s.sentence_offsets is None or s.sentence_ends is None:
            raise DataError(
                f"{self.root}: split {self.split!r} has no sentence boundaries (prepared with "
                f"objective {self.manifest.get('objective', 'unknown')!r}, shard {s.path.name}); "
                "re-run `bertforge prepare --objective denoise` into a new --output"
            )
        tokens = s.input_ids[s.offsets[j] : s.offsets[j + 1]]
        ends = s.sentence_ends[s.sentence_offsets[j] : s.sentence_offsets[j + 1]]
        return tokens, ends.astype(np.int64)

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
