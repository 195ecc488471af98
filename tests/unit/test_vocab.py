"""train_wordpiece: vocabulary invariants, determinism, casing, inputs and errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer, check_casing
from bertforge.tokenization.training import train_wordpiece

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"


def _train(out: Path, **kwargs) -> tuple:
    kwargs.setdefault("vocab_size", 300)
    kwargs.setdefault("min_frequency", 1)
    report = train_wordpiece([str(CORPUS)], output=out, progress=False, **kwargs)
    return report, out.read_text(encoding="utf-8").splitlines()


def test_invariants_uncased(tmp_path: Path) -> None:
    report, tokens = _train(tmp_path / "vocab.txt")
    assert tokens[:5] == list(SPECIAL_TOKENS)  # ids 0..4 in this order
    assert all(tokens.count(t) == 1 for t in SPECIAL_TOKENS)
    assert len(tokens) == len(set(tokens)) == report.vocab_size <= 300
    assert sum(t.startswith("##") for t in tokens) > 20
    assert not any(ch.isupper() for t in tokens[5:] for ch in t)
    assert "e" in tokens and "cafe" not in tokens  # accents stripped: "é" never reaches the vocab
    assert {"the", "and", "##ing"} <= set(tokens)  # frequent words and suffixes were merged
    assert report.files_read == 1 and report.documents == 7
    assert report.bytes == CORPUS.stat().st_size
    assert (tmp_path / "tokenizer.json").exists()
    check_casing(tokens, True, "trained")


def test_training_text_has_no_unknowns(tmp_path: Path) -> None:
    _train(tmp_path / "vocab.txt")
    tok = BertTokenizer.from_file(tmp_path / "vocab.txt")
    ids = [i for line in CORPUS.read_text().splitlines() for i in tok.encode(line)]
    assert len(ids) > 1000 and tok.unk_id not in ids
    # The vocabulary compresses: far fewer pieces than characters.
    assert len(ids) < 0.6 * len(CORPUS.read_text())


def test_cased_vocab_keeps_case(tmp_path: Path) -> None:
    report, tokens = _train(tmp_path / "vocab.txt", lowercase=False)
    assert "The" in tokens and "é" in tokens and not report.lowercase
    tok = BertTokenizer.from_file(tmp_path / "tokenizer.json")
    assert tok.do_lower_case is False and tok.tokenize("The")[0] == "The"
    with pytest.raises(DataError, match=r"the vocabulary is cased"):
        BertTokenizer.from_file(tmp_path / "vocab.txt", lowercase=True)


def test_size_limit_and_alphabet_limit(tmp_path: Path) -> None:
    report, tokens = _train(tmp_path / "vocab.txt", vocab_size=80)
    assert len(tokens) == 80 == report.vocab_size
    _, tokens = _train(tmp_path / "small.txt", vocab_size=80, limit_alphabet=10)
    singles = [t for t in tokens[5:] if len(t) == 1]
    # The most frequent letters are kept.
    assert len(singles) == 10 and "e" in singles and "z" not in singles


def test_asked_for_more_than_the_corpus_supports(tmp_path: Path) -> None:
    report, tokens = _train(tmp_path / "vocab.txt", vocab_size=100_000)
    assert len(tokens) == report.vocab_size < 100_000
    assert "asked for 100000 tokens but the corpus supports only" in report.summary()


def test_deterministic_across_processes(tmp_path: Path) -> None:
    # Hash-map seeds differ between processes, so a second process is the real check.
    _train(tmp_path / "vocab.txt")
    code = (
        "import sys; from bertforge.tokenization.training import train_wordpiece; "
        "train_wordpiece([sys.argv[1]], 300, sys.argv[2], min_frequency=1, progress=False)"
    )
    again = tmp_path / "again.txt"
    subprocess.run([sys.executable, "-c", code, str(CORPUS), str(again)], check=True)
    first, second = (tmp_path / "vocab.txt").read_bytes(), again.read_bytes()
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()


def test_loads_in_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    _train(tmp_path / "vocab.txt")
    ours = BertTokenizer.from_file(tmp_path / "vocab.txt")
    hf = transformers.BertTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert len(hf) == ours.vocab_size
    text = "The lighthouse keeper kept a logbook."
    assert hf(text)["input_ids"] == ours.encode(text)


def test_inputs_mixed_formats_and_output_naming(tmp_path: Path) -> None:
    docs = CORPUS.read_text().split("\n\n")
    with gzip.open(tmp_path / "a.txt.gz", "wt") as fh:
        fh.write("\n\n".join(docs[:4]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[4:]))
    (tmp_path / "skip.pdf").write_bytes(b"%PDF")
    out = tmp_path / "out"
    out.mkdir()
    report = train_wordpiece(
        [str(tmp_path)], 200, out, min_frequency=1, progress=False, warn=lambda m: None
    )
    assert report.vocab_path == out / "vocab.txt"
    assert report.tokenizer_json == out / "tokenizer.json"
    assert report.files_read == 2 and report.documents == 7
    assert report.files_skipped[0][0].endswith("skip.pdf")
    assert "skipped 1 file(s):" in report.summary()
    assert "unknown extension '.pdf'" in report.summary()
    custom = train_wordpiece([str(CORPUS)], 200, tmp_path / "my.txt", progress=False)
    assert custom.tokenizer_json == tmp_path / "my.tokenizer.json"
    assert custom.tokenizer_json.exists()


def test_summary_lines(tmp_path: Path) -> None:
    report, _ = _train(tmp_path / "vocab.txt")
    lines = report.summary().splitlines()
    assert lines[0].startswith(f"wrote {tmp_path / 'vocab.txt'} (300 tokens, uncased")
    assert lines[1] == "read 1 file(s), 7 document(s), 0.0 MB of text"


def test_errors(tmp_path: Path) -> None:
    (tmp_path / "blank.txt").write_text("\n\n   \n")
    with pytest.raises(DataError, match=r"no text found in .*blank.txt \(only blank lines\)"):
        train_wordpiece([str(tmp_path / "blank.txt")], 100, tmp_path / "v.txt", progress=False)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match=r"no text found in .*empty.txt \(.*: empty file\)"):
        train_wordpiece([str(tmp_path / "empty.txt")], 100, tmp_path / "v.txt", progress=False)
    with pytest.raises(DataError, match=r"input .*missing.txt does not exist"):
        train_wordpiece([str(tmp_path / "missing.txt")], 100, tmp_path / "v.txt", progress=False)
    with pytest.raises(ConfigError, match=r"vocab_size=5 is too small"):
        train_wordpiece([str(CORPUS)], 5, tmp_path / "v.txt", progress=False)
    with pytest.raises(ConfigError, match=r"input format 'csv' is not known"):
        train_wordpiece([str(CORPUS)], 100, tmp_path / "v.txt", input_format="csv", progress=False)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match=r"afile is a file, not a directory"):
        train_wordpiece([str(CORPUS)], 100, tmp_path / "afile" / "v.txt", progress=False)
    assert not (tmp_path / "v.txt").exists()


def test_output_directory_is_created(tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "vocab.txt"
    train_wordpiece([str(CORPUS)], 100, out, progress=False)
    assert out.is_file() and (out.parent / "tokenizer.json").is_file()
