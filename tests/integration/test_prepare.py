"""End to end: ``prepare`` on a tiny corpus, determinism, resume, bad input, hdf5, inspect."""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections import Counter
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pytest

import bertforge.data.prepare as prep
import bertforge.data.prepare_worker as prep_worker
from bertforge.data.inspect import inspect_dataset
from bertforge.data.native import NativeDataset
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer

WORDS = ("the cat dog sat on mat ran fast slow big small red blue green house tree car road river "
         "sky sun moon star light dark old new good bad happy sad").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two files of 30 documents each (one sentence per line) and a WordPiece vocab.txt."""
    root = tmp_path_factory.mktemp("corpus")
    vocab = root / "vocab.txt"
    letters = list(string.ascii_lowercase)
    vocab.write_text("\n".join(SPECIALS + list(".,") + letters + ["##" + c for c in letters]
                               + [w for w in WORDS if len(w) > 1]) + "\n")
    rng = random.Random(0)
    texts = root / "text"
    texts.mkdir()
    sentences = []
    for f in range(2):
        docs = []
        for _ in range(30):
            doc = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + "."
                   for _ in range(rng.randint(1, 12))]
            sentences += doc
            docs.append("\n".join(doc))
        (texts / f"part{f}.txt").write_text("\n\n".join(docs) + "\n")
    return {"dir": texts, "vocab": vocab, "sentences": sentences}


def run(corpus: dict, out: Path, **kw) -> prep.PrepareReport:
    args = dict(input_format="sentences", max_seq_length=32, docs_per_shard=8,
                validation_fraction=0.2, progress=False)
    return prep.prepare([corpus["dir"]], corpus["vocab"], out, **{**args, **kw})


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_native_output_holds_exactly_the_corpus(corpus: dict, tmp_path: Path) -> None:
    report = run(corpus, tmp_path / "out", objective="none", short_seq_prob=0.0)
    tok = BertTokenizer.from_file(corpus["vocab"])
    splits = {s: NativeDataset(tmp_path / "out", s) for s in ("train", "validation")}
    got: Counter = Counter()
    for name, ds in splits.items():
        assert len(ds) == report.splits[name]["instances"] > 0
        assert int(ds.lengths.sum()) == report.splits[name]["tokens"]
        for i in range(len(ds)):
            item = ds[i]
            t = item.tokens.tolist()
            assert t[0] == tok.cls_id and t[-1] == tok.sep_id and len(t) <= 32
            assert item.nsp_label == -1 and item.a_length == len(t)
            got.update(t[1:-1])
    # Packing without pairs keeps every token of every sentence exactly once.
    want = Counter(i for ids in tok.encode_batch(corpus["sentences"]) for i in ids)
    assert got == want
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["counts"]["documents"] == 60 and m["counts"]["sentences"] == len(corpus["sentences"])
    assert m["vocab_hash"] == tok.vocab_hash and m["special_ids"]["mask"] == tok.mask_id
    assert 3 <= m["splits"]["validation"]["documents"] <= 25  # 20% of 60, drawn per document
    for split in m["splits"].values():
        assert len(split["shards"]) == 8  # 60 documents, 8 per chunk
        assert sum(c for _, _, c in split["length_histogram"]) == split["instances"]
    assert "60 (+0 skipped" in report.summary() and "validation" in report.summary()


def test_nsp_pairs_and_labels(corpus: dict, tmp_path: Path) -> None:
    run(corpus, tmp_path / "out", validation_fraction=0.0)
    ds = NativeDataset(tmp_path / "out")
    labels = [ds[i].nsp_label for i in range(len(ds))]
    assert set(labels) == {0, 1} and 0.3 < np.mean(labels) < 0.75
    for i in range(len(ds)):
        t, a = ds[i].tokens.tolist(), ds[i].a_length
        assert t[a - 1] == 3 and t[-1] == 3 and 3 <= a <= len(t) - 2 and t.count(3) == 2
    assert not (tmp_path / "out" / "validation").exists() or not any(
        (tmp_path / "out" / "validation").iterdir())


def test_same_bytes_with_one_or_two_workers(corpus: dict, tmp_path: Path) -> None:
    run(corpus, tmp_path / "w1", workers=1)
    run(corpus, tmp_path / "w2", workers=2)
    one, two = digests(tmp_path / "w1"), digests(tmp_path / "w2")
    assert len(one) > 16 and one == two


def test_interrupted_run_resumes_to_identical_output(corpus: dict, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run(corpus, tmp_path / "ref")
    real = prep_worker.process_chunk

    def interrupt_at_chunk_3(task: dict) -> dict:
        if task["index"] == 3:
            raise KeyboardInterrupt
        return real(task)

    monkeypatch.setattr(prep_worker, "process_chunk", interrupt_at_chunk_3)
    with pytest.raises(KeyboardInterrupt):
        run(corpus, tmp_path / "out")
    monkeypatch.setattr(prep_worker, "process_chunk", real)
    out = tmp_path / "out"
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in (out / "train").iterdir()) == [
        f"shard-0000{k}.safetensors" for k in range(3)]
    (out / "train" / "shard-00005.safetensors.tmp-12345").write_bytes(b"half a shard")
    report = run(corpus, out)
    assert report.resumed_chunks == 3 and report.chunks == 8
    assert digests(out) == digests(tmp_path / "ref")

    # A finished run missing one shard (and its manifest) redoes just that chunk.
    (out / "manifest.json").unlink()
    (out / "train" / "shard-00006.safetensors").unlink()
    report = run(corpus, out)
    assert report.resumed_chunks == 7
    assert digests(out) == digests(tmp_path / "ref")


def test_other_settings_need_a_new_output_or_overwrite(corpus: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(corpus, out)
    with pytest.raises(DataError) as err:
        run(corpus, out, max_seq_length=64)
    assert f"--output {out}: holds data prepared with other settings" in str(err.value)
    assert "new --output" in str(err.value) and "--overwrite" in str(err.value)
    report = run(corpus, out, max_seq_length=64, overwrite=True)
    assert report.resumed_chunks == 0
    assert json.loads((out / "manifest.json").read_text())["max_seq_length"] == 64
    assert max(NativeDataset(out).lengths) > 32
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not written by `bertforge prepare`"):
        run(corpus, foreign, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_bad_inputs_are_user_errors(corpus: dict, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    vocab = corpus["vocab"]
    with pytest.raises(DataError, match=r"no documents found .*; skipped .*empty\.txt: empty file"):
        prep.prepare([empty], vocab, tmp_path / "o1", progress=False)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a\n")  # one document of one token: no pair can be made from it
    with pytest.raises(DataError, match="1 document.*no instance could be built"):
        prep.prepare([tiny], vocab, tmp_path / "o2", input_format="sentences", progress=False)
    with pytest.raises(DataError, match=r"--vocab .*missing\.txt: no such file.*bertforge vocab"):
        prep.prepare([corpus["dir"]], tmp_path / "missing.txt", tmp_path / "o3", progress=False)
    dup = tmp_path / "dup.txt"
    dup.write_text("\n".join(SPECIALS + ["a", "b", "a"]) + "\n")
    with pytest.raises(DataError, match=r"dup\.txt:8: token 'a' repeats line 6"):
        prep.prepare([corpus["dir"]], dup, tmp_path / "o4", progress=False)
    nospecial = tmp_path / "nospecial.txt"
    nospecial.write_text("a\nb\n[CLS]\n")
    with pytest.raises(DataError, match=r"nospecial\.txt.*\[MASK\]"):
        prep.prepare([corpus["dir"]], nospecial, tmp_path / "o5", progress=False)
    with pytest.raises(DataError, match="does not exist"):
        prep.prepare([tmp_path / "nowhere"], vocab, tmp_path / "o6", progress=False)
    with pytest.raises(ConfigError, match="--workers: must be >= 1"):
        prep.prepare([corpus["dir"]], vocab, tmp_path / "o7", workers=0, progress=False)
    assert not any((tmp_path / f"o{k}" / "manifest.json").exists() for k in range(1, 8))


def test_a_dead_worker_pool_is_a_user_error(corpus: dict, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    class DeadPool:
        """Stands in for a process pool whose worker was killed (e.g. by the OOM killer)."""

        def submit(self, fn, task: dict) -> Future:
            future: Future = Future()
            future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            return future

        def shutdown(self, **kwargs) -> None:
            pass

    monkeypatch.setattr(prep, "_pool", lambda workers, job, tokenizer: DeadPool())
    with pytest.raises(DataError, match=r"worker process died \(often: out of memory\) while "
                                        r"writing .*out; run the same command again with fewer "
                                        r"--workers, finished shards are kept"):
        run(corpus, tmp_path / "out", workers=2)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_skipped_inputs_are_reported(corpus: dict, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text((corpus["dir"] / "part0.txt").read_text())
    (data / "blob.txt").write_bytes(b"\x00\x01binary")
    report = prep.prepare([data], corpus["vocab"], tmp_path / "out", input_format="sentences",
                          max_seq_length=32, progress=False)
    assert any("blob.txt" in s and "binary" in s for s in report.skipped_inputs)
    assert "skipped inputs (1)" in report.summary() and report.totals["documents"] == 30


def test_hdf5_output_and_resume(corpus: dict, tmp_path: Path) -> None:
    from bertforge.data.hdf5 import Hdf5Dataset

    out = tmp_path / "h"
    run(corpus, out, fmt="hdf5", dupe_factor=2, validation_fraction=0.0)
    m = json.loads((out / "manifest.json").read_text())
    files = sorted((out / "train").glob("*.hdf5"))
    ds = Hdf5Dataset(files)
    assert m["format"] == "bertforge-hdf5" and len(files) == 8
    assert len(ds) == m["splits"]["train"]["instances"] == m["counts"]["instances"]
    native_count = run(corpus, tmp_path / "n", validation_fraction=0.0).totals["instances"]
    assert 1.6 * native_count < len(ds) < 2.4 * native_count  # two instance passes
    _, _, labels, nsp = ds.get_static(0)
    assert (labels != -100).sum() >= 1 and nsp in (0, 1)
    before = digests(out)
    (out / "manifest.json").unlink()
    files[4].unlink()
    assert run(corpus, out, fmt="hdf5", dupe_factor=2, validation_fraction=0.0).resumed_chunks == 7
    assert digests(out) == before


def test_inspect_native_and_hdf5(corpus: dict, tmp_path: Path) -> None:
    run(corpus, tmp_path / "n")
    text = inspect_dataset(tmp_path / "n", num=2, seed=1)
    ds = NativeDataset(tmp_path / "n")
    tok = BertTokenizer.from_file(corpus["vocab"])
    shown = [line.split("]")[0].split("[")[1] for line in text.splitlines() if line.startswith("train[")]
    assert len(shown) == 2 and "bertforge-native v1, objective nsp" in text
    for i in map(int, shown):
        assert "  tokens   " + " ".join(tok.convert_ids_to_tokens(ds[i].tokens.tolist())) in text
    assert "(loader draw, seed 1" in text
    run(corpus, tmp_path / "h", fmt="hdf5", dupe_factor=1)
    text = inspect_dataset(tmp_path / "h" / "train", num=1)
    assert "8 hdf5 file(s)" in text and "masked_lm_positions" in text and "[MASK](" in text
    with pytest.raises(DataError, match="no such file or directory"):
        inspect_dataset(tmp_path / "nothing")


def test_jsonl_with_a_custom_text_field_through_the_cli(corpus: dict, tmp_path: Path) -> None:
    from bertforge.cli import main

    docs = [" ".join(corpus["sentences"][i:i + 3]) for i in range(0, 30, 3)]  # 10 paragraphs
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs)))
    out = tmp_path / "out"
    assert main(["prepare", "--input", str(jsonl), "--vocab", str(corpus["vocab"]),
                 "--output", str(out), "--max-seq-length", "32", "--text-field", "body",
                 "--validation-fraction", "0"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == 10
    # With the default field nothing is found: every line lacks "text".
    assert main(["prepare", "--input", str(jsonl), "--vocab", str(corpus["vocab"]),
                 "--output", str(tmp_path / "none")]) == 2
