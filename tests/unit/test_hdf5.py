"""NVIDIA/Google hdf5 shards: writer schema, reader, round trip through the loader, errors."""

from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from bertforge.data.hdf5 import Hdf5Dataset, write_hdf5_shard
from bertforge.data.loader import PretrainingLoader
from bertforge.data.open import build_loader
from bertforge.errors import DataError

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = 200
S, P = 32, 6


@dataclass
class Inst:
    tokens: list[int]
    a_length: int
    nsp_label: int


def _instances(n: int, seed: int = 0) -> list[Inst]:
    gen = np.random.default_rng(seed)
    out = []
    for i in range(n):
        la, lb = int(gen.integers(1, 12)), int(gen.integers(1, 12))
        a, b = gen.integers(5, VOCAB, la).tolist(), gen.integers(5, VOCAB, lb).tolist()
        tokens = [CLS, *a, SEP, *b, SEP]
        out.append(Inst(tokens, la + 2, [0, 1, -1][i % 3]))
    return out


def _write(path: Path, instances: list[Inst], **kw) -> int:
    base = dict(max_seq_length=S, max_predictions=P, mask_id=MASK, vocab_size=VOCAB,
                special_ids=[PAD, UNK, CLS, SEP, MASK], rng=np.random.default_rng(5))
    return write_hdf5_shard(path, instances, **{**base, **kw})


def test_writer_schema_dtypes_and_content(tmp_path: Path) -> None:
    insts = _instances(10)
    path = tmp_path / "shard_0.hdf5"
    assert _write(path, insts + insts) == 20  # two passes, each with its own masks
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard_0.hdf5"]  # no temp file left
    with h5py.File(path, "r") as f:
        want = {"input_ids": ("i4", (20, S)), "input_mask": ("i1", (20, S)),
                "segment_ids": ("i1", (20, S)), "masked_lm_positions": ("i4", (20, P)),
                "masked_lm_ids": ("i4", (20, P)), "next_sentence_labels": ("i1", (20,))}
        assert set(f) == set(want)
        for name, (dtype, shape) in want.items():
            assert f[name].dtype == np.dtype(dtype), name
            assert f[name].shape == shape and f[name].compression == "gzip", name
        d = {name: f[name][...] for name in want}
    for row in range(20):
        inst = insts[row % 10]
        tokens, n, a = np.array(inst.tokens), len(inst.tokens), inst.a_length
        assert d["input_mask"][row].tolist() == [1] * n + [0] * (S - n)
        assert d["segment_ids"][row].tolist() == [0] * a + [1] * (n - a) + [0] * (S - n)
        assert not d["input_ids"][row, n:].any()
        pos = d["masked_lm_positions"][row]
        k = int(np.count_nonzero(pos))
        assert k == min(P, max(1, round((n - 3) * 0.15)))
        assert not pos[k:].any() and not d["masked_lm_ids"][row, k:].any()
        assert np.all(np.diff(pos[:k]) > 0)
        np.testing.assert_array_equal(d["masked_lm_ids"][row, :k], tokens[pos[:k]])
        rest = np.setdiff1d(np.arange(n), pos[:k])
        np.testing.assert_array_equal(d["input_ids"][row, rest], tokens[rest])
        assert d["next_sentence_labels"][row] == inst.nsp_label
    # The two copies of an instance carry different masks.
    differs = [not np.array_equal(d["masked_lm_positions"][i], d["masked_lm_positions"][i + 10])
               for i in range(10)]
    assert sum(differs) >= 5


def test_round_trip_through_the_loader_with_resume(tmp_path: Path) -> None:
    insts = _instances(24)
    _write(tmp_path / "a.hdf5", insts[:10])
    _write(tmp_path / "b.hdf5", insts[10:], rng=np.random.default_rng(6))
    loader = build_loader(tmp_path, global_batch_size=4, micro_batch_size=2, seed=1)
    assert isinstance(loader.dataset, Hdf5Dataset) and len(loader.dataset) == 24
    batches = list(itertools.islice(iter(loader), 12))  # 6 global batches = one epoch
    seen = set()
    for g in range(6):
        for j in range(2):
            batch = batches[2 * g + j]
            for row, i in enumerate(loader.rank_indices(0, g)[j]):
                seen.add(int(i))
                inst = insts[i]
                n = len(inst.tokens)
                labels = batch["mlm_labels"][row]
                predicted = labels != -100
                assert 1 <= predicted.sum() <= P and not predicted[n:].any()
                want = torch.tensor(inst.tokens)[predicted[:n]]
                assert torch.equal(labels[predicted], want)
                assert batch["attention_mask"][row].sum() == n
                assert batch["token_type_ids"][row, : inst.a_length].sum() == 0
                assert batch["token_type_ids"][row, inst.a_length: n].all()
                want_nsp = -100 if inst.nsp_label == -1 else inst.nsp_label
                assert batch["nsp_labels"][row] == want_nsp
    assert seen == set(range(24))
    assert loader.state_dict() == {"epoch": 1, "batches_consumed": 0, "seed": 1,
                                   "global_batch_size": 4,
                                   "dataset_fingerprint": "24 samples in 2 hdf5 files"}
    # Resume mid-epoch equals the uninterrupted stream.
    ref = build_loader(tmp_path, global_batch_size=4, micro_batch_size=2, seed=1)
    it = iter(ref)
    for _ in range(6):
        next(it)
    state = ref.state_dict()
    rest = [next(it) for _ in range(6)]
    # ... also on 2 ranks without accumulation: rank r's batch is the single process' step r.
    for rank in (0, 1):
        resumed = build_loader(tmp_path, global_batch_size=4, micro_batch_size=2, world_size=2,
                               rank=rank, seed=1)
        resumed.load_state_dict(state)
        got = list(itertools.islice(iter(resumed), 3))
        for a, b in zip(got, rest[rank::2]):
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_reads_a_file_in_nvidia_layout(tmp_path: Path) -> None:
    # Two instances as NVIDIA's create_pretraining_data.py stores them (i4 ids, i1 masks).
    path = tmp_path / "nvidia.hdf5"
    ids = np.zeros((2, 16), np.int32)
    ids[0, :7] = [CLS, 10, MASK, SEP, 20, 21, SEP]
    ids[1, :5] = [CLS, 30, SEP, MASK, SEP]
    mask = (ids != 0).astype(np.int8)
    seg = np.zeros((2, 16), np.int8)
    seg[0, 4:7] = 1
    seg[1, 3:5] = 1
    pos = np.array([[2, 5, 0, 0], [3, 0, 0, 0]], np.int32)
    lm_ids = np.array([[11, 22, 0, 0], [31, 0, 0, 0]], np.int32)
    nsp = np.array([0, 1], np.int8)
    with h5py.File(path, "w") as f:
        for name, arr, dt in (("input_ids", ids, "i4"), ("input_mask", mask, "i1"),
                              ("segment_ids", seg, "i1"), ("masked_lm_positions", pos, "i4"),
                              ("masked_lm_ids", lm_ids, "i4"), ("next_sentence_labels", nsp, "i1")):
            f.create_dataset(name, data=arr, dtype=dt, compression="gzip")
    ds = Hdf5Dataset([path])
    np.testing.assert_array_equal(ds.lengths, [7, 5])
    got_ids, types, labels, label = ds.get_static(0)
    assert got_ids.tolist() == [CLS, 10, MASK, SEP, 20, 21, SEP]
    assert types.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert labels.tolist() == [-100, -100, 11, -100, -100, 22, -100] and label == 0
    loader = PretrainingLoader(ds, global_batch_size=2, micro_batch_size=2, seed=0)
    batch = next(iter(loader))
    order = loader.rank_indices(0, 0)[0].tolist()
    want_labels = {0: [-100, -100, 11, -100, -100, 22, -100, -100],
                   1: [-100, -100, -100, 31, -100, -100, -100, -100]}
    assert batch["input_ids"].shape == (2, 8)
    assert batch["mlm_labels"].tolist() == [want_labels[i] for i in order]
    assert batch["nsp_labels"].tolist() == [[0, 1][i] for i in order]
    # The decompressed shard cache stays behind when pickled (workers fill their own).
    assert ds._cache
    clone = pickle.loads(pickle.dumps(ds))
    assert not clone._cache
    assert clone.get_static(1)[2].tolist() == [-100, -100, -100, 31, -100]


def _nvidia_like(path: Path, drop: str | None = None, **override: np.ndarray) -> None:
    arrays = {"input_ids": np.ones((3, 8)), "input_mask": np.ones((3, 8)),
              "segment_ids": np.zeros((3, 8)), "masked_lm_positions": np.zeros((3, 2)),
              "masked_lm_ids": np.zeros((3, 2)), "next_sentence_labels": np.zeros(3)}
    arrays.update(override)
    with h5py.File(path, "w") as f:
        for name, arr in arrays.items():
            if name != drop:
                f.create_dataset(name, data=arr.astype(np.int32))


def test_schema_errors_name_file_and_dataset(tmp_path: Path) -> None:
    p = tmp_path / "missing.hdf5"
    _nvidia_like(p, drop="masked_lm_ids")
    with pytest.raises(DataError, match=r"missing\.hdf5: missing dataset 'masked_lm_ids'"):
        Hdf5Dataset([p])
    p = tmp_path / "rank.hdf5"
    _nvidia_like(p, input_mask=np.ones(3))
    with pytest.raises(DataError,
                       match=r"rank\.hdf5: dataset 'input_mask' has shape \(3,\), expected rank 2"):
        Hdf5Dataset([p])
    p = tmp_path / "rows.hdf5"
    _nvidia_like(p, next_sentence_labels=np.zeros(2))
    with pytest.raises(DataError, match=r"rows\.hdf5: dataset 'next_sentence_labels' has 2 rows"):
        Hdf5Dataset([p])
    p = tmp_path / "text.hdf5"
    p.write_text("not hdf5")
    with pytest.raises(DataError, match=r"text\.hdf5: cannot open as hdf5"):
        Hdf5Dataset([p])
    p = tmp_path / "corrupt.hdf5"
    _nvidia_like(p, masked_lm_positions=np.full((3, 2), 9))
    with pytest.raises(DataError, match=r"corrupt\.hdf5: row 0 predicts position 9 outside its 8"):
        Hdf5Dataset([p]).get_static(0)


def test_shards_are_read_one_after_another(tmp_path: Path) -> None:
    for k, n in enumerate((9, 14, 11)):
        _write(tmp_path / f"s{k}.hdf5", _instances(n, seed=k))
    loader = build_loader(tmp_path, global_batch_size=4, micro_batch_size=2, seed=2)
    offsets = loader.dataset.shard_offsets
    assert offsets.tolist() == [0, 9, 23, 34]
    for epoch in (0, 1):
        batches = loader.epoch_batches(epoch)
        assert batches.shape == (8, 4) and len(np.unique(batches)) == 32
        shard = np.searchsorted(offsets, batches, side="right") - 1  # (8, 4) shard of each sample
        visits = shard.ravel()[np.r_[True, np.diff(shard.ravel()) != 0]]
        assert sorted(visits.tolist()) == [0, 1, 2]  # each shard entered once per epoch
    assert not np.array_equal(loader.epoch_batches(0), loader.epoch_batches(1))
    with pytest.raises(ValueError, match="bin_by_length=True needs random access"):
        build_loader(tmp_path, global_batch_size=4, micro_batch_size=2, bin_by_length=True)


def test_writer_and_build_loader_errors(tmp_path: Path) -> None:
    long = Inst([CLS, *range(5, 45), SEP], 20, 0)
    with pytest.raises(DataError,
                       match=r"x\.hdf5: instance 1 has 42 tokens, more than max_seq_length=32"):
        _write(tmp_path / "x.hdf5", [_instances(1)[0], long])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DataError, match="nowhere: no such file or directory"):
        build_loader(tmp_path / "nowhere", global_batch_size=2, micro_batch_size=1)
    with pytest.raises(DataError, match=r"neither a manifest\.json .* nor \*\.hdf5"):
        build_loader(tmp_path, global_batch_size=2, micro_batch_size=1)
