"""Opening prepared pretraining data: pick the reader from what a path holds, build a loader.

A path may be a ``bertforge prepare`` output (native shards or static-masked hdf5, described by
``manifest.json``), a directory of NVIDIA/Google ``*.hdf5``/``*.h5`` shards, one such file, or a
list of them. The manifest of a prepare output also supplies the loader's defaults: special ids,
vocabulary size and masking settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.data import native
from bertforge.data.loader import PretrainingLoader
from bertforge.errors import DataError


def _manifest_defaults(root: Path, manifest: dict[str, Any],
                       overrides: dict[str, Any]) -> dict[str, Any]:
    """Loader keywords recorded by `bertforge prepare` (special ids, vocab, masking settings)."""
    special = {k: int(v) for k, v in manifest.get("special_ids", {}).items()}
    out: dict[str, Any] = {"special_ids": sorted(set(special.values()))}
    if "pad" in special:
        out["pad_id"] = special["pad"]
    if "mask" in special:
        out["mask_id"] = special["mask"]
    for key in ("vocab_size", "masked_lm_prob", "max_predictions", "whole_word_masking"):
        if key in manifest:
            out[key] = manifest[key]
    wwm = overrides.get("whole_word_masking", out.get("whole_word_masking", False))
    if wwm and overrides.get("is_continuation") is None and "tokenizer" in manifest:
        from bertforge.tokenization import load_tokenizer

        # The data's own tokenizer says what continues a word (WordPiece's "##", byte-level
        # BPE's tokens without "Ġ").
        out["is_continuation"] = load_tokenizer(
            native.manifest_tokenizer(root, manifest)).is_continuation
    return out


def open_pretraining_dataset(path: str | Path | Sequence[str | Path], *, split: str = "train",
                             overrides: dict[str, Any] | None = None,
                             manifest: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """Open prepared data; returns (dataset, loader keywords it implies).

    ``path`` is a `bertforge prepare` output (native or hdf5; ``split`` picks the split), a
    directory of NVIDIA/Google *.hdf5/*.h5 shards, one such file, or a list of them.
    ``manifest``: the output's manifest.json when the caller has read it already.
    """
    from bertforge.data.hdf5 import Hdf5Dataset

    if not isinstance(path, (str, Path)):
        return Hdf5Dataset([Path(f) for f in path]), {"pad_id": 0}
    p = Path(path)
    if manifest or (p.is_dir() and (p / native.MANIFEST_NAME).is_file()):
        manifest = manifest or native.read_manifest(p, native_only=False)
        defaults = _manifest_defaults(p, manifest, overrides or {})
        if manifest.get("format") == native.FORMAT_NAME:
            return native.NativeDataset(p, split, manifest), defaults
        splits = manifest.get("splits", {})
        if split not in splits:
            raise DataError(f"{p}: no split {split!r} (available: {', '.join(sorted(splits))})")
        files = [p / s["file"] for s in splits[split]["shards"]]
        return Hdf5Dataset(files), defaults
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in (".hdf5", ".h5"))
        if not files:
            raise DataError(f"{p}: neither a manifest.json (`bertforge prepare` output) nor "
                            f"*.hdf5/*.h5 shards found; give a prepared directory or hdf5 shards")
        return Hdf5Dataset(files), {"pad_id": 0}  # NVIDIA/Google shards pad with id 0
    if p.is_file():
        return Hdf5Dataset([p]), {"pad_id": 0}
    raise DataError(f"{p}: no such file or directory; give a directory made by "
                    f"`bertforge prepare` or NVIDIA/Google hdf5 shards")


def build_loader(path: str | Path | Sequence[str | Path], *, split: str = "train",
                 **kwargs: Any) -> PretrainingLoader:
    """A PretrainingLoader over prepared data, choosing the reader from what ``path`` holds.

    Keywords recorded in a prepare manifest (special ids, vocab size, masking settings) are
    defaults that ``kwargs`` override. hdf5 shards carry static masks, so masking keywords have
    no effect on them.
    """
    dataset, defaults = open_pretraining_dataset(path, split=split, overrides=kwargs)
    return PretrainingLoader(dataset, **{**defaults, **kwargs})


__all__ = ["build_loader", "open_pretraining_dataset"]
