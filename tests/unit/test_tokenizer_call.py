"""Calling a tokenizer as transformers' tokenizers are called: ids, masks, token types and
offsets equal to transformers' fast tokenizer loaded from the same saved files, for every
padding and truncation choice, single texts, pairs and batches; tensors; the argument errors;
and ``word_bounds`` (the QA pipeline's whole-word answers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.tokenization import BertTokenizer, BpeTokenizer
from bertforge.tokenization.training import train_bpe, train_wordpiece

transformers = pytest.importorskip("transformers")

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world!",
         "Ada wrote the note in 1843; nobody read it for a century.", "x"]
PAIRS = ["A short second text.", "Another one, a little longer than the first pair text.",
         "ok", "Zebras."]

# (padding, truncation, max_length, pad_to_multiple_of): every strategy of each argument.
CASES = [(False, None, None, None), (True, None, None, None), ("longest", False, None, None),
         ("max_length", True, 24, None), (False, True, 9, None), (False, None, 9, None),
         (True, "longest_first", 12, None), (True, "only_second", 40, None),
         (True, "only_first", 36, None),
         (True, True, None, 8), ("max_length", True, 10, 8), ("max_length", True, 16, 8)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories of a trained WordPiece (BERT) and a trained byte-level BPE (BART)."""
    root = tmp_path_factory.mktemp("tokcall")
    train_wordpiece([str(CORPUS)], 300, root / "vocab.txt", min_frequency=1, progress=False)
    BertTokenizer.from_file(root / "vocab.txt").save(root / "wp")
    train_bpe([str(CORPUS)], 400, root / "bpe", min_frequency=1, progress=False)
    return {"wp": root / "wp", "bpe": root / "bpe"}


def pair_of(kind: str, saved: dict[str, Path]):
    if kind == "wp":
        ours = BertTokenizer.from_pretrained(saved["wp"])
        theirs = transformers.BertTokenizerFast(tokenizer_file=str(saved["wp"] / "tokenizer.json"))
    else:
        ours = BpeTokenizer.from_pretrained(saved["bpe"])
        theirs = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(saved["bpe"] / "tokenizer.json"), bos_token="<s>",
            eos_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
            model_max_length=ours.model_max_length, model_input_names=["input_ids",
                                                                       "attention_mask"])
    return ours, theirs


def as_lists(encoding) -> dict:
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in encoding.items()}


@pytest.mark.parametrize("kind", ["wp", "bpe"])
@pytest.mark.parametrize("padding,truncation,max_length,multiple", CASES)
def test_batches_and_pairs_equal_transformers(saved, kind, padding, truncation, max_length,
                                              multiple):
    ours, theirs = pair_of(kind, saved)
    args = dict(padding=padding, truncation=truncation, max_length=max_length,
                pad_to_multiple_of=multiple)
    for pair in (None, PAIRS):
        try:
            want = theirs(TEXTS, pair, **args)
        except Exception:  # a cut that cannot be made: both refuse
            with pytest.raises(ValueError, match=f"max_length={max_length}"):
                ours(TEXTS, pair, **args)
            continue
        got = ours(TEXTS, pair, **args)
        assert as_lists(got) == dict(want), (kind, args, pair)
        lengths = {len(ids) for ids in got["input_ids"]}
        assert len(lengths) == 1 or padding is False  # padding does what it says


@pytest.mark.parametrize("kind", ["wp", "bpe"])
def test_single_texts_tensors_offsets_and_options_equal_transformers(saved, kind):
    ours, theirs = pair_of(kind, saved)
    text = TEXTS[2]
    assert as_lists(ours(text)) == dict(theirs(text))
    assert as_lists(ours(text, PAIRS[0])) == dict(theirs(text, PAIRS[0]))
    for options in (dict(add_special_tokens=False), dict(return_offsets_mapping=True),
                    dict(return_token_type_ids=True, return_attention_mask=False)):
        assert as_lists(ours(TEXTS, **options)) == dict(theirs(TEXTS, **options)), options
    got, want = ours(TEXTS, padding=True, return_tensors="pt"), theirs(
        TEXTS, padding=True, return_tensors="pt")
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == torch.int64 and torch.equal(got[key], want[key])
    single = ours(text, return_tensors="np")
    assert single["input_ids"].shape == (1, len(ours.encode(text)))
    assert np.array_equal(single.input_ids, theirs(text, return_tensors="np")["input_ids"])


def test_bert_returns_token_types_and_bart_does_not(saved):
    bert, _ = pair_of("wp", saved)
    bart, _ = pair_of("bpe", saved)
    assert list(bert("a b", "c")) == ["input_ids", "token_type_ids", "attention_mask"]
    assert list(bart("a b", "c")) == ["input_ids", "attention_mask"]
    assert bert("a b", "c").token_type_ids[-2:] == [1, 1]


def test_the_encoding_feeds_a_model_and_moves(saved):
    bert, _ = pair_of("wp", saved)
    enc = bert(TEXTS, padding=True, return_tensors="pt").to("cpu")
    assert enc.input_ids.shape == enc.attention_mask.shape == (len(TEXTS), enc.input_ids.shape[1])
    with pytest.raises(AttributeError, match="has no 'labels'"):
        enc.labels


@pytest.mark.parametrize("call,message", [
    (dict(text=5), "text must be a string or a list of strings, got int"),
    (dict(text=["a", 3]), "text must be a string or a list of strings"),
    (dict(text=["a", "b"], text_pair="c"), "text_pair must match text"),
    (dict(text=["a", "b"], text_pair=["c"]), "got 2 texts and 1 pairs"),
    (dict(text="a", padding="yes"), "padding='yes' is not one of"),
    (dict(text="a", truncation="middle"), "truncation='middle' is not one of"),
    (dict(text="a", return_tensors="tf"), "return_tensors='tf' is not one of"),
    (dict(text=["a", "a b c"], return_tensors="pt"), "different lengths; pass padding=True"),
    (dict(text="a b c d", text_pair="e", truncation="only_second", max_length=5),
     "cannot truncate to max_length=5 with only_second"),
    (dict(text="a", padding=True, truncation=True, max_length=10, pad_to_multiple_of=8),
     "max_length=10 is not a multiple of pad_to_multiple_of=8"),
])
def test_argument_errors_say_what_is_wrong(saved, call, message):
    bert, _ = pair_of("wp", saved)
    with pytest.raises((TypeError, ValueError), match=message):
        bert(**call)


@pytest.mark.parametrize("kind", ["wp", "bpe"])
def test_word_bounds_widen_a_span_to_whole_words(saved, kind):
    tok, _ = pair_of(kind, saved)
    text = "The note was written by Ada in 1843, they said."
    year = text.index("1843")
    assert text[slice(*tok.word_bounds(text, year, year + 1))] == "1843"
    assert text[slice(*tok.word_bounds(text, year + 2, year + 3))] == "1843"
    start = text.index("written") + 3
    assert text[slice(*tok.word_bounds(text, start, year + 1))] == "written by Ada in 1843"
    whole = text.index("Ada")
    assert tok.word_bounds(text, whole, whole + 3) == (whole, whole + 3)  # already whole
    comma = year + 4  # punctuation is its own word: "1843" does not take the comma
    assert tok.word_bounds(text, year, comma) == (year, comma)
