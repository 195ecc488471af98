"""The Python API against careless callers: every public entry point of ``bertforge`` checks
the types of its arguments before any work and raises a TypeError naming the function, the
argument, what it takes and what it got (never an error from inside difflib, pathlib or
OmegaConf); a pipeline call refuses one field given twice (a positional input and a keyword, a
dict's key and a keyword, ``inputs=`` and a positional) and unknown keywords, naming both; and
token classification tags each word on its first sub-token as the tokenizer's word ids say,
also for words that give no token at all (a lone combining accent, a variation selector)."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import bertforge
from bertforge.inference.pipelines import InputError
from bertforge.models import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                              BertForTokenClassification, BertModel)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "ada lived in paris and london the city".split()
TAGS = {0: "O", 1: "B-LOC", 2: "I-LOC", 3: "B-PER"}


def _tokenizer() -> BertTokenizer:
    return BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *WORDS, *CHARS,
                                             *[f"##{c}" for c in CHARS]])))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("python_api_faults")
    tok = _tokenizer()
    base = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    tagger = BertForTokenClassification(base.replace(num_labels=4, id2label=TAGS,
                                                     finetuning_task="token-classification"))
    reader = BertForQuestionAnswering(base.replace(finetuning_task="squad"))
    return {"enc": BertModel(base).save_pretrained(root / "enc", tokenizer=tok),
            "tag": tagger.save_pretrained(root / "tag", tokenizer=tok),
            "qa": reader.save_pretrained(root / "qa", tokenizer=tok),
            "mlm": BertForMaskedLM(base).save_pretrained(root / "mlm", tokenizer=tok)}


# --------------------------------------------------------------- argument types

def _calls(model: str) -> list[tuple[str, Callable[[], Any], str, str]]:
    """(what, call, argument, expected words) of calls with one argument of a wrong type."""
    b = bertforge
    return [
        ("pipeline task", lambda: b.pipeline(5, model), "task", "int"),
        ("pipeline model", lambda: b.pipeline("embed", 5), "model", "int"),
        ("pipeline max_length str", lambda: b.pipeline("embed", model, max_length="7"),
         "max_length", "str"),
        ("pipeline max_length bool", lambda: b.pipeline("embed", model, max_length=True),
         "max_length", "bool"),
        ("pipeline precision", lambda: b.pipeline("embed", model, precision=16), "precision",
         "int"),
        ("pipeline truncation", lambda: b.pipeline("embed", model, truncation=False),
         "truncation", "bool"),
        ("pipeline option", lambda: b.pipeline("embed", model, normalize="yes"), "normalize",
         "str"),
        ("pipeline option pooling", lambda: b.pipeline("embed", model, pooling=1), "pooling",
         "int"),
        ("load_pipeline model", lambda: b.load_pipeline(5), "model_dir", "int"),
        ("load_pipeline task", lambda: b.load_pipeline(model, task=["embed"]), "task", "list"),
        ("load_tokenizer", lambda: b.load_tokenizer(5), "", "int"),
        ("load_config path", lambda: b.load_config(b.FinetuneConfig, 5), "path", "int"),
        ("load_config overrides", lambda: b.load_config(b.FinetuneConfig, None, "--a=1"),
         "overrides", "str"),
        ("load_config class", lambda: b.load_config(5), "cls", "int"),
        ("finetune", lambda: b.finetune({"task": "squad"}), "cfg", "dict"),
        ("pretrain", lambda: b.pretrain(5), "cfg", "int"),
        ("from_pretrained", lambda: b.BertModel.from_pretrained(5), "path", "int"),
        ("from_preset", lambda: b.BertConfig.from_preset(5), "name", "int"),
        ("tokenizer from_pretrained", lambda: b.BertTokenizer.from_pretrained(5), "directory",
         "int"),
        ("convert", lambda: b.convert_nvidia_checkpoint(5, "bert-base", "out"), "checkpoint",
         "int"),
        ("generate", lambda: b.generate("model", torch.ones(1, 3, dtype=torch.long), None),
         "model", "str"),
        ("model class", lambda: b.BertModel(5), "config", "int"),
        ("head class", lambda: b.BertForTokenClassification(b.BertConfig(), num_labels="3"),
         "num_labels", "str"),
        ("tokenizer class", lambda: b.BertTokenizer("abc"), "vocab_tokens", "str"),
        ("tokenizer call", lambda: b.load_tokenizer(model)("a", max_length="7"), "max_length",
         "str"),
        # numpy's True is no length either, and a float that happens to be whole no count
        ("tokenizer call numpy bool", lambda: b.load_tokenizer(model)("a", max_length=np.True_),
         "max_length", "bool"),
        ("tokenizer call numpy float", lambda: b.load_tokenizer(model)(
            "a", max_length=np.float64(8.0)), "max_length", "float64"),
        ("pipeline numpy bool length", lambda: b.pipeline("embed", model,
                                                          max_length=np.False_),
         "max_length", "bool"),
        ("pipeline numpy number for a bool", lambda: b.pipeline("embed", model,
                                                                normalize=np.int64(1)),
         "normalize", "int64"),
    ]


CASES = [c[0] for c in _calls("MODEL")]


@pytest.mark.parametrize("name", CASES)
def test_every_public_entry_point_checks_its_argument_types_first(models, name: str) -> None:
    _, call, argument, got = next(c for c in _calls(str(models["enc"])) if c[0] == name)
    with pytest.raises(TypeError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and f"got {got}" in message, message
    assert argument in message, message
    # Raised by the check itself, not from deep inside the work.
    last = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert "bertforge" in last.filename and "difflib" not in last.filename, last
    for inside in ("pathlib", "omegaconf", "difflib"):
        assert inside not in "".join(traceback.format_tb(caught.value.__traceback__)), message


def test_right_types_still_work(models) -> None:
    path = models["enc"]
    emb = bertforge.pipeline("embed", path, max_length=16, precision="fp32",
                             truncation="truncate", normalize=True, device=-1)
    assert emb.max_length == 16 and emb.normalize is True
    assert bertforge.pipeline("embed", str(path)).task == "feature-extraction"
    assert bertforge.load_tokenizer(str(path)).vocab_size == _tokenizer().vocab_size
    assert bertforge.BertModel.from_pretrained(str(path)).config.hidden_size == 32


def test_numpy_scalars_are_taken_where_the_plain_type_is(models) -> None:
    """Numbers read from arrays (``np.int64``, ``np.float32``, ``np.bool_``) are what a caller
    often has in hand; every argument taking an int, float or bool takes them as well."""
    tok = bertforge.load_tokenizer(models["enc"])
    text = "ada lived in paris and london"
    assert tok(text, max_length=np.int64(5), truncation=True) == tok(text, max_length=5,
                                                                      truncation=True)
    assert tok(text, max_length=np.int32(12), padding="max_length", truncation=np.True_) == tok(
        text, max_length=12, padding="max_length", truncation=True)
    assert tok([text, "ada"], padding=np.True_) == tok([text, "ada"], padding=True)
    emb = bertforge.pipeline("embed", models["enc"], max_length=np.int64(16),
                             normalize=np.True_)
    plain = bertforge.pipeline("embed", models["enc"], max_length=16, normalize=True)
    assert emb.max_length == 16 and emb(text) == plain(text)
    qa = bertforge.pipeline("qa", models["qa"], max_length=np.int64(32),
                            max_query_length=np.uint8(8), doc_stride=np.int16(8),
                            null_score_diff_threshold=np.float32(0.5))
    question = {"question": "where did ada live", "context": text}
    assert qa(question) == bertforge.pipeline(
        "qa", models["qa"], max_length=32, max_query_length=8, doc_stride=8,
        null_score_diff_threshold=float(np.float32(0.5)))(question)
    # the fields of one input too: a flag, a count
    assert emb(text, normalize=np.False_) == plain(text, normalize=False)
    fill = bertforge.pipeline("fill-mask", models["mlm"])
    assert fill("ada [MASK] in paris", top_k=np.int64(2)) == fill("ada [MASK] in paris", top_k=2)
    with pytest.raises(InputError, match="top_k"):
        fill("ada [MASK] in paris", top_k=np.float64(2.0))  # a count is a whole number


def test_a_call_is_named_as_a_call_and_a_constructor_as_its_class(models) -> None:
    tok = bertforge.load_tokenizer(models["enc"])
    with pytest.raises(TypeError) as caught:
        tok("a", max_length="7")
    assert str(caught.value).startswith("BertTokenizer.__call__(): max_length "), caught.value
    with pytest.raises(TypeError) as caught:
        BertTokenizer("abc")
    assert str(caught.value).startswith("BertTokenizer(): vocab_tokens "), caught.value
    with pytest.raises(TypeError) as caught:
        BertModel(5)
    assert str(caught.value).startswith("BertModel(): config "), caught.value


# --------------------------------------------------------------- one field given twice

@pytest.mark.parametrize("call, field, both", [
    (lambda p: p(["a"], text="b"), "inputs[0].text", ("'a'", "'b'")),
    (lambda p: p("a", text="b"), "text", ("'a'", "'b'")),
    (lambda p: p({"text": "a"}, text="b"), "text", ("'a'", "'b'")),
    (lambda p: p([{"text": "a", "normalize": True}], normalize=False), "inputs[0].normalize",
     ("True", "False")),
    (lambda p: p("a", inputs="b"), "inputs", ("'a'", "'b'")),
])
def test_one_field_given_twice_is_refused_naming_both(models, call, field: str,
                                                      both: tuple[str, str]) -> None:
    emb = bertforge.pipeline("embed", models["enc"])
    with pytest.raises(InputError) as caught:
        call(emb)
    assert caught.value.field == field, caught.value
    assert "twice" in caught.value.message and all(v in caught.value.message for v in both)


def test_inputs_as_a_keyword_and_keywords_for_every_item_still_work(models) -> None:
    emb = bertforge.pipeline("embed", models["enc"])
    one = emb("ada lived in paris")
    assert emb(inputs="ada lived in paris") == one  # transformers' keyword for the input
    assert emb(inputs=["ada lived in paris"]) == [one]
    both = emb(["ada", "paris"], normalize=True)  # a batch pads: the last digits move
    assert np.allclose(both[1]["embedding"], emb("paris", normalize=True)["embedding"],
                       atol=1e-6)


@pytest.mark.parametrize("keyword, says", [
    ("colour", "fields: text, normalize, truncate"),
    ("pooling", "pipeline()"),
])
def test_an_unknown_keyword_is_refused_once_naming_the_fields(models, keyword: str,
                                                             says: str) -> None:
    emb = bertforge.pipeline("embed", models["enc"])
    with pytest.raises(InputError) as caught:
        emb(["a", "b"], **{keyword: "x"})
    assert caught.value.field == keyword, caught.value  # the keyword, not inputs[0].keyword
    assert says in caught.value.message, caught.value


# --------------------------------------------------------------- tags by word ids

TRICKY = ["ada lived in paris", "ada\u200b lived  in\tparis", "l\xadondon and paris!",
          "ada (paris) , london...", "e\u0301cole in paris", "\u200b ada", "ada  \t  paris"]


def _first_sub_tokens(window: Any, text: str | None = None) -> dict[int, int]:
    """Word id -> its first token, from the tokenizer's word ids; with ``text``, tokens of
    white space only (byte-level BPE's lone "Ġ") are not a word's."""
    firsts: dict[int, int] = {}
    for t, word in enumerate(window.word_ids):
        blank = text is not None and not text[slice(*window.offsets[t])].strip()
        if word is not None and not blank:
            firsts.setdefault(word, t)
    return firsts


def _expected_entities(pipe: Any, model: Any, text: str) -> list[tuple]:
    window = pipe.tokenizer.encode_windows([text], max_length=64)[0]
    inputs = pipe.tokenizer.pad_windows([window], len(window.ids))
    with torch.no_grad():
        logits = model(**{k: torch.from_numpy(inputs[k])
                          for k in pipe.input_names}).logits[0]
    expected = []
    for word, first in _first_sub_tokens(window, text).items():
        tag = pipe.labels.name(int(logits[first].argmax()))
        last = max(t for t, w in enumerate(window.word_ids) if w == word)
        start, end = window.offsets[first][0], window.offsets[last][1]
        start += len(text[start:end]) - len(text[start:end].lstrip())
        if tag != "O":
            expected.append((text[start:end], tag, start, end))
    return expected


def test_the_tagging_pipeline_tags_each_word_on_its_first_sub_token(models) -> None:
    ner = bertforge.pipeline("ner", models["tag"])
    model = BertForTokenClassification.from_pretrained(models["tag"])
    for text in TRICKY:
        got = [(e["word"], e["tag"], e["start"], e["end"]) for e in ner(text)["entities"]]
        assert got == _expected_entities(ner, model, text), text


@pytest.fixture(scope="module")
def bpe_tagger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ModernBERT tagger with a byte-level BPE trained on the test corpus; every tag
    non-O, so every word is an entity."""
    from bertforge.models import ModernBertConfig, ModernBertForTokenClassification
    from bertforge.tokenization import load_tokenizer
    from bertforge.tokenization.training import train_modern_bpe

    root = tmp_path_factory.mktemp("bpe_tagger")
    corpus = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
    train_modern_bpe([corpus], 400, root / "tok", progress=False)
    tok = load_tokenizer(root / "tok")
    config = ModernBertConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=2, num_attention_heads=2,
                              max_position_embeddings=64, pad_token_id=tok.pad_id,
                              cls_token_id=tok.cls_id, sep_token_id=tok.sep_id,
                              bos_token_id=tok.cls_id, eos_token_id=tok.sep_id, num_labels=4,
                              id2label=TAGS, finetuning_task="token-classification")
    torch.manual_seed(0)
    model = ModernBertForTokenClassification(config)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([-5.0, 5.0, 0.0, 0.0]))
    return model.save_pretrained(root / "model", tokenizer=tok)


def test_byte_level_words_start_at_their_letters_not_at_a_space(bpe_tagger: Path) -> None:
    """Byte-level BPE counts the space before a word with it, and after two spaces makes a
    lone "Ġ" of the second: an entity is the word's characters, tagged on its first real
    sub-token, and a run of spaces is no word."""
    from bertforge.models import ModernBertForTokenClassification

    ner = bertforge.pipeline("ner", bpe_tagger, device="cpu")
    model = ModernBertForTokenClassification.from_pretrained(bpe_tagger)
    for text in ["The cat sat  on the   mat.", "a  b", "  leading and trailing  "]:
        entities = ner(text)["entities"]
        got = [(e["word"], e["tag"], e["start"], e["end"]) for e in entities]
        assert got == _expected_entities(ner, model, text), text
        assert entities and all(e["word"] == e["word"].strip() != "" for e in entities), got


def _tagging_data(path: Path) -> list[dict]:
    # A lone combining accent and a variation selector are visible to the reader but give no
    # token (the uncased tokenizer strips accents and marks).
    rows = [{"id": "s1", "tokens": ["ada", "\u0301", "lived", "in", "paris"],
             "tags": ["B-PER", "O", "O", "O", "B-LOC"]},
            {"id": "s2", "tokens": ["\ufe0f", "london", "and", "paris", "city"],
             "tags": ["O", "B-LOC", "O", "B-LOC", "I-LOC"]},
            {"id": "s3", "tokens": ["paris", "\u0300\u0301", "london"],
             "tags": ["B-LOC", "I-LOC", "B-LOC"]},
            {"id": "s4", "tokens": ["london", "city", "\ufe0f"], "tags": ["B-LOC", "I-LOC", "O"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def test_fine_tuning_tags_and_predicts_words_by_their_word_ids(models, tmp_path: Path) -> None:
    """A word the tokenizer drops (it gives no token) keeps its own tag: the next word is
    trained on its own tag, not the dropped one's, and every word is predicted from its own
    first sub-token (a dropped word: "O")."""
    from bertforge.config import FinetuneConfig, load_config
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    data = tmp_path / "tags.jsonl"
    rows = _tagging_data(data)
    cfg = load_config(FinetuneConfig, None, [
        "--task=token-classification", f"--model={models['tag']}",
        f"--output_dir={tmp_path / 'out'}", f"--data.train={data}", f"--data.validation={data}",
        "--data.max_seq_length=32", "--precision=fp32", "--tensorboard=false"])
    task = build_task(cfg, init_distributed())
    tok, names = task.tokenizer, task.labels
    windows = tok.encode_windows([r["tokens"] for r in rows], max_length=32,
                                 is_pretokenized=True)
    labels = task.features.train.features.arrays["labels"]  # (N, S), -100: not trained on
    for row, window, got in zip(rows, windows, labels):
        firsts = _first_sub_tokens(window)
        want = np.full(len(got), -100)
        for word, first in firsts.items():
            want[first] = names.id(row["tags"][word], row["id"])
        assert got[:len(want)].tolist() == want.tolist(), row["id"]
    # Predicted tags: position t of every row holds tag t % 4, so word k's tag says which
    # position it was read from.
    width = task.max_seq_length
    outputs = {"tags": np.tile(np.arange(width) % len(TAGS), (len(rows), 1))}
    predicted = task.predicted_tags(outputs)
    for row, window, tags in zip(rows, windows, predicted):
        firsts = _first_sub_tokens(window)
        want = [names.name(firsts[k] % len(TAGS)) if k in firsts else "O"
                for k in range(len(row["tokens"]))]
        assert tags == want, row["id"]
