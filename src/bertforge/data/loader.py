"""The stateful, resumable pretraining loader: sample order, rank/micro-batch split, collation.

Determinism contract (docs/loader.md): the order of an epoch depends only on (seed, epoch), the
dataset and the batch settings; the mask of a sample only on (seed, epoch, sample index).
Global batch g of an epoch holds ``global_batch_size`` samples, split row-major into
``world_size * k`` chunks of ``micro_batch_size`` (k = accumulation steps); rank r's j-th
micro-step takes chunk ``c = r * k + j``. One process with k accumulation steps and k processes
with one step each therefore see the same global batches with the same masks, and ranks never
share a sample. Opening data from a path and building a loader over it: ``bertforge.data.open``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from bertforge.core.signals import ignore_stop_signals, starting_workers
from bertforge.data.collate.mlm import MaskingSpec, MicroBatchMaker, masking_spec
from bertforge.data.masking import arrange_rng, order_rng
from bertforge.errors import CheckpointError, DataError


class PretrainingDataset(Protocol):
    """Unmasked token sequences; the loader masks them on the fly."""

    lengths: np.ndarray  # (N,) tokens per sample incl. [CLS]/[SEP]

    def __len__(self) -> int: ...

    def get(self, i: int) -> tuple[np.ndarray, int, int]:
        """(tokens (L,), a_length = len("[CLS] A [SEP]"), nsp_label in {0, 1, -1})."""
        ...


class StaticMaskedDataset(Protocol):
    """Pre-masked samples (NVIDIA/Google hdf5); the loader only orders and pads them."""

    def __len__(self) -> int: ...

    def get_static(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(input_ids (L,), token_type_ids (L,), mlm_labels (L,) with -100, nsp_label)."""
        ...


def length_bins(lengths: np.ndarray, num_bins: int) -> np.ndarray:
    """Bin id per sample: equal-width length ranges over [1, max length]. (N,) int64."""
    width = max(1, -(-int(lengths.max()) // num_bins))
    return np.clip((np.asarray(lengths, dtype=np.int64) - 1) // width, 0, num_bins - 1)


def _cut(stream: np.ndarray, global_batch_size: int, drop_last: bool) -> np.ndarray:
    """(n, G) rows of ``stream``; the tail is dropped or completed from the stream's start."""
    g = global_batch_size
    n = len(stream) // g if drop_last else -(-len(stream) // g)
    return np.resize(stream, n * g).reshape(n, g)


def epoch_batches(num_samples: int, global_batch_size: int, *, seed: int, epoch: int,
                  bins: np.ndarray | None = None, shard_offsets: np.ndarray | None = None,
                  drop_last: bool = True) -> np.ndarray:
    """The global batches of one epoch as sample indices, (num_batches, global_batch_size).

    Default: each bin (all samples when ``bins`` is None) is shuffled and cut into whole global
    batches; a bin's remainder is dropped, or with ``drop_last=False`` completed by wrapping
    around to the bin's first samples; the batches of all bins are then shuffled together.

    With ``shard_offsets`` ((F + 1,) first index of each shard; for files that are only cheap
    to read whole, like gzip hdf5) the shards are visited in random order, each shard's samples
    shuffled, and the resulting stream is cut into batches in order, so a batch touches one or
    two shards.
    """
    rng = order_rng(seed, epoch)
    if shard_offsets is not None:
        starts, ends = shard_offsets[:-1], shard_offsets[1:]
        stream = [starts[f] + rng.permutation(ends[f] - starts[f])
                  for f in rng.permutation(len(starts))]
        return _cut(np.concatenate(stream), global_batch_size, drop_last)
    if bins is None:
        groups = [np.arange(num_samples)]
    else:
        by_bin = np.argsort(bins, kind="stable")
        groups = np.split(by_bin, np.cumsum(np.bincount(bins))[:-1])
    out = [_cut(members[rng.permutation(len(members))], global_batch_size, drop_last)
           for members in groups if len(members)]  # a loop over a handful of bins
    batches = np.concatenate(out) if out else np.empty((0, global_batch_size), dtype=np.int64)
    return batches[rng.permutation(len(batches))]


def accumulation_steps(global_batch_size: int, micro_batch_size: int, world_size: int) -> int:
    """k = global / (micro x world); ValueError naming the numbers when not a whole number."""
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step:
        nearest = max(1, round(global_batch_size / per_step)) * per_step
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by micro_batch_size="
            f"{micro_batch_size} x world_size={world_size} = {per_step}; choose a global batch "
            f"size that is a multiple of {per_step} (e.g. {nearest}) or change the micro batch "
            f"size")
    return global_batch_size // per_step


class PretrainingLoader:
    """Infinite iterator of this rank's micro-batches, resumable at any global batch.

    The order is generic, what a batch holds is not: by default samples are masked for
    pretraining (``MicroBatchMaker``); a task may pass ``make_batch`` instead, a picklable
    map-style dataset whose ``__getitem__((epoch, indices))`` returns the micro-batch (workers
    call it, as they call ``MicroBatchMaker``'s).

    A dataset with a method ``arrange_batches(batches, rng) -> batches`` may rearrange each
    epoch's (n, G) global batches (the same samples, e.g. so that no batch holds a text twice:
    ``bertforge.data.distinct``); ``rng`` is ``masking.arrange_rng(seed, epoch)``, so the
    arranged order still depends only on (seed, epoch, dataset) and resumes exactly.

    Iterating yields contracts.md micro-batch dicts forever; ``epoch`` advances on its own and
    the train loop decides when to stop. ``state_dict()`` taken after the last micro-batch of a
    global batch resumes at exactly the next global batch (a partially consumed global batch is
    replayed from its start). Only one iterator should be active at a time.
    """

    def __init__(self, dataset: Any, *, global_batch_size: int, micro_batch_size: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0, masked_lm_prob: float = 0.15,
                 max_predictions: int = 20, whole_word_masking: bool = False,
                 is_continuation: np.ndarray | None = None, mask_id: int | None = None,
                 pad_id: int = 0, vocab_size: int | None = None,
                 special_ids: Sequence[int] | np.ndarray = (), bin_by_length: bool = False,
                 num_bins: int = 8, drop_last: bool = True, num_workers: int = 0,
                 pad_to_multiple_of: int = 8, pin_memory: bool = False,
                 make_batch: Any = None, pack_width: int | None = None) -> None:
        for name, value in (("global_batch_size", global_batch_size),
                            ("micro_batch_size", micro_batch_size), ("world_size", world_size),
                            ("num_bins", num_bins), ("pad_to_multiple_of", pad_to_multiple_of)):
            if value < 1:
                raise ValueError(f"{name}={value} must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        self.dataset = dataset
        self.global_batch_size, self.micro_batch_size = global_batch_size, micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.accumulation_steps = accumulation_steps(global_batch_size, micro_batch_size,
                                                     world_size)
        self.seed, self.drop_last = seed, drop_last
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.static_masks = hasattr(dataset, "get_static")
        if make_batch is None:
            masking = None if self.static_masks else masking_spec(
                masked_lm_prob=masked_lm_prob, max_predictions=max_predictions,
                whole_word_masking=whole_word_masking, is_continuation=is_continuation,
                mask_id=mask_id, vocab_size=vocab_size, special_ids=special_ids, pad_id=pad_id)
            make_batch = MicroBatchMaker(dataset, seed=seed, masking=masking, pad_id=pad_id,
                                         pad_to_multiple_of=pad_to_multiple_of,
                                         pack_width=pack_width)
        elif pack_width is not None:
            raise ValueError("pack_width packs BERT's masked batches; a custom make_batch "
                             "lays out its own batches")
        self._maker = make_batch
        self._shard_offsets = getattr(dataset, "shard_offsets", None)
        if bin_by_length and self._shard_offsets is not None:
            raise ValueError("bin_by_length=True needs random access to samples, but this "
                             "dataset is read shard by shard (hdf5); pass bin_by_length=False "
                             "or prepare native shards with `bertforge prepare`")
        # Only binning needs the lengths; hdf5 datasets compute them lazily (a full read).
        self._bins = length_bins(np.asarray(dataset.lengths), num_bins) if bin_by_length else None
        self.batches_per_epoch = self._count_batches(len(dataset))
        self.epoch, self.batches_consumed = 0, 0
        self._fingerprint = self._dataset_fingerprint()
        self._order_cache: tuple[int, np.ndarray] | None = None

    def _count_batches(self, n: int) -> int:
        counts = [n] if self._bins is None else np.bincount(self._bins).tolist()
        g = self.global_batch_size
        total = sum(c // g if self.drop_last else -(-c // g) for c in counts)
        if total == 0:
            where = "any length bin" if self._bins is not None else "the dataset"
            raise DataError(f"{where} holds fewer samples than one global batch of "
                            f"{g} (dataset has {n}); use a smaller global batch size or more "
                            f"data")
        return total

    def _dataset_fingerprint(self) -> str:
        own = getattr(self.dataset, "fingerprint", None)
        if own is not None:
            return str(own)
        lengths = np.asarray(self.dataset.lengths, dtype=np.int64)
        return f"{len(self.dataset)} samples, {int(lengths.sum())} tokens"

    def __len__(self) -> int:
        """Micro-batches this rank yields per epoch."""
        return self.batches_per_epoch * self.accumulation_steps

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """All global batches of ``epoch``, (batches_per_epoch, global_batch_size) indices."""
        if self._order_cache is None or self._order_cache[0] != epoch:
            order = epoch_batches(len(self.dataset), self.global_batch_size, seed=self.seed,
                                  epoch=epoch, bins=self._bins,
                                  shard_offsets=self._shard_offsets, drop_last=self.drop_last)
            arrange = getattr(self.dataset, "arrange_batches", None)
            if arrange is not None:
                order = _arranged(order, arrange(order, arrange_rng(self.seed, epoch)))
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def rank_indices(self, epoch: int, batch: int) -> np.ndarray:
        """This rank's samples in global batch ``batch``: (k, micro_batch_size); row j = step j."""
        k = self.accumulation_steps
        chunks = self.epoch_batches(epoch)[batch].reshape(self.world_size * k,
                                                          self.micro_batch_size)
        return chunks[self.rank * k:(self.rank + 1) * k]

    def _keys(self, epoch: int, start: int) -> Iterator[tuple[int, np.ndarray]]:
        """(epoch, micro-batch indices) for this rank from a position on, forever."""
        while True:
            for g in range(start, self.batches_per_epoch):
                for indices in self.rank_indices(epoch, g):
                    yield epoch, indices
            epoch, start = epoch + 1, 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        keys = self._keys(self.epoch, self.batches_consumed)
        if self.num_workers == 0:
            batches: Any = map(self._maker.__getitem__, keys)
            if self.pin_memory:  # what the DataLoader's pinning thread does for workers
                batches = map(pin_batch, batches)
        else:
            # The order is decided here; workers only read, mask and pad. The DataLoader returns
            # results in sampler order, so the stream equals the num_workers=0 stream.
            # A private generator: DataLoader draws its workers' base seed from it instead of the
            # global torch RNG, so starting the loader never shifts the model's dropout stream
            # (a resumed run must draw the same dropout masks as an uninterrupted one).
            # Workers ignore stop signals from their first instruction: a Ctrl-C or SIGTERM
            # sent to the whole process group is the main process's to act on (it finishes the
            # step and saves), and a worker killed by it would end the run with an error.
            with starting_workers():
                batches = iter(torch.utils.data.DataLoader(
                    self._maker, batch_size=None, sampler=_KeyStream(keys),
                    num_workers=self.num_workers, pin_memory=self.pin_memory,
                    worker_init_fn=ignore_stop_signals,
                    generator=torch.Generator().manual_seed(self.seed)))
        step = 0
        for batch in batches:
            step += 1
            if step == self.accumulation_steps:
                # Count the global batch before handing out its last micro-batch, so a state
                # saved after the optimizer step points at the next global batch.
                step = 0
                self.batches_consumed += 1
                if self.batches_consumed == self.batches_per_epoch:
                    self.epoch, self.batches_consumed = self.epoch + 1, 0
            yield batch

    def rewind(self) -> None:
        """Go back to the start of the stream (epoch 0, global batch 0) with the same seed, so
        the next iterator yields the very same batches as the first one did."""
        self.epoch, self.batches_consumed = 0, 0

    def state_dict(self) -> dict[str, Any]:
        """Position and identity of the stream; plain ints and strings (JSON-safe)."""
        return {"epoch": self.epoch, "batches_consumed": self.batches_consumed, "seed": self.seed,
                "global_batch_size": self.global_batch_size,
                "dataset_fingerprint": self._fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the next global batch of a saved stream (adopting its seed)."""
        missing = {"epoch", "batches_consumed", "seed", "global_batch_size",
                   "dataset_fingerprint"} - set(state)
        if missing:
            raise CheckpointError(f"loader state is missing {sorted(missing)}; it was not written "
                                  f"by PretrainingLoader.state_dict()")
        if state["dataset_fingerprint"] != self._fingerprint:
            raise CheckpointError(
                f"loader state was saved for a dataset with {state['dataset_fingerprint']}, but "
                f"this dataset has {self._fingerprint}; resume with the same prepared data, or "
                f"start the data stream afresh (e.g. for a new phase) without loading this state")
        if state["global_batch_size"] != self.global_batch_size:
            raise CheckpointError(
                f"loader state was saved with global_batch_size={state['global_batch_size']}, "
                f"but this run uses {self.global_batch_size}; the batch order would differ, so "
                f"keep the global batch size when resuming (micro batch size and world size may "
                f"change)")
        if not 0 <= int(state["batches_consumed"]) < self.batches_per_epoch:
            raise CheckpointError(
                f"loader state batches_consumed={state['batches_consumed']} is outside "
                f"[0, {self.batches_per_epoch}) for this dataset and configuration")
        self.seed = int(state["seed"])
        if hasattr(self._maker, "seed"):  # makers that draw noise or masks from the seed
            self._maker.seed = self.seed
        self._order_cache = None
        self.epoch, self.batches_consumed = int(state["epoch"]), int(state["batches_consumed"])


def _arranged(order: np.ndarray, arranged: Any) -> np.ndarray:
    """A dataset's rearrangement of ``order``, checked to hold the very same samples: anything
    else would silently drop or repeat data."""
    out = np.asarray(arranged, dtype=np.int64)
    if out.shape != order.shape or not np.array_equal(np.sort(out, axis=None),
                                                      np.sort(order, axis=None)):
        raise ValueError(f"arrange_batches returned {out.shape} batches that are not a "
                         f"rearrangement of the {order.shape} it was given")
    return out


def pin_batch(batch: dict) -> dict:
    """The batch with its tensors in page-locked memory, so copies to a GPU are asynchronous
    (``non_blocking=True`` from pageable memory waits for the copy)."""
    return {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in batch.items()}


class _KeyStream:
    """Wraps the key generator as a DataLoader sampler (iterated once, never sized)."""

    def __init__(self, keys: Iterator[tuple[int, np.ndarray]]) -> None:
        self._keys = keys

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return self._keys


__all__ = ["PretrainingDataset", "StaticMaskedDataset", "MaskingSpec", "MicroBatchMaker",
           "PretrainingLoader", "accumulation_steps", "collate_rows", "epoch_batches",
           "length_bins", "masking_spec"]
