"""Pretraining data for the train loop: the rank's training stream and a validation stream.

Model-facing facts come from the prepared data: the vocabulary size and casing (the model's
embedding follows the data's vocab), whether sequences are sentence pairs (NSP/SOP head or MLM
only), and the tokenizer that is saved with every checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bertforge.config import PretrainConfig
from bertforge.core.limits import setting_changed
from bertforge.data import native
from bertforge.data.loader import PretrainingLoader
from bertforge.data.open import open_pretraining_dataset
from bertforge.errors import ConfigError
from bertforge.train.distributed import DistInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedData:
    """A prepared data directory as this run sees it: its manifest (read once; empty for
    NVIDIA/Google hdf5 shards, which carry none) and the tokenizer saved with it."""

    path: Path
    manifest: dict[str, Any]
    tokenizer: Any  # None when the data records no tokenizer

    @property
    def objective(self) -> str:
        """What the data trains: "nsp", "sop", "none" (BERT) or "denoise" (BART)."""
        return self.manifest.get("objective", "nsp")


def read_prepared(cfg: PretrainConfig) -> PreparedData:
    """The manifest and tokenizer of ``data.path``; ConfigError when it is not set."""
    if not cfg.data.path:
        raise ConfigError("data.path is not set: give --data.path=DIR (a `bertforge prepare` "
                          "output or NVIDIA/Google hdf5 shards)")
    path = Path(cfg.data.path)
    manifest = native.read_manifest(path, native_only=False) if (
        path.is_dir() and (path / native.MANIFEST_NAME).is_file()) else {}
    tokenizer = None
    if "tokenizer" in manifest:
        from bertforge.tokenization import load_tokenizer

        tokenizer = load_tokenizer(native.manifest_tokenizer(path, manifest))
    return PreparedData(path, manifest, tokenizer)


@dataclass
class PretrainData:
    train: PretrainingLoader
    validation: PretrainingLoader | None
    prepared: PreparedData

    @property
    def tokenizer(self) -> Any:
        """The tokenizer saved with checkpoints, or None."""
        return self.prepared.tokenizer

    @property
    def objective(self) -> str:
        return self.prepared.objective

    @property
    def has_pairs(self) -> bool:
        """Sentence pairs (an NSP/SOP head) rather than single segments."""
        return self.objective in ("nsp", "sop")

    @property
    def vocab_size(self) -> int | None:
        """None for NVIDIA/Google hdf5 (no manifest): the model's own."""
        return self.prepared.manifest.get("vocab_size")

    @property
    def do_lower_case(self) -> bool | None:
        return self.prepared.manifest.get("do_lower_case")

    @property
    def special_ids(self) -> dict[str, int]:
        """The prepared data's special token ids by name (pad, cls, sep, mask, unk); empty for
        hdf5 data."""
        return dict(self.prepared.manifest.get("special_ids", {}))

    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("pad")

    @property
    def max_seq_length(self) -> int | None:
        return self.prepared.manifest.get("max_seq_length")

    @property
    def vocab_tokens(self) -> tuple[str, ...] | None:
        """The data's vocabulary in id order (None for hdf5 data, which records none)."""
        return None if self.tokenizer is None else self.tokenizer.vocab

    @property
    def has_validation(self) -> bool:
        return self.validation is not None

    def validation_batches(self) -> Iterator[dict]:
        """The validation stream from its start (the same batches at every evaluation)."""
        assert self.validation is not None
        self.validation.rewind()
        return iter(self.validation)


def _loader_kwargs(cfg: PretrainConfig, info: DistInfo) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        micro_batch_size=cfg.train.micro_batch_size, rank=info.rank, world_size=info.world_size,
        seed=cfg.train.seed, bin_by_length=cfg.data.bin_by_length,
        pin_memory=info.device.type == "cuda")
    for key in ("masked_lm_prob", "max_predictions", "whole_word_masking"):
        value = getattr(cfg.data, key)
        if value is not None:
            kw[key] = value
    return kw


MakeBatch = Callable[[Any, Any], Any]  # (dataset, tokenizer) -> PretrainingLoader make_batch


def _check_batch_sizes(cfg: PretrainConfig, info: DistInfo) -> None:
    per_step, batch = cfg.train.micro_batch_size * info.world_size, cfg.train.global_batch_size
    if batch % per_step:
        raise ConfigError(
            f"train.global_batch_size={batch} is not a multiple of train.micro_batch_size="
            f"{cfg.train.micro_batch_size} x {info.world_size} ranks = {per_step}; choose a "
            f"multiple of {per_step} (e.g. {max(1, round(batch / per_step)) * per_step}) or "
            "another micro-batch size")


def open_pretrain_data(cfg: PretrainConfig, info: DistInfo, prepared: PreparedData | None = None,
                       make_batch: MakeBatch | None = None) -> PretrainData:
    """The training (and validation) streams of ``prepared`` (default: ``data.path`` read now);
    batches are BERT's masked ones unless ``make_batch`` builds another kind from a split's
    dataset and the tokenizer."""
    prepared = prepared or read_prepared(cfg)
    _check_batch_sizes(cfg, info)
    path, manifest, tokenizer = prepared.path, prepared.manifest, prepared.tokenizer
    kw = _loader_kwargs(cfg, info)
    if tokenizer is not None:
        kw["is_continuation"] = tokenizer.is_continuation  # used only by whole-word masking
    dataset, defaults = open_pretraining_dataset(path, split="train", overrides=kw,
                                                 manifest=manifest)
    # get_static first: hdf5's `lengths` is lazy and decompresses every shard.
    if hasattr(dataset, "get_static") or not hasattr(dataset, "lengths"):
        kw["bin_by_length"] = False  # static hdf5 shards are read in file order; no bins
    if cfg.data.pack_sequences:
        if make_batch is not None:
            raise ConfigError(f"data.pack_sequences packs BERT's masked-LM batches, but the data "
                              f"at {path} is {manifest.get('objective')} data; leave it off")
        kw["pack_width"] = manifest.get("max_seq_length") or dataset.max_seq_length
    maker = {} if make_batch is None else {"make_batch": make_batch(dataset, tokenizer)}
    train = PretrainingLoader(dataset, **{**defaults, **kw, **maker,
                                          "global_batch_size": cfg.train.global_batch_size,
                                          "num_workers": cfg.data.num_workers})
    validation = None
    if "validation" in manifest.get("splits", {}) and cfg.train.eval_batches:
        val_set, _ = open_pretraining_dataset(path, split="validation", overrides=kw,
                                              manifest=manifest)
        # Validation needs no accumulation: one micro-batch per rank per step, smaller if the
        # held-out split is small.
        micro = min(cfg.train.micro_batch_size, len(val_set) // info.world_size)
        if 1 <= micro < cfg.train.micro_batch_size:
            setting_changed("train.micro_batch_size (validation)", cfg.train.micro_batch_size,
                            micro, f"the validation split holds {len(val_set)} sequences "
                            f"for {info.world_size} rank(s)")
        if micro >= 1:
            maker = {} if make_batch is None else {"make_batch": make_batch(val_set, tokenizer)}
            validation = PretrainingLoader(val_set, **{
                **defaults, **kw, **maker, "micro_batch_size": micro,
                "global_batch_size": micro * info.world_size, "num_workers": 0,
                "bin_by_length": False})
        else:
            log.warning("validation split has %d sequences, fewer than one per rank; validation "
                        "is skipped", len(val_set))
    return PretrainData(train=train, validation=validation, prepared=prepared)
