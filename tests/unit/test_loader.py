"""PretrainingLoader: batch contract, rank/accumulation equivalence, state, workers, bins."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from bertforge.data.loader import PretrainingLoader, length_bins
from bertforge.errors import CheckpointError, DataError

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 300


class ToyDataset:
    """In-memory implementation of the loader's dataset protocol."""

    def __init__(self, n: int, *, min_len: int = 8, max_len: int = 40, seed: int = 0) -> None:
        gen = np.random.default_rng(seed)
        self.samples = []
        for i in range(n):
            length = int(gen.integers(min_len, max_len + 1))
            a_len = int(gen.integers(2, length - 1))  # [CLS] A [SEP] | B [SEP]
            tokens = gen.integers(5, VOCAB, length)
            tokens[0], tokens[a_len - 1], tokens[-1] = CLS, SEP, SEP
            nsp = -1 if i % 7 == 0 else i % 2
            self.samples.append((tokens, a_len, nsp))
        self.lengths = np.array([len(t) for t, _, _ in self.samples])

    def __len__(self) -> int:
        return len(self.samples)

    def get(self, i: int) -> tuple[np.ndarray, int, int]:
        return self.samples[i]


def make(ds: ToyDataset, **kw) -> PretrainingLoader:
    base = dict(global_batch_size=8, micro_batch_size=2, seed=3, mask_id=MASK, pad_id=PAD,
                vocab_size=VOCAB, special_ids=[PAD, UNK, CLS, SEP, MASK])
    return PretrainingLoader(ds, **{**base, **kw})


def take(loader: PretrainingLoader, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(iter(loader), n))


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


def test_micro_batch_follows_the_contract() -> None:
    ds = ToyDataset(40)
    loader = make(ds)
    batch = next(iter(loader))
    idx = loader.rank_indices(0, 0)[0]
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "mlm_labels",
                          "nsp_labels", "mlm_positions", "token_indices", "cu_seqlens",
                          "max_seqlen", "min_seqlen"}
    assert all(v.dtype == torch.int64 for k, v in batch.items() if k != "cu_seqlens")
    b, s = batch["input_ids"].shape
    # where the model finds tokens and predictions without asking the device
    mask = batch["attention_mask"].reshape(-1)
    assert torch.equal(batch["token_indices"], mask.nonzero().squeeze(1))
    lengths = batch["attention_mask"].sum(1)
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, *lengths.cumsum(0).tolist()]
    assert batch["max_seqlen"].dim() == 0 and batch["max_seqlen"] == lengths.max()
    assert batch["min_seqlen"].dim() == 0 and batch["min_seqlen"] == lengths.min()
    assert torch.equal(batch["mlm_positions"],
                       (batch["mlm_labels"].reshape(-1) != -100).nonzero().squeeze(1))
    lengths = ds.lengths[idx]
    assert b == 2 and s % 8 == 0 and s - 8 < lengths.max() <= s
    for row, i in enumerate(idx):
        tokens, a_len, nsp = ds.get(int(i))
        n = len(tokens)
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (s - n)
        types = [0] * a_len + [1] * (n - a_len) + [0] * (s - n)
        assert batch["token_type_ids"][row].tolist() == types
        assert batch["nsp_labels"][row].item() == (-100 if nsp == -1 else nsp)
        labels = batch["mlm_labels"][row]
        predicted = labels != -100
        assert 1 <= predicted.sum() <= 20 and not predicted[n:].any()
        assert torch.equal(labels[predicted], torch.from_numpy(tokens)[predicted[:n]])
        ids = batch["input_ids"][row]
        assert torch.equal(ids[:n][~predicted[:n]], torch.from_numpy(tokens)[~predicted[:n]])
        assert (ids[n:] == PAD).all()


def _global_batches(loader: PretrainingLoader, n_global: int) -> list[list[dict]]:
    it = iter(loader)
    return [[next(it) for _ in range(loader.accumulation_steps)] for _ in range(n_global)]


def test_accumulation_equals_ranks_and_ranks_are_disjoint() -> None:
    ds = ToyDataset(50)
    n_global = 9  # crosses the epoch boundary (6 global batches of 8 per epoch)
    single = _global_batches(make(ds, micro_batch_size=2), n_global)  # k = 4
    ranks4 = [_global_batches(make(ds, world_size=4, rank=r), n_global) for r in range(4)]
    ranks2 = [_global_batches(make(ds, world_size=2, rank=r), n_global) for r in range(2)]
    for g in range(n_global):
        # rank r, step j takes chunk r * k + j
        assert_same(single[g], [ranks4[r][g][0] for r in range(4)])
        assert_same(single[g], ranks2[0][g] + ranks2[1][g])
    loaders = [make(ds, world_size=4, rank=r) for r in range(4)]
    for epoch in (0, 1):
        seen = np.concatenate([ld.rank_indices(epoch, g).ravel() for ld in loaders
                               for g in range(loaders[0].batches_per_epoch)])
        assert len(seen) == 48 and len(np.unique(seen)) == 48  # no sample twice in an epoch
    assert not np.array_equal(loaders[0].epoch_batches(0), loaders[0].epoch_batches(1))


def test_state_round_trip_resumes_bitwise_across_epochs() -> None:
    ds = ToyDataset(50)
    loader = make(ds)  # k = 4, 6 global batches per epoch
    it = iter(loader)
    for _ in range(5 * 4):
        next(it)
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_consumed"] == 5
    reference = [next(it) for _ in range(3 * 4)]  # crosses into epoch 1
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches_consumed"] == 2
    resumed = make(ds, seed=99)  # the saved seed wins
    resumed.load_state_dict(state)
    assert_same(take(resumed, 12), reference)
    # A state taken mid-accumulation replays that global batch from its start.
    part = make(ds)
    it = iter(part)
    next(it)
    assert part.state_dict()["batches_consumed"] == 0


def test_rewind_replays_the_stream_from_its_start() -> None:
    ds = ToyDataset(30)
    loader = make(ds)  # k = 4, 3 global batches per epoch
    first = take(loader, 5 * 4)  # into epoch 1
    assert (loader.epoch, loader.batches_consumed) == (1, 2)
    loader.rewind()
    assert (loader.epoch, loader.batches_consumed) == (0, 0)
    assert_same(take(loader, 5 * 4), first)
    # The epoch-1 batches really differ from epoch 0's, so the replay is not trivially equal.
    assert not torch.equal(first[0]["input_ids"], first[3 * 4]["input_ids"])


def test_state_errors_name_the_mismatch() -> None:
    state = make(ToyDataset(50)).state_dict()
    with pytest.raises(CheckpointError, match=r"50 samples, \d+ tokens.*49 samples"):
        make(ToyDataset(49)).load_state_dict(state)
    with pytest.raises(CheckpointError, match="global_batch_size=8.*uses 16"):
        make(ToyDataset(50), global_batch_size=16).load_state_dict(state)
    with pytest.raises(CheckpointError, match="missing.*'seed'"):
        make(ToyDataset(50)).load_state_dict({k: v for k, v in state.items() if k != "seed"})


def test_workers_match_single_process() -> None:
    ds = ToyDataset(30)
    n = 4 * 4 + 2  # past the end of epoch 0 (3 global batches of 8)
    assert_same(take(make(ds, num_workers=2), n), take(make(ds), n))


def test_bins_each_global_batch_from_one_bin() -> None:
    ds = ToyDataset(200, min_len=4, max_len=64, seed=1)
    loader = make(ds, bin_by_length=True, num_bins=4)
    bins = length_bins(ds.lengths, 4)
    assert len(np.unique(bins)) == 4
    batches = loader.epoch_batches(0)
    for g in batches:
        assert len(np.unique(bins[g])) == 1
    # The bins are interleaved, not visited in length order.
    first = bins[batches[:, 0]]
    assert np.any(np.diff(first) < 0) and np.any(np.diff(first) > 0)
    # Padding inside a micro-batch stays within one bin's width (16) plus rounding to 8.
    for batch in take(loader, 20):
        lengths = batch["attention_mask"].sum(1)
        assert batch["input_ids"].shape[1] - lengths.min() < 16 + 8
    expected = sum(int(c) // 8 for c in np.bincount(bins))
    assert loader.batches_per_epoch == expected == len(batches)


def test_drop_last_false_wraps_within_the_epoch() -> None:
    ds = ToyDataset(21)
    loader = make(ds, drop_last=False)
    batches = loader.epoch_batches(0)
    assert batches.shape == (3, 8)
    assert set(batches.ravel().tolist()) == set(range(21))


def test_configuration_errors() -> None:
    with pytest.raises(ValueError, match=r"global_batch_size=10 is not divisible by "
                                          r"micro_batch_size=4 x world_size=1 = 4.*e\.g\. 8"):
        make(ToyDataset(20), global_batch_size=10, micro_batch_size=4)
    with pytest.raises(ValueError, match="rank=2 must be in"):
        make(ToyDataset(20), world_size=2, rank=2)
    with pytest.raises(ValueError, match="is_continuation"):
        make(ToyDataset(20), whole_word_masking=True)
    with pytest.raises(DataError, match="fewer samples than one global batch of 64"):
        make(ToyDataset(20), global_batch_size=64)
    with pytest.raises(DataError, match=r"the dataset holds fewer samples than one global "
                                        r"batch of 32 \(dataset has 20\); use a smaller "
                                        r"global batch size or more data"):
        make(ToyDataset(20), global_batch_size=32)


def test_build_loader_reads_a_native_directory_and_its_manifest(tmp_path) -> None:
    from bertforge.data import native, native_writer
    from bertforge.data.instances import Instance
    from bertforge.data.open import build_loader

    ds = ToyDataset(12)
    insts = [Instance(t.tolist(), a, n) for t, a, n in ds.samples]
    (tmp_path / "train").mkdir()
    native_writer.write_shard(tmp_path / "train" / "shard-00000.safetensors", insts[:5], vocab_size=VOCAB)
    native_writer.write_shard(tmp_path / "train" / "shard-00001.safetensors", insts[5:], vocab_size=VOCAB)
    native_writer.write_manifest(tmp_path, {
        "format": native.FORMAT_NAME, "format_version": native.FORMAT_VERSION,
        "fingerprint": "abc", "vocab_size": VOCAB, "max_predictions": 3,
        "special_ids": {"pad": PAD, "unk": UNK, "cls": CLS, "sep": SEP, "mask": MASK},
        "splits": {"train": {"shards": [
            {"file": "train/shard-00000.safetensors", "instances": 5},
            {"file": "train/shard-00001.safetensors", "instances": 7}]}}})
    loader = build_loader(tmp_path, global_batch_size=4, micro_batch_size=4, seed=3)
    assert loader.state_dict()["dataset_fingerprint"] == "abc:train"
    stored = sorted(tuple(loader.dataset.get(i)[0].tolist()) for i in range(12))
    assert stored == sorted(tuple(t.tolist()) for t, _, _ in ds.samples)
    for batch in take(loader, 3):
        predicted = (batch["mlm_labels"] != -100).sum(1)
        assert predicted.max() <= 3  # max_predictions from the manifest
        assert (batch["input_ids"] == MASK).any()  # mask id from the manifest


def test_pinned_batches_without_workers(monkeypatch) -> None:
    """pin_memory applies to the in-process loader too (fine-tuning and validation loaders run
    with num_workers=0): without it a non_blocking copy to the GPU waits. Pinning itself needs
    CUDA, so a marker stands in for it here."""
    import bertforge.data.loader as loader_module

    monkeypatch.setattr(loader_module, "pin_batch", lambda b: {**b, "pinned": True})
    ds = ToyDataset(40)
    pinned = next(iter(make(ds, pin_memory=True)))
    assert pinned.pop("pinned") is True
    plain = next(iter(make(ds)))
    assert "pinned" not in plain and pinned.keys() == plain.keys()
