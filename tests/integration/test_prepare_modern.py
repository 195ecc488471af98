"""ModernBERT-style MLM data end to end: a tiny byte-level BPE with BERT's specials trained on the
tiny corpus, `prepare --objective none`, then batches from the existing loader masked at 0.3
with the tokenizer's ids (padded, packed, whole words on "Ġ" word starts)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data import native
from bertforge.data.batch import IGNORE_INDEX
from bertforge.data.native import NativeDataset
from bertforge.data.open import build_loader
from bertforge.tokenization import ModernBpeTokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"
MAX_PREDICTIONS = 40  # above 0.3 x 62 maskable tokens: the rate alone decides the count


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModernBpeTokenizer]:
    root = tmp_path_factory.mktemp("modern-data")
    assert main(["vocab", "--input", str(CORPUS), "--output", str(root / "tok"), "--type",
                 "modernbert", "--vocab-size", "600"]) == 0
    assert main(["prepare", "--input", str(CORPUS), "--vocab", str(root / "tok"), "--output",
                 str(root / "data"), "--objective", "none", "--max-seq-length", "64",
                 "--masked-lm-prob", "0.3", "--max-predictions", str(MAX_PREDICTIONS),
                 "--validation-fraction", "0"]) == 0
    return root / "data", load_tokenizer(root / "tok")


def _specials(tok: ModernBpeTokenizer) -> list[int]:
    return [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]


def test_manifest_and_saved_tokenizer(prepared: tuple[Path, ModernBpeTokenizer]) -> None:
    data, tok = prepared
    manifest = native.read_manifest(data)
    assert manifest["special_ids"] == {"pad": tok.pad_id, "unk": tok.unk_id, "cls": tok.cls_id,
                                       "sep": tok.sep_id, "mask": tok.mask_id}
    assert manifest["vocab_size"] == tok.vocab_size and manifest["vocab_hash"] == tok.vocab_hash
    assert manifest["objective"] == "none" and manifest["do_lower_case"] is False
    assert manifest["masked_lm_prob"] == 0.3
    saved = load_tokenizer(data / manifest["tokenizer"])
    assert type(saved) is ModernBpeTokenizer and saved.vocab_hash == tok.vocab_hash


def test_sequences_are_running_text_between_cls_and_sep(
        prepared: tuple[Path, ModernBpeTokenizer]) -> None:
    data, tok = prepared
    dataset = NativeDataset(data, "train")
    text = " ".join(CORPUS.read_text(encoding="utf-8").split())
    for i in range(len(dataset)):
        tokens, a_length, nsp = dataset.get(i)
        tokens = list(np.asarray(tokens))
        assert tokens[0] == tok.cls_id and tokens[-1] == tok.sep_id and len(tokens) <= 64
        assert a_length == len(tokens) and nsp == -1
        assert not set(tokens[1:-1]) & set(_specials(tok))
        # Sentences tokenized one by one decode as the corpus reads, spaces between them.
        decoded = " ".join(tok.decode(tokens).split())
        assert decoded in text, decoded
    counts = native.read_manifest(data)["counts"]
    assert counts["instances"] < counts["sentences"]  # short sentences share a sequence


def _check_batch(batch: dict, tok: ModernBpeTokenizer, whole_words: bool) -> int:
    """Masking invariants of one batch; returns how many tokens it predicts."""
    ids, labels = batch["input_ids"].numpy(), batch["mlm_labels"].numpy()
    attention, types = batch["attention_mask"].numpy(), batch["token_type_ids"].numpy()
    specials = np.array(_specials(tok))
    assert (types == 0).all()
    predicted = labels != IGNORE_INDEX
    assert not np.isin(labels[predicted], specials).any()  # specials are never targets
    assert (attention[predicted] == 1).all()
    # Unpredicted tokens are untouched; replacements are [MASK] or ordinary tokens.
    original = np.where(predicted, labels, ids)
    assert not np.isin(ids[~predicted & (attention == 1)], [tok.mask_id]).any()
    changed = predicted & (ids != labels)
    assert not np.isin(ids[changed & (ids != tok.mask_id)], specials).any()
    assert (ids[predicted] == tok.mask_id).mean() > 0.6  # 80% become [MASK]
    if whole_words:
        maskable = (attention == 1) & ~np.isin(original, specials)
        cont = tok.is_continuation[original] & maskable
        # A continuation is predicted exactly when the token before it (same word) is.
        inner = cont[:, 1:] & maskable[:, :-1]
        assert (predicted[:, 1:][inner] == predicted[:, :-1][inner]).all()
    return int(predicted.sum())


def test_padded_batches_mask_thirty_percent(prepared: tuple[Path, ModernBpeTokenizer]) -> None:
    data, tok = prepared
    loader = build_loader(data, global_batch_size=8, micro_batch_size=8, seed=3)
    stream = iter(loader)
    for _ in range(len(loader)):
        batch = next(stream)
        _check_batch(batch, tok, whole_words=False)
        ids, labels = batch["input_ids"].numpy(), batch["mlm_labels"].numpy()
        original = np.where(labels != IGNORE_INDEX, labels, ids)
        for row, lab, att in zip(original, labels, batch["attention_mask"].numpy()):
            maskable = int(((att == 1) & ~np.isin(row, _specials(tok))).sum())
            want = min(MAX_PREDICTIONS, max(1, round(maskable * 0.3)))
            assert int((lab != IGNORE_INDEX).sum()) == want


def test_whole_word_masking_on_byte_level_word_starts(
        prepared: tuple[Path, ModernBpeTokenizer]) -> None:
    data, tok = prepared
    loader = build_loader(data, global_batch_size=8, micro_batch_size=8, seed=5,
                          whole_word_masking=True, is_continuation=tok.is_continuation)
    stream = iter(loader)
    predicted = sum(_check_batch(next(stream), tok, whole_words=True) for _ in range(len(loader)))
    assert predicted > 0
    pieces = [t for t in tok.vocab if re.fullmatch(r"[a-z]+", t)]  # word pieces continue words
    assert pieces and all(tok.is_continuation[tok.vocab.index(t)] for t in pieces)


def test_packed_rows_keep_the_ids(prepared: tuple[Path, ModernBpeTokenizer]) -> None:
    data, tok = prepared
    loader = build_loader(data, global_batch_size=8, micro_batch_size=8, seed=7, pack_width=64)
    batch = next(iter(loader))
    _check_batch(batch, tok, whole_words=False)
    ids, positions = batch["input_ids"].numpy(), batch["position_ids"].numpy()
    starts = (positions == 0) & (batch["attention_mask"].numpy() == 1)
    original = np.where(batch["mlm_labels"].numpy() != IGNORE_INDEX, batch["mlm_labels"].numpy(),
                        ids)
    assert (original[starts] == tok.cls_id).all() and starts.sum() == 8
    assert (ids[batch["attention_mask"].numpy() == 0] == tok.pad_id).all()
