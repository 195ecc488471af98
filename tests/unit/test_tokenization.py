"""BertTokenizer: loading, saving, special ids, encode/decode and every loading error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from bertforge.errors import DataError
from bertforge.tokenization import (
    SPECIAL_TOKENS,
    BertTokenizer,
    check_casing,
    read_vocab_txt,
    vocab_casing,
)

# A hand-made uncased vocabulary with Google's layout: [PAD] first, the others further down.
VOCAB = ["[PAD]", "[unused0]", "the", "cat", "sat", "on", "mat", ".", ",", "un", "##aff", "##able",
         "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##s", "dog", "!", "caf", "##e", "你", "好"]


@pytest.fixture()
def vocab_file(tmp_path: Path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def tok(vocab_file: Path) -> BertTokenizer:
    return BertTokenizer.from_file(vocab_file)


def test_special_ids_are_looked_up_not_assumed(tok: BertTokenizer) -> None:
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 12, 13, 14, 15)
    assert tok.vocab_size == len(VOCAB)
    assert tok.do_lower_case is True  # no upper-case token: guessed uncased


def test_encode_single_and_pair(tok: BertTokenizer) -> None:
    # Lower-casing, accent stripping, punctuation split and greedy longest-match pieces.
    assert tok.tokenize("The Cat sat, UNAFFABLE Café!") == [
        "the", "cat", "sat", ",", "un", "##aff", "##able", "caf", "##e", "!"
    ]
    assert tok.encode("the cat") == [13, 2, 3, 14]
    assert tok.encode("the cat", "a dog") == [13, 2, 3, 14, 16, 18, 14]
    # An explicit empty second segment still gets its [SEP].
    assert tok.encode("the", "") == [13, 2, 14, 14]
    # CJK characters are split apart; unknown words and words over 100 chars become [UNK].
    assert tok.tokenize("你好") == ["你", "好"]
    assert tok.encode("zebra " + "a" * 101 + " a" * 1) == [13, 12, 12, 16, 14]


def test_encode_batch_matches_encode_without_specials(tok: BertTokenizer) -> None:
    texts = ["the cat sat on the mat.", "", "unaffable dogs!", "x"]
    batch = tok.encode_batch(texts)
    assert batch == [tok.encode(t)[1:-1] for t in texts]
    assert tok.encode_batch(texts, add_special_tokens=True) == [tok.encode(t) for t in texts]


def test_special_token_text_is_one_token(tok: BertTokenizer) -> None:
    assert tok.encode("the [MASK] sat") == [13, 2, 15, 4, 14]
    # Only the exact spelling is special; lower-case "[mask]" is ordinary text.
    assert 15 not in tok.encode("the [mask] sat")


def test_decode_and_convert(tok: BertTokenizer) -> None:
    ids = tok.encode("The unaffable cat sat.")
    assert tok.decode(ids) == "the unaffable cat sat."
    assert tok.decode(ids, skip_special_tokens=False).startswith("[CLS] the")
    assert tok.convert_ids_to_tokens([13, 9, 10]) == ["[CLS]", "un", "##aff"]
    assert tok.convert_tokens_to_ids(["cat", "zebra"]) == [3, 12]


def test_is_continuation_and_hash(tok: BertTokenizer, vocab_file: Path) -> None:
    expected = np.array([t.startswith("##") for t in VOCAB])
    assert tok.is_continuation.dtype == np.bool_
    np.testing.assert_array_equal(tok.is_continuation, expected)
    assert tok.vocab_hash == hashlib.sha256(vocab_file.read_bytes()).hexdigest()


def test_save_and_from_pretrained_round_trip(tok: BertTokenizer, tmp_path: Path) -> None:
    out = tmp_path / "model"
    tok.save(out)
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"
    ]
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert config["model_max_length"] == 512 and config["mask_token"] == "[MASK]"
    back = BertTokenizer.from_pretrained(out)
    assert back.vocab_hash == tok.vocab_hash and back.do_lower_case
    text = "The unaffable cat sat on the mat, 你好!"
    assert back.encode(text, "a dog") == tok.encode(text, "a dog")
    # The tokenizer.json alone carries the same pipeline.
    assert BertTokenizer.from_file(out / "tokenizer.json").encode(text) == tok.encode(text)


def test_saved_dir_loads_in_transformers(tok: BertTokenizer, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text, pair in [("The cat sat.", None), ("UNAFFABLE café", "a dog!"), ("", None)]:
        assert hf(text, pair)["input_ids"] == tok.encode(text, pair)


def test_stored_truncation_is_ignored(tok: BertTokenizer, tmp_path: Path) -> None:
    # Hub tokenizer.json files often carry fixed padding/truncation; encode must not apply them.
    tok.save(tmp_path)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["truncation"] = {
        "max_length": 4, "strategy": "LongestFirst", "stride": 0, "direction": "Right"
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    loaded = BertTokenizer.from_file(tmp_path / "tokenizer.json")
    assert len(loaded.encode("the cat sat on the mat")) == 8


def test_casing_from_config_and_guard(tmp_path: Path) -> None:
    cased = list(SPECIAL_TOKENS) + [w for c in "ABCDEFGHIJKL" for w in (c, c.lower())]
    (tmp_path / "vocab.txt").write_text("\n".join(cased) + "\n")
    assert BertTokenizer.from_file(tmp_path / "vocab.txt").do_lower_case is False  # guessed cased
    message = r"vocab.txt: the vocabulary is cased \(12 tokens have upper-case letters.*'A', 'B'"
    with pytest.raises(DataError, match=message):
        BertTokenizer.from_file(tmp_path / "vocab.txt", lowercase=True)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert BertTokenizer.from_pretrained(tmp_path).do_lower_case is False
    message = r"was saved with do_lower_case=False, not True: the vocabulary is cased"
    with pytest.raises(DataError, match=message):
        BertTokenizer.from_pretrained(tmp_path, lowercase=True)


def test_check_casing_rules() -> None:
    uncased = list(SPECIAL_TOKENS) + ["the", "cat", "##s"]
    check_casing(uncased, True, "v")
    with pytest.raises(DataError, match=r"^v: the vocabulary is uncased .* drop --cased"):
        check_casing(uncased, False, "v")
    # Caseless scripts give no verdict either way.
    check_casing(list(SPECIAL_TOKENS) + ["你", "好"], False, "v")
    # A handful of upper-case tokens (acronyms in an uncased vocab) is not "cased".
    check_casing(uncased + ["NASA", "UK"], True, "v")
    cased = uncased + [w.title() for w in "alpha beta gamma delta eta iota kappa mu nu xi".split()]
    assert [vocab_casing(v) for v in (uncased, cased, uncased + ["NASA"], ["你", "好"])] == [
        "uncased", "cased", None, None
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", r"vocab.txt is empty; build one with `bertforge vocab`"),
        (b"[PAD]\n\n[UNK]\n", r"vocab.txt:2: empty line"),
        (b"[PAD]\n[UNK]\nthe\nthe\n", r"vocab.txt:4: token 'the' repeats line 3"),
        (b"[PAD]\nthe\t12\n", r"vocab.txt:2: token 'the\\t12' contains a space or tab.*word-count"),
        (b"[PAD]\n\xff\xfe\n", r"vocab.txt:2: not valid UTF-8"),
        (b"[PAD]\n[UNK]\n[CLS]\nthe\n", r"special token\(s\) \[SEP\], \[MASK\] missing from the"),
    ],
)
def test_bad_vocab_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "vocab.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        BertTokenizer.from_file(path)
    assert str(path) in str(info.value)


def test_crlf_vocab_is_read(tmp_path: Path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_bytes("\r\n".join(VOCAB).encode() + b"\r\n")
    assert read_vocab_txt(path) == VOCAB


def test_missing_paths_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope.txt does not exist; check the path"):
        BertTokenizer.from_file(tmp_path / "nope.txt")
    with pytest.raises(DataError, match=r"tokenizer directory .*missing does not exist"):
        BertTokenizer.from_pretrained(tmp_path / "missing")
    with pytest.raises(DataError, match=r"has neither tokenizer.json nor vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{\n  "model": {\n    "type": "WordPiece",\n  }\n}')
    with pytest.raises(DataError, match=r"tokenizer.json:4:3: not valid JSON"):
        BertTokenizer.from_file(bad)
    bad.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}}}))
    with pytest.raises(DataError, match=r"model type is 'BPE', not a WordPiece vocabulary"):
        BertTokenizer.from_file(bad)
    bad.write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {"[PAD]": 0, "[UNK]": 2}}}))
    with pytest.raises(DataError, match=r"token ids are not 0..1 without gaps"):
        BertTokenizer.from_file(bad)


def test_windows_carry_offsets_sequence_and_word_ids(tok: BertTokenizer) -> None:
    (w,) = tok.encode_windows(["the cat"], ["unaffable dog!"], max_length=16)
    assert tok.convert_ids_to_tokens(w.ids) == ["[CLS]", "the", "cat", "[SEP]", "un", "##aff",
                                                "##able", "dog", "!", "[SEP]"]
    assert w.type_ids == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert w.sequence_ids == [None, 0, 0, None, 1, 1, 1, 1, 1, None]
    assert w.word_ids == [None, 0, 1, None, 0, 0, 0, 1, 2, None]
    # Offsets index each token's own text: "unaffable dog!" -> un|aff|able, dog, !
    assert w.offsets[4:9] == [(0, 2), (2, 5), (5, 9), (10, 13), (13, 14)] and w.source == 0


def test_overflowing_windows_keep_the_first_text_and_overlap_by_stride(
        tok: BertTokenizer) -> None:
    context = "the cat sat on the mat . the dog sat on a mat"  # 13 tokens
    windows = tok.encode_windows(["a cat", "dog"], [context, "the mat"], max_length=10, stride=2,
                                 truncation="only_second", overflow=True)
    first = [w for w in windows if w.source == 0]
    assert [w.source for w in windows] == [0] * len(first) + [1]
    spans = []
    for w in first:
        assert len(w.ids) <= 10 and tok.convert_ids_to_tokens(w.ids[:4]) == [
            "[CLS]", "a", "cat", "[SEP]"]
        spans.append([o for o, s in zip(w.offsets, w.sequence_ids) if s == 1])
    # 5 context tokens per window, consecutive windows share 2: every token is covered.
    assert all(a[-2:] == b[:2] for a, b in zip(spans, spans[1:]))
    covered = {o for span in spans for o in span}
    assert len(covered) == 13 and spans[-1][-1] == (len(context) - 3, len(context))


def test_pretokenized_words_and_truncation(tok: BertTokenizer) -> None:
    (w,) = tok.encode_windows([["unaffable", "cats", "sat"]], max_length=5, is_pretokenized=True)
    assert tok.convert_ids_to_tokens(w.ids) == ["[CLS]", "un", "##aff", "##able", "[SEP]"]
    assert w.word_ids == [None, 0, 0, 0, None]  # "cats sat" cut off
    assert tok.truncate_text("the cat sat on the mat", 3) == "the cat sat"
    assert tok.truncate_text("the cat", 3) == "the cat"
    with pytest.raises(ValueError, match="same length"):
        tok.encode_windows(["a"], ["b", "c"], max_length=8)
    with pytest.raises(ValueError, match="room for special tokens"):
        tok.encode_windows(["a"], ["b"], max_length=3)
