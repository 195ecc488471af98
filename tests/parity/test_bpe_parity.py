"""Byte-level BPE ids and decodes identical to transformers' BART tokenizer.

(a) A directory written by ``train_bpe`` (with and without the prefix space) loaded by
``AutoTokenizer``; (b) GPT-2-style vocab.json + merges.txt trained here with the `tokenizers`
library alone (BART's layout: <mask> last) loaded by transformers' BART tokenizer class and by
``BpeTokenizer.from_files``; (c) the directory transformers saves from (b) loaded back by
``BpeTokenizer.from_pretrained``. Inputs mix English, accents, CJK, emoji, control characters,
runs of spaces, <mask> in several positions and special-token spellings, single and paired.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from bertforge.tokenization.bpe import BpeTokenizer
from bertforge.tokenization.training import train_bpe

transformers = pytest.importorskip("transformers")

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
TEXTS = [
    "The lighthouse keeper kept a logbook.",
    " leading space and trailing space ",
    "two  spaces\tand a tab\nand a newline",
    "café naïve Ångström São Paulo straße",
    "你好世界 日本語のテキスト 한국어",
    "Привет мир مرحبا שלום",
    "🙂 👍🏽 🇫🇷 emoji",
    "the <mask> keeper",
    "<mask> at the start",
    "at the end <mask>",
    "glued<mask>words and two <mask> <mask> masks",
    "<s> raw specials </s> <pad> <unk>",
    "<MASK> is not special",
    "don't U.S.A. 1,000.50 $5 #tag @user C++",
    "\x00\x07\u200b\ufeff control characters",
    "supercalifragilistic" * 5,
    "",
    " ",
    "x",
    "e\u0301 combining ﬁ ligature x² Ⅻ",
]
# (An empty second text is left out: transformers drops a falsy pair, we encode it as a pair.)
PAIRS = [(TEXTS[i], TEXTS[-1 - i] or "x") for i in range(0, len(TEXTS), 2)]


def assert_same(ours: BpeTokenizer, hf) -> None:
    """Same ids for every text and pair, and the same decodes with and without specials."""
    for text in TEXTS:
        ids = ours.encode(text)
        assert hf(text)["input_ids"] == ids, text
        assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids), text
        assert hf.decode(ids, skip_special_tokens=False) == ours.decode(
            ids, skip_special_tokens=False), text
    for first, second in PAIRS:
        assert hf(first, second)["input_ids"] == ours.encode(first, second), (first, second)
    assert hf.mask_token_id == ours.mask_id and hf.pad_token_id == ours.pad_id
    assert (hf.bos_token_id, hf.eos_token_id, hf.unk_token_id) == (ours.bos_id, ours.eos_id,
                                                                    ours.unk_id)
    assert len(hf) == ours.vocab_size


@pytest.mark.parametrize("prefix", [True, False])
def test_saved_directory_loads_in_auto_tokenizer(tmp_path: Path, prefix: bool) -> None:
    train_bpe([str(CORPUS)], 500, tmp_path, min_frequency=1, progress=False,
              add_prefix_space=prefix)
    ours = BpeTokenizer.from_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.model_max_length == ours.model_max_length == 1024
    assert_same(ours, hf)


def _gpt2_style_files(directory: Path) -> None:
    """vocab.json + merges.txt trained by `tokenizers` alone, laid out like BART's: <s> <pad>
    </s> <unk> first and <mask> as the last id."""
    trainer_tok = Tokenizer(BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = BpeTrainer(vocab_size=600, min_frequency=1, show_progress=False,
                         special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trainer_tok.train([str(CORPUS)], trainer=trainer)
    trainer_tok.model.save(str(directory))  # writes vocab.json and merges.txt
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    vocab["<mask>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")


@pytest.mark.parametrize("prefix", [False, True])
def test_vocab_and_merges_match_transformers_bart(tmp_path: Path, prefix: bool) -> None:
    _gpt2_style_files(tmp_path)
    # BART's published tokenizer declares <mask> as stripping the space on its left;
    # transformers 5 does not assume it for bare vocab.json + merges.txt, so it is passed here.
    mask = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
    hf = transformers.BartTokenizerFast.from_pretrained(str(tmp_path), add_prefix_space=prefix,
                                                        mask_token=mask)
    ours = BpeTokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt",
                                   add_prefix_space=prefix)
    assert ours.mask_id == ours.vocab_size - 1 == 600
    assert_same(ours, hf)
    # (c) What transformers saves from those files loads back with the same ids.
    hf.save_pretrained(str(tmp_path / "hf"))
    again = BpeTokenizer.from_pretrained(tmp_path / "hf")
    assert again.vocab_hash == ours.vocab_hash and again.add_prefix_space is prefix
    assert_same(again, hf)
