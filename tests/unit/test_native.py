"""The native shard format: round trips, byte stability, interop with safetensors, the reader."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from bertforge.data import native, native_writer
from bertforge.data.instances import Instance
from bertforge.errors import DataError


def random_instances(n: int, seed: int, vocab_size: int = 1000, max_len: int = 100) -> list[Instance]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(5, max_len)
        tokens = [2] + [rng.randrange(5, vocab_size) for _ in range(length - 2)] + [3]
        label = rng.choice([0, 1, -1])
        out.append(Instance(tokens=tokens, a_length=rng.randint(2, length - 1), nsp_label=label))
    return out


def as_tuple(x) -> tuple:
    return (tuple(int(t) for t in x.tokens), int(x.a_length), int(x.nsp_label))


def test_shard_round_trip_sorted_by_bin(tmp_path: Path) -> None:
    insts = random_instances(200, seed=0)
    path = tmp_path / "s.safetensors"
    meta = native_writer.write_shard(path, insts, vocab_size=1000, bin_width=16, stats={"documents": 7})
    shard = native.open_shard(path)
    got = [as_tuple(x) for x in native.iter_instances(shard)]
    assert shard.input_ids.dtype == np.uint16 and len(shard) == 200
    # Same instances; stored order = stable sort of the input order by length bin.
    bins_in = [(len(x.tokens) - 1) // 16 for x in insts]
    expected = [as_tuple(insts[k]) for k in sorted(range(200), key=lambda k: bins_in[k])]
    assert got == expected
    # The bin table covers [0, N) in order and each range holds exactly its bin's lengths.
    lengths = shard.lengths
    assert shard.bins == meta["bins"]
    assert shard.bins[0][1] == 0 and shard.bins[-1][2] == 200
    for (b, s, e), nxt in zip(shard.bins, shard.bins[1:] + [[None, 200, None]]):
        assert e == nxt[1]
        assert np.all((lengths[s:e] - 1) // 16 == b)
    assert shard.stats == {"documents": 7}


def test_shard_bytes_are_stable_and_readable_by_safetensors(tmp_path: Path) -> None:
    insts = random_instances(50, seed=1)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    native_writer.write_shard(a, insts, vocab_size=1000, stats={"x": 1, "y": [1, 2]})
    native_writer.write_shard(b, insts, vocab_size=1000, stats={"y": [1, 2], "x": 1})
    assert a.read_bytes() == b.read_bytes()
    arrays = load_file(str(a))
    shard = native.open_shard(a)
    for name in ("offsets", "input_ids", "a_lengths", "nsp_labels"):
        np.testing.assert_array_equal(arrays[name], getattr(shard, name))
    assert arrays["offsets"][-1] == sum(len(x.tokens) for x in insts)
    assert sorted(tmp_path.iterdir()) == [a, b]  # no temp files left behind


def test_large_vocab_uses_int32_and_empty_shard(tmp_path: Path) -> None:
    insts = random_instances(10, seed=2, vocab_size=70000)
    assert max(max(x.tokens) for x in insts) >= 65536
    native_writer.write_shard(tmp_path / "big.safetensors", insts, vocab_size=70000)
    shard = native.open_shard(tmp_path / "big.safetensors")
    assert shard.input_ids.dtype == np.int32
    assert sorted(as_tuple(x) for x in native.iter_instances(shard)) == sorted(map(as_tuple, insts))
    native_writer.write_shard(tmp_path / "empty.safetensors", [], vocab_size=1000)
    empty = native.open_shard(tmp_path / "empty.safetensors")
    assert len(empty) == 0 and empty.offsets.tolist() == [0] and empty.bins == []


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    bad = [Instance(tokens=[2, 5000, 3], a_length=3, nsp_label=-1)]
    with pytest.raises(ValueError, match="token id outside"):
        native_writer.write_shard(tmp_path / "s.safetensors", bad, vocab_size=1000)
    assert list(tmp_path.iterdir()) == []


def write_dataset(root: Path, shards: list[list[Instance]]) -> None:
    entries = []
    for k, insts in enumerate(shards):
        name = native_writer.shard_name("train", k)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        native_writer.write_shard(root / name, insts, vocab_size=1000)
        entries.append({"file": name, "instances": len(insts)})
    native_writer.write_manifest(root, {"format": native.FORMAT_NAME,
                                 "format_version": native.FORMAT_VERSION, "fingerprint": "abc",
                                 "splits": {"train": {"shards": entries}}})


def test_dataset_global_index_lengths_bins_and_pickle(tmp_path: Path) -> None:
    parts = [random_instances(n, seed=10 + n) for n in (30, 0, 45)]
    write_dataset(tmp_path, parts)
    ds = native.NativeDataset(tmp_path)
    assert len(ds) == 75 and ds.fingerprint == "abc:train"
    stored = [as_tuple(x) for k in (0, 2) for x in native.iter_instances(ds.shard(k))]
    assert [as_tuple(ds[i]) for i in range(75)] == stored
    assert as_tuple(ds[-1]) == stored[-1]
    tokens, a_len, label = ds.get(40)
    assert (tuple(tokens.tolist()), a_len, label) == stored[40]
    np.testing.assert_array_equal(ds.lengths, [len(s[0]) for s in stored])
    covered = [i for _, s, e in ds.bins() for i in range(s, e)]
    assert covered == list(range(75))
    with pytest.raises(IndexError):
        ds[75]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._shards == {} and as_tuple(clone[50]) == stored[50]


def test_reader_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no manifest.*bertforge prepare"):
        native.NativeDataset(tmp_path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(DataError, match=f"{junk}: not a readable safetensors shard"):
        native.open_shard(junk)
    write_dataset(tmp_path, [random_instances(5, seed=3)])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["instances"] = 6
    native_writer.write_manifest(tmp_path, manifest)
    with pytest.raises(DataError, match="holds 5 instances but the manifest says 6"):
        native.NativeDataset(tmp_path)[0]
    with pytest.raises(DataError, match="no split 'validation' \\(available: train\\)"):
        native.NativeDataset(tmp_path, split="validation")
    manifest["format_version"] = 99
    native_writer.write_manifest(tmp_path, manifest)
    with pytest.raises(DataError, match="format version 99 is not supported"):
        native.NativeDataset(tmp_path)
    manifest.update(format=native.HDF5_DIR_FORMAT, format_version=native.FORMAT_VERSION)
    native_writer.write_manifest(tmp_path, manifest)
    with pytest.raises(DataError, match="static-masked hdf5 shards, not native ones"):
        native.NativeDataset(tmp_path)


def test_length_histogram() -> None:
    hist = native_writer.length_histogram(np.array([1, 32, 33, 64, 65, 128, 128]), 32)
    assert hist == [[1, 32, 2], [33, 64, 2], [65, 96, 1], [97, 128, 2]]
