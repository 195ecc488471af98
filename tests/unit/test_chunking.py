"""``truncation="chunk"`` on tiny random-weight BERTs: a text that fits answers bit-identically to
"truncate" and "error"; a long text's vector is the mean of its windows' pooled vectors and a
classifier's scores come from the mean or maximum of its windows' logits, both against windows
cut and run one by one here by the documented rule; windows of a call share forward passes of
bounded size; every error path (bad options, tasks that do not chunk, a pair that leaves no
room); ``bertforge predict --truncation chunk`` and the server's routes."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.inference.pipelines import InputError, load_pipeline
from bertforge.inference.pipelines.chunking import window_starts
from bertforge.models import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                              BertForSequenceClassification, BertForTokenClassification,
                              BertModel)
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the capital of france is paris where eiffel tower in city river seine".split()
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=128)
LONG = ("the eiffel tower is in paris, the capital of france. the seine river runs through "
        "the city. ")
WINDOW = 16  # max_length of the chunking pipelines: LONG is 25 tokens, several windows


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny BERTs sharing a vocabulary without [UNK]s: an encoder, a 3-label classifier and
    the heads of tasks that do not chunk."""
    root = tmp_path_factory.mktemp("chunking")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *WORDS])))
    base = BertConfig(vocab_size=tok.vocab_size, **SHAPE)
    torch.manual_seed(0)
    built = {
        "enc": BertModel(base),
        "cls": BertForSequenceClassification(base.replace(
            num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, finetuning_task="glue/mnli")),
        "qa": BertForQuestionAnswering(base.replace(finetuning_task="squad")),
        "mlm": BertForMaskedLM(base),
        "tag": BertForTokenClassification(base.replace(
            num_labels=2, id2label={0: "O", 1: "LOC"}, finetuning_task="token-classification")),
        "rank": BertForSequenceClassification(base.replace(num_labels=1,
                                                           finetuning_task="text-ranking")),
    }
    with torch.no_grad():  # logits far apart: windows then disagree, and pooling shows
        built["cls"].classifier.weight.mul_(1000.0)
    return {name: model.save_pretrained(root / name, tokenizer=tok)
            for name, model in built.items()}


def embedder(models, **options):
    return load_pipeline(models["enc"], "feature-extraction", precision="fp32",
                         max_length=WINDOW, **options)


def classifier(models, **options):
    return load_pipeline(models["cls"], precision="fp32", max_length=WINDOW, **options)


def by_hand(models, text: str, pair: str | None = None, overlap: int | None = None):
    """Model inputs of each window of ``text`` (and ``pair``) cut here by the documented rule:
    ``room`` tokens of the text, starting every ``room - overlap`` tokens (default overlap:
    room // 4), the last window ending at the text's end."""
    tok = BertTokenizer.from_pretrained(models["enc"])
    ids = tok.encode(text)[1:-1]
    pair_ids = tok.encode(pair)[1:-1] if pair is not None else []
    cls, sep = tok.cls_id, tok.sep_id
    room = WINDOW - 2 - (len(pair_ids) + 1 if pair is not None else 0)
    overlap = room // 4 if overlap is None else overlap
    starts, start = [], 0
    while start + room < len(ids):
        starts.append(start)
        start += room - overlap
    starts.append(len(ids) - room)
    windows = []
    for s in starts:
        first = [cls, *ids[s:s + room], sep]
        second = [*pair_ids, sep] if pair is not None else []
        windows.append((torch.tensor([first + second]),
                        torch.tensor([[0] * len(first) + [1] * len(second)])))
    return windows


# --- windows --------------------------------------------------------------------------------------


def test_window_starts_follow_the_stride_and_end_at_the_text_end():
    assert window_starts(10, 4, 1) == [0, 3, 6]
    assert window_starts(10, 4, 0) == [0, 4, 6]   # the last window ends at the end: overlaps 2
    assert window_starts(5, 4, 3) == [0, 1]
    assert window_starts(4, 4, 1) == [0]


def test_a_text_that_fits_answers_bit_identically_to_truncate_and_error(models):
    texts = ["paris is a city", "the seine river", "france"]
    for make in (embedder, classifier):
        results = {mode: make(models, truncation=mode)(texts) for mode in
                   ("error", "truncate", "chunk")}
        assert results["chunk"] == results["truncate"] == results["error"]
        assert all("chunks" not in r and "truncated" not in r for r in results["chunk"])
    one = embedder(models, truncation="chunk", normalize=True)("paris is a city")
    assert one == embedder(models, truncation="truncate", normalize=True)("paris is a city")


# --- embeddings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling, normalize, overlap", [
    ("mean", False, None), ("mean", True, 5), ("cls", True, 0)])
def test_a_long_texts_vector_is_the_mean_of_its_windows_vectors(models, pooling, normalize,
                                                                overlap):
    pipe = embedder(models, truncation="chunk", pooling=pooling, normalize=normalize,
                    chunk_overlap=overlap)
    result = pipe(LONG)
    encoder = BertModel.from_pretrained(models["enc"]).eval()
    vectors = []
    with torch.no_grad():
        for ids, types in by_hand(models, LONG, overlap=overlap):
            hidden = encoder(ids, token_type_ids=types).last_hidden_state[0]  # (S, H)
            vectors.append(hidden.mean(0) if pooling == "mean" else hidden[0])
    expected = torch.stack(vectors).mean(0)
    if normalize:
        expected = expected / expected.norm()
    assert result["chunks"] == len(vectors) > 1 and "truncated" not in result
    np.testing.assert_allclose(result["embedding"], expected.numpy(), atol=1e-5)
    cut = embedder(models, truncation="truncate", pooling=pooling, normalize=normalize)(LONG)
    assert not np.allclose(cut["embedding"], result["embedding"], atol=1e-3)


def test_windows_of_a_call_share_bounded_forward_passes_and_keep_the_order(models):
    pipe = embedder(models, truncation="chunk", max_windows=2)
    texts = [LONG, "paris", LONG + LONG, "the city"]
    requests = [pipe.parse({"text": t}) for t in texts]
    counts = [len(r.windows) or 1 for r in requests]
    assert counts[0] > 1 and counts[2] > counts[0] and counts[1] == counts[3] == 1
    assert pipe.cost(requests[0]) == WINDOW * counts[0]
    rows = []
    model = pipe.model

    def counting(**inputs):
        rows.append(int(inputs["input_ids"].shape[0]))
        return model(**inputs)

    pipe.model = counting
    batched = pipe(requests)
    per_pass = max(2, len(texts))  # max_windows, or the call's own texts when more
    assert sum(rows) == sum(counts) and max(rows) <= per_pass
    assert len(rows) == -(-sum(counts) // per_pass)  # full passes, not one text at a time
    pipe.model = model
    for text, result in zip(texts, batched):
        np.testing.assert_allclose(result["embedding"], pipe(text)["embedding"], atol=1e-5)
    assert [r.get("chunks", 1) for r in batched] == counts


def test_every_window_starts_with_the_prompt(models, tmp_path):
    import shutil

    directory = Path(shutil.copytree(models["enc"], tmp_path / "prompted"))
    (directory / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "the city "}}))
    pipe = load_pipeline(directory, "feature-extraction", precision="fp32", max_length=WINDOW,
                         truncation="chunk")
    request = pipe.parse({"text": LONG, "prompt_name": "query"})
    tok = BertTokenizer.from_pretrained(directory)
    prompt, text = tok.encode("the city")[1:-1], tok.encode(LONG)[1:-1]
    room = WINDOW - 2 - len(prompt)
    assert len(request.windows) > 1
    for w in request.windows:
        assert len(w.ids) == WINDOW and w.ids[1:1 + len(prompt)] == prompt
    bodies = [w.ids[1 + len(prompt):-1] for w in request.windows]
    step = room - room // 4
    assert bodies[:-1] == [text[s:s + room] for s in range(0, len(text) - room, step)]
    assert bodies[-1] == text[-room:]


def test_bart_embeddings_chunk_between_its_own_special_tokens(tiny_bart):
    from bertforge.tokenization.bpe import BpeTokenizer

    pipe = load_pipeline(tiny_bart, "feature-extraction", precision="fp32", max_length=12,
                         truncation="chunk", chunk_overlap=2)
    text = "The quick brown fox jumps over the lazy dog. " * 2
    request = pipe.parse({"text": text})
    tok = BpeTokenizer.from_pretrained(tiny_bart)
    ids = tok.encode(text)[1:-1]
    starts = [*range(0, len(ids) - 10, 8), len(ids) - 10]
    assert [w.ids for w in request.windows] == [[tok.bos_id, *ids[s:s + 10], tok.eos_id]
                                                for s in starts]
    alone = torch.stack([pipe.pooled([w])[0] for w in request.windows]).mean(0)
    np.testing.assert_allclose(pipe([request])[0]["embedding"], alone.numpy(), atol=1e-5)


def test_an_items_truncate_still_cuts_and_its_false_still_chunks(models):
    pipe = embedder(models, truncation="chunk")
    cut = pipe({"text": LONG, "truncate": True})
    assert cut["truncated"] is True and "chunks" not in cut
    assert cut == embedder(models, truncation="truncate")(LONG)
    assert pipe({"text": LONG, "truncate": False}) == pipe(LONG)
    assert pipe.truncation == "chunk"
    described = pipe.describe()
    assert described["truncation"] == "chunk" and described["chunk_overlap"] == (WINDOW - 2) // 4


# --- classification -------------------------------------------------------------------------------


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("pool", ["mean", "max"])
@pytest.mark.parametrize("pair", [None, "the city"])
def test_classification_pools_the_windows_logits(models, pool, pair):
    pipe = classifier(models, truncation="chunk", chunk_pool=pool)
    result = pipe({"text": LONG, "text_pair": pair} if pair else LONG)
    model = BertForSequenceClassification.from_pretrained(models["cls"]).eval()
    with torch.no_grad():
        logits = np.stack([model(ids, token_type_ids=types).logits[0].numpy()
                           for ids, types in by_hand(models, LONG, pair)])  # (windows, 3)
    assert np.ptp(logits, axis=0).max() > 0.01  # the windows disagree
    pooled = logits.mean(0) if pool == "mean" else logits.max(0)
    probs = _softmax(pooled.astype(np.float64))
    assert result["chunks"] == len(logits) > 1
    assert result["label"] == ["neg", "neu", "pos"][int(probs.argmax())]
    np.testing.assert_allclose(list(result["scores"].values()), probs, atol=1e-6)
    # The logits themselves, up to softmax's constant: finer than the scores show them.
    logs = np.log(list(result["scores"].values()))
    np.testing.assert_allclose(logs - logs.mean(), pooled - pooled.mean(), atol=2e-5)


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, task, options, words", [
    ("enc", "feature-extraction", {"chunk_overlap": WINDOW - 2},
     "chunk_overlap must be from 0 to 13"),
    ("cls", None, {"chunk_overlap": -1}, "chunk_overlap must be from 0 to 13"),
    ("cls", None, {"chunk_pool": "median"}, "chunk_pool must be mean or max"),
    ("cls", None, {"max_windows": 0}, "max_windows must be >= 1"),
    ("cls", None, {"truncation": "error", "chunk_pool": "max"},
     "option chunk_pool applies with truncation=chunk, not error"),
    ("qa", None, {}, ("truncation=chunk does not apply to question-answering \\(it splits long "
                      "contexts into windows of its own\\); it applies to text-classification, "
                      "feature-extraction")),
    ("mlm", None, {}, "truncation=chunk does not apply to fill-mask; it applies to"),
    ("tag", None, {}, "truncation=chunk does not apply to token-classification"),
    ("rank", None, {}, "truncation=chunk does not apply to text-ranking"),
    ("cls", None, {"truncation": "slice"}, ("truncation must be error or truncate, or chunk "
                                            "\\(text-classification, feature-extraction\\), "
                                            "got 'slice'")),
])
def test_settings_that_cannot_chunk_are_one_line_config_errors(models, name, task, options,
                                                               words):
    options = {"truncation": "chunk", "max_length": WINDOW, **options}
    with pytest.raises(ConfigError, match=words) as caught:
        load_pipeline(models[name], task, **options)
    assert "\n" not in str(caught.value)


def test_a_pair_that_leaves_no_room_names_the_pair(models):
    pipe = classifier(models, truncation="chunk")
    with pytest.raises(InputError) as caught:
        pipe.parse({"text": LONG, "text_pair": "the city " * 7})  # 14 tokens + 3 specials
    assert caught.value.field == "text_pair"
    assert "leaves no room for text within this model's limit of 16 tokens" in str(caught.value)
    assert "truncate=True" in str(caught.value)
    pipe = classifier(models, truncation="chunk", chunk_overlap=9)
    with pytest.raises(InputError, match="leaves 9 tokens for text in each window, no more than "
                       "the 9 that neighbouring windows share") as caught:
        pipe.parse({"text": LONG, "text_pair": "the city the city"})  # 4 tokens + 3 specials
    assert caught.value.field == "text_pair"


# --- command line and server ----------------------------------------------------------------------


def test_predict_takes_truncation_chunk(models, capsys, monkeypatch):
    from bertforge.cli import main

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code = main(["predict", "embed", "--model", str(models["enc"]), "--truncation", "chunk",
                 "--max-seq-length", str(WINDOW), "--precision", "fp32", "--json",
                 "--text", LONG, "--text", "paris"])
    out, _ = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r.get("chunks") for r in rows] == [len(by_hand(models, LONG)), None]
    np.testing.assert_allclose(rows[0]["embedding"], embedder(models, truncation="chunk")(LONG)
                               ["embedding"], atol=1e-6)
    code = main(["predict", "fill-mask", "--model", str(models["mlm"]), "--truncation", "chunk",
                 "--text", "paris is [MASK]."])
    _, err = capsys.readouterr()
    assert code == 2 and "truncation=chunk does not apply to fill-mask" in err


def test_the_server_chunks_classification_and_both_embedding_apis(models):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app
    from bertforge.serve.settings import ServeSettings
    from bertforge.tasks.registry import get_task

    pipe = classifier(models, truncation="chunk")
    extractor = load_pipeline(models["cls"], "feature-extraction", precision="fp32",
                              max_length=WINDOW, truncation="chunk")
    route = get_task("text-classification").serving.route
    with TestClient(create_app(pipe, ServeSettings(), embeddings=extractor)) as client:
        classified = client.post(route, json={"text": LONG}).json()
        openai = client.post("/v1/embeddings", json={"input": [LONG, "paris"]}).json()
        tei = client.post("/embed", json={"inputs": LONG, "normalize": False}).json()
        cut = client.post("/embed", json={"inputs": LONG, "normalize": False,
                                          "truncate": True}).json()
        health = client.get("/health").json()
    windows = len(by_hand(models, LONG))
    assert classified["chunks"] == windows > 1 and classified == pipe(LONG)
    vector = extractor(LONG)["embedding"]
    np.testing.assert_allclose(openai["data"][0]["embedding"], vector, atol=1e-6)
    assert openai["usage"]["prompt_tokens"] == windows * WINDOW + 3  # every window's tokens
    np.testing.assert_allclose(tei[0], vector, atol=1e-6)
    np.testing.assert_allclose(cut[0], extractor({"text": LONG, "truncate": True})["embedding"],
                               atol=1e-6)
    assert not np.allclose(cut[0], vector, atol=1e-3)
    assert "chunk" in json.dumps(health)


def test_serve_command_accepts_chunk_and_refuses_it_for_qa(models, capsys):
    from bertforge.cli import main

    code = main(["serve", "--model", str(models["qa"]), "--truncation", "chunk", "--port", "0"])
    _, err = capsys.readouterr()
    assert code == 2 and "truncation=chunk does not apply to question-answering" in err
