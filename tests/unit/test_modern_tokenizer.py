"""ModernBpeTokenizer: a Hugging Face ModernBERT directory (built offline with the published
structure) and one trained by `bertforge vocab --type modernbert` load, encode as transformers
does, give fine-tuning windows, save back unchanged; BART's BPE still loads as BpeTokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from bertforge.cli import main
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization import (BpeTokenizer, EncoderTokenizer, ModernBpeTokenizer,
                                    load_tokenizer, read_vocab_tokens)
from bertforge.tokenization.training import train_bpe, train_modern_bpe

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"
# The published order at the end of the vocabulary: ModernBERT-base has them at 50280..50284.
PUBLISHED_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
TEXTS = ["Hello world, this is a test.", "  two  spaces and a tab\there", "café naïve",
         "cafe\u0301 (combining accent: NFC makes it one character)", "a [MASK] b",
         "numbers 12345 and symbols #$%"]
PAIRS = [("Who wrote it?", "It was written by the first team in 1999."),
         ("short", "a much longer second text that goes on and on for a while")]


def _published_json() -> str:
    """A small tokenizer.json shaped as the published ModernBERT one: NFC, ByteLevel without a
    prefix space, BPE without unk, added tokens after the vocabulary (an <|endoftext|> then the
    five specials, [MASK] eating the space before it), BERT's template."""
    tok = Tokenizer(BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = BpeTrainer(vocab_size=500, special_tokens=["<|padding|>"], show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                            for t in PUBLISHED_SPECIALS])
    ids = tok.get_vocab()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    return tok.to_str(pretty=True)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("modernbert-published")
    (root / "tokenizer.json").write_text(_published_json(), encoding="utf-8")
    names = {"cls_token": "[CLS]", "mask_token": {"content": "[MASK]", "lstrip": True,
                                                  "normalized": False, "rstrip": False,
                                                  "single_word": False},
             "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]"}
    config = {"clean_up_tokenization_spaces": True, "model_input_names": ["input_ids",
                                                                          "attention_mask"],
              "model_max_length": 8192, "tokenizer_class": "PreTrainedTokenizerFast", **names}
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (root / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n")
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("modernbert-trained") / "tok"
    train_modern_bpe([CORPUS], 600, out, progress=False)
    return out


@pytest.fixture(scope="module", params=["published", "trained"])
def directory(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def test_published_directory_loads_with_its_special_ids(published: Path) -> None:
    tok = load_tokenizer(published)
    assert type(tok) is ModernBpeTokenizer and isinstance(tok, EncoderTokenizer)
    n = tok.vocab_size - 5  # the five specials are the last ids, as published
    assert (tok.unk_id, tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == tuple(range(n, n + 5))
    assert tok.vocab[tok.mask_id] == "[MASK]" and tok.model_max_length == 8192
    assert tok.model_input_names == ("input_ids", "attention_mask") and not tok.do_lower_case
    assert type(load_tokenizer(published / "tokenizer.json")) is ModernBpeTokenizer
    assert read_vocab_tokens(published) == list(tok.vocab)


def test_trained_special_ids_come_first(trained: Path) -> None:
    tok = load_tokenizer(trained)
    assert type(tok) is ModernBpeTokenizer and tok.vocab_size == 600
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    data = json.loads((trained / "tokenizer.json").read_text())
    assert data["normalizer"]["type"] == "NFC" and data["post_processor"]["type"] == (
        "TemplateProcessing")
    assert data["pre_tokenizer"] == {**data["pre_tokenizer"], "type": "ByteLevel",
                                     "add_prefix_space": False}


def test_ids_match_transformers(directory: Path) -> None:
    tok = load_tokenizer(directory)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        assert tok.encode(text) == fast(text)["input_ids"] == auto(text)["input_ids"], text
        assert tok.tokenize(text) == auto.tokenize(text)
    for a, b in PAIRS:
        assert tok.encode(a, b) == auto(a, b)["input_ids"]
    assert "token_type_ids" not in auto("x") and set(tok("x")) == {"input_ids", "attention_mask"}
    for name in ("cls", "sep", "pad", "mask", "unk"):
        assert getattr(auto, f"{name}_token_id") == getattr(tok, f"{name}_id"), name
    assert tok.decode(tok.encode(TEXTS[0])) == TEXTS[0]


def test_mask_eats_the_space_before_it(directory: Path) -> None:
    tok = load_tokenizer(directory)
    ids = tok.encode("a [MASK] b")
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and ids.count(tok.mask_id) == 1
    assert tok.convert_ids_to_tokens(ids[1:-1]) == ["a", "[MASK]", "Ġb"]


def test_windows_carry_offsets_sequence_and_word_ids(directory: Path) -> None:
    tok = load_tokenizer(directory)
    question, context = PAIRS[0]
    (w,) = tok.encode_windows([question], [context], max_length=64)
    assert w.ids[0] == tok.cls_id and w.ids.count(tok.sep_id) == 2 and w.ids[-1] == tok.sep_id
    first_sep = w.ids.index(tok.sep_id)
    assert w.sequence_ids == [None] + [0] * (first_sep - 1) + [None] + [1] * (
        len(w.ids) - first_sep - 2) + [None]
    # Every token's span spells the token (byte-level "Ġ" is the space the span includes).
    for tid, (a, b), seq in zip(w.ids, w.offsets, w.sequence_ids):
        if seq is not None:
            text = question if seq == 0 else context
            assert tok.decode([tid]) == text[a:b]
    words = [wid for wid, seq in zip(w.word_ids, w.sequence_ids) if seq == 1]
    assert words[0] == 0 and words[-1] == len(context.split()) and words == sorted(words)
    pad = tok.pad_windows([w], 80)
    assert pad["input_ids"][0, len(w.ids):].tolist() == [tok.pad_id] * (80 - len(w.ids))
    assert pad["attention_mask"].sum() == len(w.ids)


def test_windows_overflow_keeps_the_question(directory: Path) -> None:
    tok = load_tokenizer(directory)
    question, context = PAIRS[1]
    windows = tok.encode_windows([question], [context], max_length=12, stride=2,
                                 truncation="only_second", overflow=True)
    assert len(windows) > 1 and all(len(w.ids) <= 12 for w in windows)
    q = tok.encode(question)[1:-1]
    for w in windows:
        assert w.ids[: len(q) + 2] == [tok.cls_id, *q, tok.sep_id] and w.ids[-1] == tok.sep_id
    cut = tok.truncate_text(context, 3)
    assert len(cut) < len(context) and tok.encode_batch([cut])[0] == tok.encode_batch(
        [context])[0][:3]


def test_word_starts_and_continuations(directory: Path) -> None:
    tok = load_tokenizer(directory)
    starts = tok.is_word_start
    assert starts.shape == (tok.vocab_size,) and (tok.is_continuation == ~starts).all()
    for i, token in enumerate(tok.vocab):
        special = token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<|endoftext|>",
                            "<|padding|>")
        assert starts[i] == (token.startswith("Ġ") or special), token
    assert starts.any() and (~starts).any()


def test_save_writes_the_loaded_files_back_unchanged(published: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(published)
    tok.save(tmp_path / "copy")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "copy" / name).read_bytes() == (published / name).read_bytes(), name
    again = load_tokenizer(tmp_path / "copy")
    assert again.vocab_hash == tok.vocab_hash and again.encode(TEXTS[0]) == tok.encode(TEXTS[0])
    # A bare tokenizer.json gets configs that transformers reads with the same special ids.
    ModernBpeTokenizer.from_file(published / "tokenizer.json").save(tmp_path / "bare")
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "bare")
    assert (auto.mask_token_id, auto.pad_token_id) == (tok.mask_id, tok.pad_id)
    assert (tmp_path / "bare" / "tokenizer.json").read_bytes() == (
        published / "tokenizer.json").read_bytes()


def test_vocab_hash_covers_merges(published: Path, tmp_path: Path) -> None:
    data = json.loads((published / "tokenizer.json").read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    fewer = ModernBpeTokenizer.from_file(tmp_path / "tokenizer.json")
    assert fewer.vocab_hash != load_tokenizer(published).vocab_hash


def test_bart_bpe_still_loads_as_bart(tmp_path: Path) -> None:
    train_bpe([CORPUS], 400, tmp_path / "bart", progress=False)
    tok = load_tokenizer(tmp_path / "bart")
    assert type(tok) is BpeTokenizer and tok.mask_id == 4
    assert type(load_tokenizer(tmp_path / "bart" / "tokenizer.json")) is BpeTokenizer


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(post_processor=None), "post-processor does not make '[CLS] A [SEP]'"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "not GPT-2's ByteLevel"),
    (lambda d: d["model"].update(continuing_subword_prefix="##"), "prefix or suffix"),
    (lambda d: d["added_tokens"].pop(), "[MASK] missing"),
])
def test_unusable_files_are_refused(published: Path, tmp_path: Path, change, message) -> None:
    data = json.loads((published / "tokenizer.json").read_text())
    if message.endswith("missing"):  # [MASK] gone from the vocabulary altogether
        mask = data["added_tokens"][-1]
        assert mask["content"] == "[MASK]"
        data["model"]["vocab"].pop("[MASK]", None)
    change(data)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ModernBpeTokenizer.from_file(path)


def test_vocab_command_trains_a_modernbert_tokenizer(tmp_path: Path, trained: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "tok"
    assert main(["vocab", "--input", str(CORPUS), "--output", str(out), "--type", "modernbert",
                 "--vocab-size", "600"]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (trained / name).read_bytes(), name  # deterministic
    assert (out / "vocab-config.yaml").is_file() and not (out / "vocab.json").exists()
    assert main(["vocab", "--input", str(CORPUS), "--output", str(tmp_path / "x"), "--type",
                 "modernbert", "--cased"]) != 0
    assert "--cased applies to WordPiece only" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="too small"):
        train_modern_bpe([CORPUS], 200, tmp_path / "small", progress=False)


def test_joiner_spells_later_sentences_as_running_text(trained: Path) -> None:
    tok = load_tokenizer(trained)
    running = tok.encode_batch(["It ran. The cat sat."])[0]
    pieces = tok.encode_batch(["It ran.", tok.sentence_joiner + "The cat sat."])
    assert pieces[0] + pieces[1] == running
    assert tok.encode_batch(["The cat sat."])[0] != pieces[1]  # without it: another spelling


def test_stored_truncation_is_not_applied(published: Path, tmp_path: Path) -> None:
    data = json.loads((published / "tokenizer.json").read_text())
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst",
                          "stride": 0}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tok = ModernBpeTokenizer.from_file(tmp_path / "tokenizer.json")
    assert len(tok.encode(TEXTS[0])) > 4
    assert tok.encode(TEXTS[0]) == load_tokenizer(published).encode(TEXTS[0])


def test_a_long_qa_context_tokenized_in_pieces_is_tokenized_as_one(trained: Path,
                                                                   monkeypatch) -> None:
    """QA cuts contexts over a piece size before a space: byte-level BPE spells a word after a
    space ("Ġword") otherwise than at the start of a text, so a cut after the space changed
    the tokens."""
    from bertforge.data.finetuning import qa
    from bertforge.tokenization import load_tokenizer

    tok = load_tokenizer(trained)
    text = CORPUS.read_text(encoding="utf-8")[:3000].replace("\n", " ")
    monkeypatch.setattr(qa, "PIECE_CHARS", 97)
    whole = tok.backend.encode(text, add_special_tokens=False)
    (got,) = qa._tokenize([text], tok)
    assert got.ids.tolist() == whole.ids
    assert [tuple(o) for o in got.spans.tolist()] == whole.offsets
