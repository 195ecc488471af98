"""Objective ``denoise``: packed instances with sentence boundaries, their storage in native
shards (optional tensors, length-bin sort, old shards without them), and ``prepare`` end to end.

Text comes from tests/assets/tiny_corpus.txt with a WordPiece vocabulary trained on it, so every
character is in the vocabulary and a stored sentence decodes back to the original text.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import bertforge.data.prepare as prep
from bertforge.data import native, native_writer
from bertforge.data.instances import Instance, create_instances
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
CLS, SEP = 2, 3


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizer:
    from bertforge.tokenization.training import train_wordpiece

    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    train_wordpiece([CORPUS], vocab_size=1000, output=vocab, progress=False)
    return BertTokenizer.from_file(vocab)


def corpus_documents() -> list[list[str]]:
    """The corpus as documents (blank-line separated) of sentences (one per line)."""
    text = CORPUS.read_text(encoding="utf-8")
    return [[s.strip() for s in block.splitlines() if s.strip()]
            for block in text.split("\n\n") if block.strip()]


def squeeze(text: str) -> str:
    """Text as the uncased tokenizer sees it, without spaces: lower case, no accents."""
    decomposed = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in decomposed if not c.isspace() and unicodedata.category(c) != "Mn")


def segments(inst: Instance) -> list[list[int]]:
    """The token ids of each sentence of a denoise instance, cut at its ``sentence_ends``."""
    starts = [1, *inst.sentence_ends[:-1]]
    return [inst.tokens[s:e] for s, e in zip(starts, inst.sentence_ends)]


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# --- instances -----------------------------------------------------------------------------------


def test_denoise_instances_record_sentence_boundaries(tok: BertTokenizer) -> None:
    docs = corpus_documents()
    # One sentence of ~200 tokens in the middle of document 2: longer than a 64-token sequence.
    long_sentence = " ".join(docs[1])
    docs[2].insert(3, long_sentence)
    encoded = [tok.encode_batch(d) for d in docs]
    max_tokens = 62
    assert len(tok.encode_batch([long_sentence])[0]) > 2 * max_tokens
    out = create_instances(encoded, random.Random(4), max_seq_length=64, short_seq_prob=0.0,
                           objective="denoise", cls_id=tok.cls_id, sep_id=tok.sep_id)
    for inst in out:
        ends = inst.sentence_ends
        assert inst.tokens[0] == tok.cls_id and inst.tokens[-1] == tok.sep_id
        assert len(inst.tokens) <= 64 and inst.a_length == len(inst.tokens)
        assert inst.nsp_label == -1
        assert ends[0] >= 2 and ends[-1] == len(inst.tokens) - 1
        assert all(b > a for a, b in zip(ends, ends[1:]))
    # In order, the stored sentences are the input's, a long one as pieces of at most 62 tokens.
    expected = [ids[k : k + max_tokens] for doc in encoded for ids in doc
                for k in range(0, len(ids), max_tokens)]
    got = [seg for inst in out for seg in segments(inst)]
    assert got == expected
    texts = [squeeze(s) for d in docs for s in d]
    whole = [squeeze(tok.decode(seg)) for seg in got]
    assert sum(t in texts for t in whole) == len(texts) - 1  # all but the long sentence
    long_pieces = [seg for seg in got if squeeze(tok.decode(seg)) not in texts]
    assert [len(p) for p in long_pieces[:-1]] == [max_tokens] * (len(long_pieces) - 1)
    assert squeeze(tok.decode([t for p in long_pieces for t in p])) == squeeze(long_sentence)
    full = [inst for inst in out if len(inst.tokens) == 64 and inst.sentence_ends == [63]]
    assert len(full) == len(long_pieces) - 1  # each full-length piece is an instance of its own


def test_denoise_packs_exactly_as_none() -> None:
    docs = [[list(range(10 + 100 * d + 10 * s, 10 + 100 * d + 10 * s + 3 + s % 5))
             for s in range(9)] for d in range(6)]
    args = dict(max_seq_length=16, short_seq_prob=0.5, cls_id=CLS, sep_id=SEP)
    plain = create_instances(docs, random.Random(7), objective="none", **args)
    noisy = create_instances(docs, random.Random(7), objective="denoise", **args)
    assert [x.tokens for x in noisy] == [x.tokens for x in plain]
    assert all(x.sentence_ends is None for x in plain)
    assert all(x.sentence_ends for x in noisy)
    nsp = create_instances(docs, random.Random(7), objective="nsp", **args)
    assert all(x.sentence_ends is None for x in nsp)


# --- native shards -------------------------------------------------------------------------------


def denoise_instances(n: int, seed: int, vocab_size: int = 1000) -> list[Instance]:
    """Synthetic denoise instances: 1-6 sentences of 1-20 ids each."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lengths = [rng.randint(1, 20) for _ in range(rng.randint(1, 6))]
        body = [rng.randrange(5, vocab_size) for _ in range(sum(lengths))]
        ends = list(np.cumsum(lengths) + 1)
        out.append(Instance(tokens=[CLS, *body, SEP], a_length=len(body) + 2, nsp_label=-1,
                            sentence_ends=[int(e) for e in ends]))
    return out


def stored(shard: native.Shard) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tokens, sentence_ends) of every instance of a shard, in stored order."""
    so, se, off = shard.sentence_offsets, shard.sentence_ends, shard.offsets
    return [(tuple(shard.input_ids[off[j] : off[j + 1]].tolist()),
             tuple(se[so[j] : so[j + 1]].tolist())) for j in range(len(shard))]


def test_sentence_arrays_round_trip_through_the_length_bin_sort(tmp_path: Path) -> None:
    insts = denoise_instances(150, seed=0)
    path = tmp_path / "s.safetensors"
    native_writer.write_shard(path, insts, vocab_size=1000, bin_width=8)
    shard = native.open_shard(path)
    assert shard.has_sentences
    assert shard.sentence_offsets.dtype == np.int64 and shard.sentence_ends.dtype == np.int16
    assert len(shard.sentence_offsets) == 151
    assert shard.sentence_offsets[-1] == len(shard.sentence_ends) == sum(
        len(x.sentence_ends) for x in insts)
    bins = [(len(x.tokens) - 1) // 8 for x in insts]
    order = sorted(range(150), key=lambda k: bins[k])
    assert order != list(range(150))  # the sort really moves instances
    assert stored(shard) == [(tuple(insts[k].tokens), tuple(insts[k].sentence_ends))
                             for k in order]
    # Any safetensors reader sees all six tensors; each starts aligned to its element size.
    arrays = load_file(str(path))
    assert sorted(arrays) == sorted(native.TENSOR_ORDER)
    np.testing.assert_array_equal(arrays["sentence_ends"], shard.sentence_ends)
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    starts = {name: header[name]["data_offsets"][0] for name in native.TENSOR_ORDER}
    assert sorted(starts, key=starts.get) == list(native.TENSOR_ORDER)
    base = 8 + int.from_bytes(raw[:8], "little")
    for name, start in starts.items():
        assert (base + start) % getattr(shard, name).dtype.itemsize == 0
    # Byte-identical on a rewrite.
    again = tmp_path / "again.safetensors"
    native_writer.write_shard(again, insts, vocab_size=1000, bin_width=8)
    assert again.read_bytes() == raw


def test_shards_without_sentences_keep_the_four_tensor_layout(tmp_path: Path) -> None:
    insts = denoise_instances(40, seed=1)
    plain = [Instance(x.tokens, x.a_length, x.nsp_label) for x in insts]
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    native_writer.write_shard(a, plain, vocab_size=1000)
    native_writer.write_shard(b, insts, vocab_size=1000, sentences=False)
    assert a.read_bytes() == b.read_bytes()
    assert sorted(load_file(str(a))) == sorted(native.REQUIRED_TENSORS)
    shard = native.open_shard(a)
    assert not shard.has_sentences and shard.sentence_offsets is None
    # A denoise shard with no instances still says it holds sentences.
    empty = tmp_path / "empty.safetensors"
    native_writer.write_shard(empty, [], vocab_size=1000, sentences=True)
    shard = native.open_shard(empty)
    assert shard.has_sentences and shard.sentence_offsets.tolist() == [0]
    assert len(shard.sentence_ends) == 0


@pytest.mark.parametrize(("ends", "message"), [
    ([3, 3, 9], "sentence_ends must increase"),
    ([4, 8], "sentence_ends must increase"),       # does not end at len(tokens) - 1
    ([1, 9], "sentence_ends must increase"),       # empty first sentence
    ([], "sentence_ends must increase"),
])
def test_writer_rejects_bad_sentence_ends(tmp_path: Path, ends: list[int], message: str) -> None:
    good = denoise_instances(3, seed=2)
    bad = Instance(tokens=[CLS, *range(10, 18), SEP], a_length=10, nsp_label=-1,
                   sentence_ends=ends)
    with pytest.raises(ValueError, match=message):
        native_writer.write_shard(tmp_path / "s.safetensors", [*good, bad], vocab_size=1000)
    mixed = [*good, Instance(tokens=[CLS, 10, SEP], a_length=3, nsp_label=-1)]
    with pytest.raises(ValueError, match="instances: 1 of 4 carry no sentence_ends"):
        native_writer.write_shard(tmp_path / "s.safetensors", mixed, vocab_size=1000)
    assert list(tmp_path.iterdir()) == []


def write_dataset(root: Path, shards: list[list[Instance]], sentences: bool) -> None:
    entries = []
    for k, insts in enumerate(shards):
        name = native_writer.shard_name("train", k)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        native_writer.write_shard(root / name, insts, vocab_size=1000, bin_width=8,
                                  sentences=sentences)
        entries.append({"file": name, "instances": len(insts)})
    native_writer.write_manifest(root, {
        "format": native.FORMAT_NAME, "format_version": native.FORMAT_VERSION,
        "objective": "denoise" if sentences else "none", "fingerprint": "f",
        "splits": {"train": {"shards": entries}}})


def test_dataset_get_sentences_across_shards(tmp_path: Path) -> None:
    parts = [denoise_instances(n, seed=20 + n) for n in (25, 0, 40, 7)]
    write_dataset(tmp_path, parts, sentences=True)
    ds = native.NativeDataset(tmp_path)
    assert len(ds) == 72 and ds.has_sentences
    expected = [item for k in range(4) for item in stored(ds.shard(k))]
    assert len(expected) == 72
    for i in (0, 24, 25, 50, 64, 65, 71, -1):
        tokens, ends = ds.get_sentences(i)
        assert ends.dtype == np.int64
        assert (tuple(tokens.tolist()), tuple(ends.tolist())) == expected[i]
        np.testing.assert_array_equal(tokens, ds.get(i)[0])
    # Every stored instance is one of the written ones, with its own boundaries.
    written = {(tuple(x.tokens), tuple(x.sentence_ends)) for p in parts for x in p}
    assert set(expected) == written
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.has_sentences and tuple(clone.get_sentences(30)[1].tolist()) == expected[30][1]
    with pytest.raises(IndexError):
        ds.get_sentences(72)


def test_old_shards_open_but_have_no_sentences(tmp_path: Path) -> None:
    # A shard as written before sentence tensors existed, by a plain safetensors writer.
    insts = denoise_instances(6, seed=3)
    lengths = [len(x.tokens) for x in insts]
    arrays = {
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "input_ids": np.array([t for x in insts for t in x.tokens], dtype=np.uint16),
        "a_lengths": np.array(lengths, dtype=np.int16),
        "nsp_labels": np.full(6, -1, dtype=np.int8),
    }
    (tmp_path / "train").mkdir()
    name = native_writer.shard_name("train", 0)
    save_file(arrays, str(tmp_path / name), metadata={"format": native.FORMAT_NAME,
                                                      "format_version": "1", "bins": "[]"})
    native_writer.write_manifest(tmp_path, {
        "format": native.FORMAT_NAME, "format_version": native.FORMAT_VERSION,
        "objective": "none", "splits": {"train": {"shards": [{"file": name, "instances": 6}]}}})
    ds = native.NativeDataset(tmp_path)
    assert not ds.has_sentences
    assert ds.get(2)[0].tolist() == insts[2].tokens and ds[5].a_length == lengths[5]
    with pytest.raises(DataError) as err:
        ds.get_sentences(2)
    text = str(err.value)
    assert text.startswith(f"{tmp_path}: split 'train' has no sentence boundaries")
    assert "objective 'none'" in text and "re-run `bertforge prepare --objective denoise`" in text


def test_a_shard_with_half_the_sentence_tensors_is_rejected(tmp_path: Path) -> None:
    insts = denoise_instances(4, seed=5)
    path = tmp_path / "s.safetensors"
    native_writer.write_shard(path, insts, vocab_size=1000)
    arrays = load_file(str(path))
    meta = native.read_shard_metadata(path)
    del arrays["sentence_offsets"]
    save_file(arrays, str(path), metadata=meta)
    with pytest.raises(DataError, match=r"s\.safetensors: shard has tensor 'sentence_ends' "
                                        r"without its partner.*bertforge prepare"):
        native.open_shard(path)
    arrays["sentence_offsets"] = np.zeros(3, dtype=np.int64)
    save_file(arrays, str(path), metadata=meta)
    with pytest.raises(DataError, match="3 sentence offsets for 4 instances"):
        native.open_shard(path)


# --- prepare -------------------------------------------------------------------------------------


def run(tok: BertTokenizer, out: Path, **kw) -> prep.PrepareReport:
    vocab = out.parent / "vocab.txt"
    if not vocab.exists():
        tok.save_vocab(vocab)
    args = dict(input_format="sentences", max_seq_length=64, docs_per_shard=2,
                validation_fraction=0.3, objective="denoise", progress=False)
    return prep.prepare([CORPUS], vocab, out, **{**args, **kw})


@pytest.fixture(scope="module")
def prepared(tok: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "w1"
    run(tok, out, workers=1)
    return out


def test_prepare_denoise_end_to_end(tok: BertTokenizer, prepared: Path) -> None:
    manifest = native.read_manifest(prepared)
    assert manifest["objective"] == "denoise" and manifest["output_format"] == "native"
    docs = corpus_documents()
    sentences = {squeeze(s) for d in docs for s in d}
    assert max(len(ids) for ids in tok.encode_batch([s for d in docs for s in d])) < 62
    assert manifest["counts"]["documents"] == len(docs) == 7
    assert manifest["counts"]["sentences"] == sum(len(d) for d in docs)
    seen = set()
    for split in ("train", "validation"):
        ds = native.NativeDataset(prepared, split)
        counts = manifest["splits"][split]
        assert len(ds) == counts["instances"] > 0 and ds.has_sentences
        assert len(counts["shards"]) == 4  # 7 documents, 2 per chunk
        # With no sentence longer than a sequence, every sentence is stored once with its end.
        total_ends = 0
        for i in range(len(ds)):
            tokens, ends = ds.get_sentences(i)
            t = tokens.tolist()
            assert t[0] == tok.cls_id and t[-1] == tok.sep_id and ends[-1] == len(t) - 1
            for s, e in zip([1, *ends[:-1]], ends):
                text = squeeze(tok.decode(t[s:e]))
                assert text in sentences
                seen.add(text)
            total_ends += len(ends)
        assert total_ends == counts["sentences"]
        for entry in counts["shards"]:  # also shards of a chunk with no document of this split
            assert native.open_shard(prepared / entry["file"]).has_sentences
    assert seen == sentences
    empty = [e for s in ("train", "validation") for e in manifest["splits"][s]["shards"]
             if e["instances"] == 0]
    assert empty  # the check above covered an empty shard


def test_prepare_denoise_same_bytes_with_two_workers(tok: BertTokenizer, prepared: Path) -> None:
    out = prepared.parent / "w2"
    report = run(tok, out, workers=2)
    assert report.objective == "denoise" and "objective denoise" in report.summary()
    one, two = digests(prepared), digests(out)
    assert len(one) > 8 and one == two


def test_size_estimate_counts_sentence_arrays() -> None:
    settings = {"output_format": "native", "token_dtype": "<u2", "max_seq_length": 128,
                "objective": "none"}
    plain = prep._estimate_bytes(4_500_000, settings)
    noisy = prep._estimate_bytes(4_500_000, {**settings, "objective": "denoise"})
    tokens = 4_500_000 / prep.BYTES_PER_TOKEN
    instances = tokens / (0.9 * 128)
    expected = instances * 8 + 2 * tokens / prep.TOKENS_PER_SENTENCE
    assert abs((noisy - plain) - expected) <= 1


def test_hdf5_cannot_hold_denoise_data(tok: BertTokenizer, tmp_path: Path) -> None:
    out = tmp_path / "h"
    with pytest.raises(ConfigError, match="--format: hdf5 stores static BERT masks and cannot "
                                          "hold --objective denoise data; use --format native"):
        run(tok, out, fmt="hdf5")
    assert not out.exists()
    with pytest.raises(ConfigError, match="objective: unknown value 'bart'.*denoise"):
        run(tok, out, objective="bart")
