"""BpeTokenizer and train_bpe: special ids, encoding, <mask>, truncation, word starts, saving and
loading, training determinism, load_tokenizer's dispatch, and every loading error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertforge.tokenization.bpe import BPE_SPECIAL_TOKENS, BpeTokenizer, bpe_hash
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import BertTokenizer, load_tokenizer, read_vocab_tokens
from bertforge.tokenization.training import BpeReport, train_bpe, train_wordpiece

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
SAVED = ["merges.txt", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
         "vocab.json"]

# A hand-made vocabulary with BART's layout: <s> <pad> </s> <unk> first, <mask> last.
TINY_VOCAB = ["<s>", "<pad>", "</s>", "<unk>", "Ġ", "a", "e", "l", "o", "r", "w", "Ġl", "Ġlo",
              "Ġlow", "er", "Ġlower", "<mask>"]
TINY_MERGES = ["Ġ l", "Ġl o", "Ġlo w", "e r", "Ġlow er"]

# Text no training corpus covers: every byte still has a symbol, so none becomes <unk>.
UNICODE = ["héllo wörld", "日本語のテキスト", "한국어 Привет مرحبا", "🙂👍🏽🇫🇷", "e\u0301 ﬁne",
           "\x00\x07\t\r\n", "  two  spaces ", "\u200b\ufeff\ufffd", "", "𠀀𠀁 x²"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BpeReport]:
    out = tmp_path_factory.mktemp("bpe") / "tok"
    report = train_bpe([str(CORPUS)], 400, out, min_frequency=1, progress=False)
    return out, report


@pytest.fixture(scope="module")
def tok(trained: tuple[Path, BpeReport]) -> BpeTokenizer:
    return BpeTokenizer.from_pretrained(trained[0])


@pytest.fixture()
def tiny_files(tmp_path: Path) -> tuple[Path, Path]:
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text(json.dumps({t: i for i, t in enumerate(TINY_VOCAB)}), encoding="utf-8")
    merges.write_text("#version: 0.2\n" + "\n".join(TINY_MERGES) + "\n", encoding="utf-8")
    return vocab, merges


def _without_prefix(tok: BpeTokenizer) -> BpeTokenizer:
    return BpeTokenizer(tok.vocab, tok.merges, add_prefix_space=False)


# -- special tokens and encoding ------------------------------------------------------------------


def test_trained_special_ids_come_first(tok: BpeTokenizer) -> None:
    assert tok.vocab[:5] == BPE_SPECIAL_TOKENS
    assert (tok.bos_id, tok.pad_id, tok.eos_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert (tok.cls_id, tok.sep_id) == (tok.bos_id, tok.eos_id)
    assert tok.vocab_size == len(tok.vocab) == 400
    assert tok.do_lower_case is False and tok.add_prefix_space is True
    assert tok.model_max_length == 1024


def test_special_ids_are_looked_up_not_assumed(tiny_files: tuple[Path, Path]) -> None:
    tiny = BpeTokenizer.from_files(*tiny_files)
    assert (tiny.bos_id, tiny.pad_id, tiny.eos_id, tiny.unk_id) == (0, 1, 2, 3)
    assert tiny.mask_id == len(TINY_VOCAB) - 1 == 16  # last, as in BART's vocabulary
    assert tiny.add_prefix_space is False  # BART's default


def test_from_files_applies_merges_by_rank(tiny_files: tuple[Path, Path]) -> None:
    tiny = BpeTokenizer.from_files(*tiny_files)
    assert tiny.tokenize("lower low") == ["l", "o", "w", "er", "Ġlow"]
    assert tiny.encode("lower low") == [0, 7, 8, 10, 14, 13, 2]
    # A byte the vocabulary lacks ("s") becomes <unk> rather than vanishing.
    assert tiny.encode(" lows") == [0, 13, 3, 2]
    prefixed = BpeTokenizer.from_files(*tiny_files, add_prefix_space=True, model_max_length=64)
    assert prefixed.tokenize("lower low") == ["Ġlower", "Ġlow"]
    assert prefixed.model_max_length == 64
    assert tiny.convert_tokens_to_ids(["Ġlower", "zebra", "<mask>"]) == [15, 3, 16]
    assert tiny.convert_ids_to_tokens([15, 16]) == ["Ġlower", "<mask>"]


def test_encode_single_and_pair(tok: BpeTokenizer) -> None:
    first, second = tok.encode_batch(["the keeper", "a logbook"])
    assert tok.encode("the keeper") == [0, *first, 2]
    assert tok.encode("the keeper", "a logbook") == [0, *first, 2, 2, *second, 2]
    assert tok.encode("") == [0, 2]
    assert tok.tokenize("the keeper")[0] == "Ġthe"  # the prefix space makes "the" a word start


def test_encode_batch_matches_encode(tok: BpeTokenizer) -> None:
    texts = ["The lighthouse keeper kept a logbook.", "", "日本語", "x y z"]
    assert tok.encode_batch(texts) == [tok.encode(t)[1:-1] for t in texts]
    assert tok.encode_batch(texts, add_special_tokens=True) == [tok.encode(t) for t in texts]


def test_round_trip_of_arbitrary_unicode(tok: BpeTokenizer) -> None:
    plain = _without_prefix(tok)
    for text in UNICODE:
        ids = plain.encode(text)
        assert tok.unk_id not in ids
        assert plain.decode(ids) == text
        # With the prefix space, the space the tokenizer added comes back too (as in transformers).
        expected = text if text == "" or text.startswith(" ") else " " + text
        assert tok.decode(tok.encode(text)) == expected
    assert plain.decode_batch([plain.encode(t) for t in UNICODE]) == UNICODE
    # Bytes cut in the middle of a character decode to U+FFFD instead of failing.
    emoji = plain.encode_batch(["🙂"])[0]
    assert len(emoji) > 1 and plain.decode(emoji[:1]) == "\ufffd"


def test_mask_takes_the_space_before_it(tok: BpeTokenizer) -> None:
    plain = _without_prefix(tok)
    ids = plain.encode("the <mask> keeper")
    # No lone "Ġ" between "the" and <mask>: the mask took that space.
    the, keeper = plain.encode_batch(["the", " keeper"])
    assert ids == [tok.bos_id, *the, tok.mask_id, *keeper, tok.eos_id]
    assert plain.encode("the<mask> keeper") == ids
    assert tok.mask_id not in plain.encode("the <MASK> keeper")  # only the exact spelling
    assert plain.decode(ids, skip_special_tokens=False) == "<s>the<mask> keeper</s>"
    assert plain.decode(ids) == "the keeper"


def test_encode_truncated(tok: BpeTokenizer) -> None:
    long_text = "the lighthouse keeper kept a logbook of every ship"
    full = tok.encode(long_text)
    cut, short, empty = tok.encode_truncated([long_text, "a", ""], 6)
    assert len(full) > 6
    assert cut == full[:5] + [tok.eos_id]
    assert short == tok.encode("a") and empty == [tok.bos_id, tok.eos_id]
    assert tok.encode_truncated([long_text], 3) == [[tok.bos_id, full[1], tok.eos_id]]
    assert tok.encode_truncated([long_text], 1000) == [full]
    with pytest.raises(ValueError, match=r"max_length .* got 2"):
        tok.encode_truncated(["a"], 2)


def test_word_starts_and_continuations(tok: BpeTokenizer) -> None:
    ws, cont = tok.is_word_start, tok.is_continuation
    assert ws.shape == cont.shape == (tok.vocab_size,) and ws.dtype == cont.dtype == bool
    assert ws[:5].all() and not cont[:5].any()  # specials count as word starts
    expected = np.array([t.startswith("Ġ") for t in tok.vocab])
    expected[:5] = True
    np.testing.assert_array_equal(ws, expected)
    np.testing.assert_array_equal(cont, ~ws)
    plain = _without_prefix(tok)
    ids = plain.encode("the lighthouse")
    assert plain.convert_ids_to_tokens(ids) == ["<s>", "t", "he", "Ġl", "ight", "h", "ou", "se",
                                                "</s>"]
    assert ws[ids].tolist() == [True, False, False, True, False, False, False, False, True]


def test_tiny_word_starts_with_mask_last(tiny_files: tuple[Path, Path]) -> None:
    tiny = BpeTokenizer.from_files(*tiny_files)
    expected = [t in BPE_SPECIAL_TOKENS or t.startswith("Ġ") for t in TINY_VOCAB]
    assert tiny.is_word_start.tolist() == expected and tiny.is_word_start[16]


def test_vocab_hash_covers_tokens_and_merges(tok: BpeTokenizer) -> None:
    assert tok.vocab_hash == bpe_hash(tok.vocab, tok.merges)
    assert len(tok.vocab_hash) == 64
    # The same tokens with fewer merges split text differently, so they must not match.
    fewer = BpeTokenizer(tok.vocab, tok.merges[:-1])
    assert fewer.vocab_hash != tok.vocab_hash
    a, b = tok.merges[-1]
    text = fewer.decode(fewer.convert_tokens_to_ids([a + b]))
    assert _without_prefix(tok).tokenize(text) == [a + b] and fewer.tokenize(text) == [a, b]
    assert BpeTokenizer(tok.vocab, tok.merges, add_prefix_space=False).vocab_hash == tok.vocab_hash


# -- saving and loading ----------------------------------------------------------------------------


def test_save_and_reload_are_identical(tok: BpeTokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == SAVED
    again = BpeTokenizer.from_pretrained(tmp_path / "copy")
    assert again.vocab == tok.vocab and again.merges == tok.merges
    assert again.vocab_hash == tok.vocab_hash and again.add_prefix_space is True
    for text in UNICODE + ["the <mask> keeper"]:
        assert again.encode(text) == tok.encode(text)
    config = json.loads((tmp_path / "copy" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BartTokenizer" and config["model_max_length"] == 1024
    assert config["add_prefix_space"] is True and config["mask_token"]["lstrip"] is True
    special = json.loads((tmp_path / "copy" / "special_tokens_map.json").read_text())
    assert (special["bos_token"], special["cls_token"]) == ("<s>", "<s>")
    assert (special["eos_token"], special["sep_token"]) == ("</s>", "</s>")
    vocab = json.loads((tmp_path / "copy" / "vocab.json").read_text(encoding="utf-8"))
    assert list(vocab) == list(tok.vocab) and list(vocab.values()) == list(range(tok.vocab_size))
    merges = (tmp_path / "copy" / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2" and merges[1:] == [f"{a} {b}" for a, b in tok.merges]
    from_files = BpeTokenizer.from_files(tmp_path / "copy" / "vocab.json",
                                         tmp_path / "copy" / "merges.txt", add_prefix_space=True)
    assert from_files.vocab_hash == tok.vocab_hash
    assert from_files.encode("the keeper") == tok.encode("the keeper")
    from_json = BpeTokenizer.from_file(tmp_path / "copy" / "tokenizer.json")
    assert from_json.add_prefix_space is True  # taken from the file's pre-tokenizer
    assert BpeTokenizer.from_file(tmp_path / "copy" / "tokenizer.json",
                                  add_prefix_space=False).add_prefix_space is False


def test_from_pretrained_falls_back_to_vocab_and_merges(tok: BpeTokenizer, tmp_path: Path) -> None:
    BpeTokenizer(tok.vocab, tok.merges, model_max_length=256).save(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    again = BpeTokenizer.from_pretrained(tmp_path)
    assert again.vocab_hash == tok.vocab_hash
    assert again.add_prefix_space is False and again.model_max_length == 256  # from the config
    (tmp_path / "tokenizer_config.json").unlink()
    assert BpeTokenizer.from_pretrained(tmp_path).model_max_length == 1024
    # transformers writes a huge model_max_length for models without a limit.
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 1e30}')
    assert BpeTokenizer.from_pretrained(tmp_path).model_max_length == 1024


def test_save_overwrites_atomically(tok: BpeTokenizer, tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_text("stale")
    tok.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == SAVED  # no temporary files left
    assert json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))["<s>"] == 0


# -- training --------------------------------------------------------------------------------------


def test_training_vocab_and_report(trained: tuple[Path, BpeReport], tok: BpeTokenizer) -> None:
    out, report = trained
    assert report.vocab_size == 400 == report.requested_vocab_size
    assert report.merges == len(tok.merges) == 400 - 5 - 256
    assert (report.vocab_path, report.merges_path, report.tokenizer_json) == (
        out / "vocab.json", out / "merges.txt", out / "tokenizer.json")
    assert sorted(p.name for p in out.iterdir()) == SAVED
    assert report.files_read == 1 and report.documents == 7
    assert report.bytes == CORPUS.stat().st_size and report.lowercase is False
    # All 256 byte symbols follow the specials, so no input needs <unk>.
    assert len(set(tok.vocab[5:261])) == 256 and all(len(t) == 1 for t in tok.vocab[5:261])
    assert {"Ġthe", "Ġand"} <= set(tok.vocab)  # frequent words were merged whole
    lines = report.summary().splitlines()
    assert lines[0] == (f"wrote byte-level BPE to {out} (400 tokens, 139 merges, a space added "
                        "before each text): vocab.json, merges.txt, tokenizer.json and "
                        "transformers configs")
    assert lines[1] == "read 1 file(s), 7 document(s), 0.0 MB of text"
    ids = [i for line in CORPUS.read_text(encoding="utf-8").splitlines() for i in tok.encode(line)]
    assert tok.unk_id not in ids and len(ids) < 0.6 * len(CORPUS.read_text(encoding="utf-8"))


def test_training_asks_for_more_than_the_corpus_has(tmp_path: Path) -> None:
    report = train_bpe([str(CORPUS)], 100_000, tmp_path, progress=False, add_prefix_space=False)
    assert report.vocab_size < 100_000
    assert "asked for 100000 tokens but the corpus supports only" in report.summary()
    assert "a space added" not in report.summary()
    assert BpeTokenizer.from_pretrained(tmp_path).add_prefix_space is False


def test_training_is_deterministic_across_processes(tmp_path: Path) -> None:
    # Hash-map seeds differ between processes, so a second process is the real check.
    train_bpe([str(CORPUS)], 500, tmp_path / "a", min_frequency=1, progress=False)
    code = ("import sys; from bertforge.tokenization.training import train_bpe; "
            "train_bpe([sys.argv[1]], 500, sys.argv[2], min_frequency=1, progress=False)")
    subprocess.run([sys.executable, "-c", code, str(CORPUS), str(tmp_path / "b")], check=True)
    for name in SAVED:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_training_reads_mixed_inputs(tmp_path: Path) -> None:
    docs = CORPUS.read_text(encoding="utf-8").split("\n\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("\n\n".join(docs[:4]), encoding="utf-8")
    (tmp_path / "in" / "b.jsonl").write_text("".join(json.dumps({"body": d}) + "\n"
                                                     for d in docs[4:]), encoding="utf-8")
    (tmp_path / "in" / "skip.pdf").write_bytes(b"%PDF")
    warnings: list[str] = []
    report = train_bpe([str(tmp_path / "in")], 300, tmp_path / "out", text_field="body",
                       progress=False, warn=warnings.append)
    assert report.files_read == 2 and report.documents == 7
    assert report.files_skipped[0][0].endswith("skip.pdf") and warnings
    assert "skipped 1 file(s):" in report.summary()


def test_training_errors(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"vocab_size=261 is too small; .* must exceed 261"):
        train_bpe([str(CORPUS)], 261, out, progress=False)
    with pytest.raises(ConfigError, match=r"min_frequency=0 must be at least 1"):
        train_bpe([str(CORPUS)], 300, out, min_frequency=0, progress=False)
    with pytest.raises(ConfigError, match=r"input format 'csv' is not known"):
        train_bpe([str(CORPUS)], 300, out, input_format="csv", progress=False)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match=r"afile is a file; BPE training writes a directory"):
        train_bpe([str(CORPUS)], 300, tmp_path / "afile", progress=False)
    with pytest.raises(DataError, match=r"afile is a file"):
        train_bpe([str(CORPUS)], 300, tmp_path / "afile" / "sub", progress=False)
    (tmp_path / "blank.txt").write_text("\n\n  \n")
    with pytest.raises(DataError, match=r"no text found in .*blank.txt \(only blank lines\)"):
        train_bpe([str(tmp_path / "blank.txt")], 300, out, progress=False)
    with pytest.raises(DataError, match=r"input .*missing.txt does not exist"):
        train_bpe([str(tmp_path / "missing.txt")], 300, out, progress=False)
    assert not out.exists()


# -- load_tokenizer and read_vocab_tokens ----------------------------------------------------------


def test_load_tokenizer_dispatches(trained: tuple[Path, BpeReport], tmp_path: Path) -> None:
    out = trained[0]
    assert isinstance(load_tokenizer(out), BpeTokenizer)
    assert isinstance(load_tokenizer(out / "tokenizer.json"), BpeTokenizer)
    only_files = tmp_path / "files"
    only_files.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (only_files / name).write_bytes((out / name).read_bytes())
    loaded = load_tokenizer(only_files)
    assert isinstance(loaded, BpeTokenizer)
    assert loaded.vocab_hash == BpeTokenizer.from_pretrained(out).vocab_hash
    train_wordpiece([str(CORPUS)], 200, tmp_path / "wp" / "vocab.txt", progress=False)
    wordpiece = tmp_path / "wp"
    for path in (wordpiece, wordpiece / "vocab.txt", wordpiece / "tokenizer.json"):
        assert isinstance(load_tokenizer(path), BertTokenizer)


def test_load_tokenizer_errors(trained: tuple[Path, BpeReport], tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"holds no tokenizer: expected tokenizer.json, vocab.txt"):
        load_tokenizer(tmp_path)
    with pytest.raises(DataError, match=r"tokenizer .*nope does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(DataError, match=r"one half of a BPE tokenizer; give the directory"):
        load_tokenizer(trained[0] / "vocab.json")
    unigram = tmp_path / "unigram.json"
    unigram.write_text(json.dumps({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}))
    with pytest.raises(DataError, match=r"model type is 'Unigram'; bertforge loads WordPiece"):
        load_tokenizer(unigram)
    # BERT-only loaders keep their WordPiece error for a BPE file.
    with pytest.raises(DataError, match=r"model type is 'BPE', not a WordPiece vocabulary"):
        BertTokenizer.from_file(trained[0] / "tokenizer.json")
    with pytest.raises(DataError, match=r"model type is 'BPE', not a WordPiece vocabulary"):
        BertTokenizer.from_pretrained(trained[0])


def test_read_vocab_tokens_of_bpe_directories(trained: tuple[Path, BpeReport], tok: BpeTokenizer,
                                              tmp_path: Path) -> None:
    assert read_vocab_tokens(trained[0]) == list(tok.vocab)
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((trained[0] / name).read_bytes())
    assert read_vocab_tokens(tmp_path) == list(tok.vocab)
    (tmp_path / "merges.txt").unlink()
    assert read_vocab_tokens(tmp_path) is None  # vocab.json alone is no tokenizer


# -- loading errors --------------------------------------------------------------------------------


def _write(path: Path, content: object) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_vocab_json_errors(tiny_files: tuple[Path, Path], tmp_path: Path) -> None:
    _, merges = tiny_files
    cases = [
        ("not json", r"bad.json:1:1: not valid JSON"),
        ([1, 2], r"expected a JSON object at the top level"),
        ({}, r"the vocabulary is empty; train one"),
        ({"<s>": "0"}, r"token '<s>' has id '0'; vocab.json maps every token to an integer id"),
        ({"<s>": True}, r"token '<s>' has id True"),
        ({"<s>": 0, "a": 2}, r"token ids are not 0..1 without gaps \(no token has id 1\)"),
        ({"<s>": 0, "a": 0}, r"tokens '<s>' and 'a' both have id 0"),
        ({"model": {"type": "BPE"}}, r"is a tokenizer.json, not a vocab.json; load it with"),
    ]
    for content, message in cases:
        with pytest.raises(DataError, match=message):
            BpeTokenizer.from_files(_write(tmp_path / "bad.json", content), merges)
    with pytest.raises(DataError, match=r"missing.json does not exist; check the path"):
        BpeTokenizer.from_files(tmp_path / "missing.json", merges)
    (tmp_path / "latin1.json").write_bytes(b'{"\xe9": 0}')
    with pytest.raises(DataError, match=r"latin1.json:1: not UTF-8 text \(byte 0xe9\)"):
        BpeTokenizer.from_files(tmp_path / "latin1.json", merges)


def test_merges_txt_errors(tiny_files: tuple[Path, Path], tmp_path: Path) -> None:
    vocab, _ = tiny_files
    with pytest.raises(DataError, match=r"bad.txt:3: 'Ġl o w' is not two tokens separated by one"):
        BpeTokenizer.from_files(vocab, _write(tmp_path / "bad.txt", "#version: 0.2\nĠ l\nĠl o w\n"))
    with pytest.raises(DataError, match=r"bad.txt:1: 'e  r' is not two tokens"):
        BpeTokenizer.from_files(vocab, _write(tmp_path / "bad.txt", "e  r\n"))
    with pytest.raises(DataError, match=r"merges file .*none.txt does not exist"):
        BpeTokenizer.from_files(vocab, tmp_path / "none.txt")
    with pytest.raises(DataError, match=r"is a directory; pass the merges.txt inside it"):
        BpeTokenizer.from_files(vocab, tmp_path)
    (tmp_path / "latin1.txt").write_bytes(b"\xe9 r\n")
    with pytest.raises(DataError, match=r"latin1.txt is not UTF-8 text; is it a merges.txt"):
        BpeTokenizer.from_files(vocab, tmp_path / "latin1.txt")
    # A merge whose parts or result the vocabulary lacks: the files do not belong together.
    with pytest.raises(DataError, match=r"merge 2 \('a' \+ 'w'\) uses or makes a token that is "
                                        r"not in the vocabulary"):
        BpeTokenizer.from_files(vocab, _write(tmp_path / "m.txt", "e r\na w\n"))
    # A merge written with "\r\n" line ends still parses.
    crlf = BpeTokenizer.from_files(vocab, _write(tmp_path / "m.txt", "e r\r\nĠ l\r\n"))
    assert crlf.merges == (("e", "r"), ("Ġ", "l"))


def test_vocabulary_content_errors(tmp_path: Path) -> None:
    merges = _write(tmp_path / "merges.txt", "")
    no_mask = {t: i for i, t in enumerate(TINY_VOCAB[:-1])}
    with pytest.raises(DataError, match=r"special token\(s\) <mask> missing from the vocabulary"):
        BpeTokenizer.from_files(_write(tmp_path / "vocab.json", no_mask), merges)
    with pytest.raises(DataError, match=r"token 'a' appears twice"):
        BpeTokenizer([*BPE_SPECIAL_TOKENS, "a", "b", "a"], [])
    with pytest.raises(ValueError, match=r"model_max_length must be >= 1, got 0"):
        BpeTokenizer(BPE_SPECIAL_TOKENS, [], model_max_length=0)


def test_tokenizer_json_errors(tok: BpeTokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path / "good")
    good = json.loads((tmp_path / "good" / "tokenizer.json").read_text(encoding="utf-8"))

    def variant(**changes: object) -> Path:
        return _write(tmp_path / "tokenizer.json", {**good, **changes})

    wordpiece = {"type": "WordPiece", "vocab": {"[PAD]": 0}}
    with pytest.raises(DataError, match=r"model type is 'WordPiece' \(that is BERT's; load it "
                                        r"with BertTokenizer\), not a byte-level BPE"):
        BpeTokenizer.from_file(variant(model=wordpiece))
    with pytest.raises(DataError, match=r"model type is None, not a byte-level BPE"):
        BpeTokenizer.from_file(variant(model=[]))
    with pytest.raises(DataError, match=r"marks word pieces with a prefix or suffix"):
        BpeTokenizer.from_file(variant(model={**good["model"], "continuing_subword_prefix": "##"}))
    metaspace = {"type": "Metaspace", "replacement": "▁"}
    with pytest.raises(DataError, match=r"pre-tokenizer is 'Metaspace', not GPT-2's ByteLevel"):
        BpeTokenizer.from_file(variant(pre_tokenizer=metaspace))
    with pytest.raises(DataError, match=r"pre-tokenizer is None"):
        BpeTokenizer.from_file(variant(pre_tokenizer=None))
    with pytest.raises(DataError, match=r"has a normalizer"):
        BpeTokenizer.from_file(variant(normalizer={"type": "Lowercase"}))
    with pytest.raises(DataError, match=r"merge 2 is \['a'\], not"):
        BpeTokenizer.from_file(variant(model={**good["model"], "merges": [["Ġ", "t"], ["a"]]}))
    gap = dict(good["model"]["vocab"])
    gap["extra"] = len(gap) + 1
    with pytest.raises(DataError, match=r"token ids are not 0..400 without gaps \(no token "
                                        r"has id 400\); the file is damaged"):
        BpeTokenizer.from_file(variant(model={**good["model"], "vocab": gap}))
    with pytest.raises(DataError, match=r"a token id is not an integer"):
        BpeTokenizer.from_file(variant(model={**good["model"], "vocab": {"<s>": "x"}}))
    # Old-style "a b" merges (tokenizers < 0.20) load the same.
    old_style = [" ".join(m) for m in good["model"]["merges"]]
    again = BpeTokenizer.from_file(variant(model={**good["model"], "merges": old_style}))
    assert again.vocab_hash == tok.vocab_hash
    with pytest.raises(DataError, match=r"not valid JSON"):
        BpeTokenizer.from_file(_write(tmp_path / "tokenizer.json", "{"))
    with pytest.raises(DataError, match=r"tokenizer directory .*nowhere does not exist"):
        BpeTokenizer.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"has neither tokenizer.json nor vocab.json \+ merges.txt"):
        BpeTokenizer.from_pretrained(tmp_path / "empty")
