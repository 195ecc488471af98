"""The Python API: ``bertforge.pipeline(task, model)`` with transformers' task names, calling a
pipeline on strings, dicts, keywords and lists, its input errors (field and item index), the
parsed-request path the server and ``predict`` keep using, QA answers widened to whole words
(and evaluation's answers not), and the lazy top-level exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import bertforge
from bertforge.data.finetuning.squad import QAExample, postprocess_qa, qa_features
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import InputError, load_pipeline
from bertforge.models import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                              BertForSequenceClassification, BertForTokenClassification)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the note was written by ada in who wrote it paris is a city".split()
SHAPE = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=128)
QUESTION, CONTEXT = "Who wrote it?", "The note was written by Ada in 1843."


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random BERTs for QA, classification, tagging and fill-mask; "1843" is not a
    vocabulary word, so it is four pieces: 1 ##8 ##4 ##3."""
    root = tmp_path_factory.mktemp("python-api")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *WORDS, *CHARS,
                                            *[f"##{c}" for c in CHARS]])))
    base = BertConfig(vocab_size=tok.vocab_size, **SHAPE)
    torch.manual_seed(0)
    built = {
        "qa": BertForQuestionAnswering(base.replace(finetuning_task="squad")),
        "cls": BertForSequenceClassification(base.replace(
            num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"}, finetuning_task="sst2")),
        "tag": BertForTokenClassification(base.replace(
            num_labels=3, id2label={0: "O", 1: "B-PER", 2: "I-PER"},
            finetuning_task="token-classification")),
        "mlm": BertForMaskedLM(base),
    }
    return {name: model.save_pretrained(root / name, tokenizer=tok)
            for name, model in built.items()}


def rounded(result):
    """``result`` with its floats rounded: a batch pads, which moves the last digits."""
    return json.loads(json.dumps(result), parse_float=lambda x: round(float(x), 5))


# --- pipeline(task, model) and the input forms -----------------------------------------------


def test_qa_takes_a_dict_keywords_and_a_list(models):
    qa = bertforge.pipeline("question-answering", models["qa"])
    item = {"question": QUESTION, "context": CONTEXT}
    one = qa(item)
    assert set(one) == {"answer", "score", "start", "end"}
    assert CONTEXT[one["start"]:one["end"]] == one["answer"] != ""
    assert qa(question=QUESTION, context=CONTEXT) == one
    many = qa([item, {"question": "What is Paris?", "context": "Paris is a city."}])
    assert isinstance(many, list) and len(many) == 2 and many[0] == one
    assert qa([]) == []


@pytest.mark.parametrize("task", ["text-classification", "sentiment-analysis", "classify", None])
def test_transformers_task_names_and_aliases_choose_the_pipeline(models, task):
    clf = bertforge.pipeline(task, models["cls"], device=-1)
    assert clf.task == "text-classification" and clf.device.type == "cpu"
    result = clf("paris is a city")
    assert result["label"] in ("NEGATIVE", "POSITIVE") and 0.5 <= result["score"] <= 1.0
    both = clf(["paris is a city", {"text": "a city", "text_pair": "paris"}])
    assert rounded(both[0]) == rounded(result)
    assert rounded(both[1]) == rounded(clf(text="a city", text_pair="paris"))


def test_ner_and_fill_mask_take_strings_and_per_call_fields(models):
    ner = bertforge.pipeline("ner", models["tag"])
    assert ner.task == "token-classification"
    tagged = ner("ada wrote it in paris")
    assert set(tagged) == {"entities"}
    assert rounded(ner(["ada", "paris"])[1]) == rounded(ner("paris"))
    fill = bertforge.pipeline("fill-mask", models["mlm"], top_k=2)
    assert [len(m) for m in fill("the [MASK] was written")["masks"]] == [2]
    assert [len(m) for m in fill("the [MASK] was [MASK]", top_k=3)["masks"]] == [3, 3]
    assert [len(r["masks"][0]) for r in fill(["[MASK] city", "a [MASK]"], top_k=1)] == [1, 1]


def test_summarization_takes_a_string_and_generation_fields(tiny_bart):
    summarize = bertforge.pipeline("summarization", tiny_bart, device="cpu")
    one = summarize("the first text of the corpus", num_beams=2)
    assert set(one) == {"summary"} and isinstance(one["summary"], str)
    assert summarize(["the first text of the corpus"], num_beams=2) == [one]


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, field, words", [
    (lambda qa: qa("who wrote it?"), "", "expected a dict with fields question, context, got str"),
    (lambda qa: qa(5), "", "expected a string, a dict of fields or a list of them, got int"),
    (lambda qa: qa([{"question": QUESTION, "context": CONTEXT}, {"question": QUESTION}]),
     "inputs[1].context", "is required"),
    (lambda qa: qa([{"question": QUESTION, "context": CONTEXT}, 7]), "inputs[1]",
     "expected a dict with fields question, context, got int"),
    (lambda qa: qa(question=QUESTION, context=CONTEXT, answer="x"), "answer",
     "is not a field of this request"),
    (lambda qa: qa(question=QUESTION), "context", "is required"),
    (lambda qa: qa(), "question", "is required"),
])
def test_bad_input_names_the_field_and_the_item(models, call, field, words):
    qa = bertforge.pipeline("question-answering", models["qa"])
    with pytest.raises(InputError) as caught:
        call(qa)
    assert caught.value.field == field and words in caught.value.message
    assert isinstance(caught.value, ValueError)


def test_a_text_pipeline_names_the_bad_item_of_a_list(models):
    clf = bertforge.pipeline("sentiment-analysis", models["cls"])
    with pytest.raises(InputError, match=r"^inputs\[2\]\.text: must not be empty"):
        clf(["a city", "paris", "  "])
    with pytest.raises(InputError, match=r"^inputs\[1\]: expected a string or a dict"):
        clf(["a city", 3.5])


@pytest.mark.parametrize("kwargs, words", [
    (dict(task="question-answering"), "pipeline() needs model=: a model directory"),
    (dict(task="translation", model="MODEL"), "translation"),
    (dict(task="question-answering", model="MODEL", device=True), "device must be a name"),
    (dict(task="fill-mask", model="MODEL", align_to_words=False),
     "option align_to_words does not apply to fill-mask"),
    (dict(task="question-answering", model="QA", align_to_words="no"),
     "align_to_words must be True or False, got str 'no'"),
])
def test_pipeline_mistakes_are_config_errors(models, kwargs, words):
    if kwargs.get("model") in ("MODEL", "QA"):
        kwargs["model"] = models["mlm" if kwargs["model"] == "MODEL" else "qa"]
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        bertforge.pipeline(**kwargs)


def test_a_path_given_as_the_task_is_pointed_at_model(models):
    with pytest.raises(ConfigError, match="pass it as model="):
        bertforge.pipeline(str(models["qa"]))


def test_parsed_requests_still_run_as_one_batch(models):
    """The server's and predict's path: parse each item, then call with the parsed list."""
    qa = load_pipeline(models["qa"])
    items = [{"question": QUESTION, "context": CONTEXT}, {"question": "who?", "context": "ada"}]
    assert qa([qa.parse(it) for it in items]) == qa(items) == qa.run([qa.parse(it)
                                                                      for it in items])


# --- QA answers are whole words ------------------------------------------------------------------


class Pointer:
    """A QA "model" whose best span starts at token ``start`` and ends at token ``end`` (by
    vocabulary entry), so a span that cuts a word can be forced."""

    def __init__(self, tok: BertTokenizer, start: str, end: str) -> None:
        self.start_id, self.end_id = tok.vocab.index(start), tok.vocab.index(end)

    def __call__(self, input_ids, attention_mask, token_type_ids) -> SimpleNamespace:
        logit = lambda token: (input_ids == token).float() * 10.0  # noqa: E731  (B, S)
        return SimpleNamespace(start_logits=logit(self.start_id), end_logits=logit(self.end_id))


@pytest.mark.parametrize("start, end, cut, whole", [
    ("written", "1", "written by Ada in 1", "written by Ada in 1843"),
    ("##4", "##3", "43", "1843"),
    ("ada", "in", "Ada in", "Ada in"),
])
def test_qa_answers_are_widened_to_whole_words_but_evaluation_is_not(models, start, end, cut,
                                                                     whole):
    aligned = load_pipeline(models["qa"])
    raw = load_pipeline(models["qa"], align_to_words=False)
    aligned.model = raw.model = Pointer(aligned.tokenizer, start, end)
    got, plain = aligned(question=QUESTION, context=CONTEXT), raw(question=QUESTION,
                                                                  context=CONTEXT)
    assert (plain["answer"], got["answer"]) == (cut, whole)
    assert CONTEXT[got["start"]:got["end"]] == whole and got["score"] == plain["score"]
    # Evaluation (SQuAD metrics) reads postprocess_qa's predictions: the span as the model gave it.
    example = QAExample(id="0", question=QUESTION, context=CONTEXT, answers=[])
    feats = qa_features([example], aligned.tokenizer, max_seq_length=aligned.max_length,
                        doc_stride=aligned.doc_stride, max_query_length=64, training=False)
    out = aligned.model(*(torch.from_numpy(getattr(feats, k)) for k in
                          ("input_ids", "attention_mask", "token_type_ids")))
    preds = postprocess_qa([example], feats, out.start_logits.numpy(), out.end_logits.numpy(),
                           version_2=False)
    assert preds.predictions["0"] == cut


# --- the top-level exports -----------------------------------------------------------------------


def test_the_top_level_exports_resolve_and_import_bertforge_stays_cheap():
    for name in ("pipeline", "load_pipeline", "load_tokenizer", "BertTokenizer", "BpeTokenizer",
                 "BertForQuestionAnswering", "BartForConditionalGeneration", "GenerationConfig",
                 "generate", "finetune", "pretrain", "FinetuneConfig", "load_config"):
        assert name in bertforge.__all__ and getattr(bertforge, name) is not None
    assert bertforge.load_pipeline is load_pipeline
    code = "import sys, bertforge; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
