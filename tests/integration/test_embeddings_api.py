"""Embeddings the way clients consume them: OpenAI's ``/v1/embeddings`` shape and
text-embeddings-inference's ``/embed``, ``/rerank``, ``/tokenize`` and ``/info``, on the real app
(``create_app`` with its batchers running, driven by Starlette's TestClient) around tiny
random-weight models loaded by the real ``load_pipeline``. Every vector is checked against the
feature-extraction pipeline called directly, every score against the classifier's own output."""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from bertforge.inference.pipelines import load_pipeline
from bertforge.models import BertConfig, BertForSequenceClassification, BertModel
from bertforge.serve.app import create_app
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

testclient = pytest.importorskip("starlette.testclient")

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the capital of france is paris where eiffel tower in city river seine".split()
TEXTS = ["the eiffel tower is in paris.", "the seine river", "paris is the capital of france"]
LONG = "the river seine " * 20  # 60+ tokens: over the 32 positions
SETTINGS = ServeSettings(max_batch_items=4, max_text_chars=400, max_wait_ms=1)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An encoder, a one-output classifier and an MRPC-style pair classifier (random weights)."""
    root = tmp_path_factory.mktemp("embeddings_api")
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *WORDS])))
    base = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    models = {"enc": BertModel(base),
              "score": BertForSequenceClassification(base.replace(num_labels=1)),
              "mrpc": BertForSequenceClassification(base.replace(
                  num_labels=2, id2label={0: "not_equivalent", 1: "equivalent"},
                  finetuning_task="glue/mrpc"))}
    return {name: m.save_pretrained(root / name, tokenizer=tok) for name, m in models.items()}


@pytest.fixture(scope="module")
def extractor(dirs: dict[str, Path]) -> Any:
    return load_pipeline(dirs["enc"], device="cpu")


def _client(app: Any) -> Iterator[Any]:
    with testclient.TestClient(app) as client:  # runs the lifespan: the batchers start
        yield client


@pytest.fixture(scope="module")
def enc(extractor: Any) -> Iterator[Any]:
    yield from _client(create_app(extractor, SETTINGS))


@pytest.fixture(scope="module")
def scorer(dirs: dict[str, Path]) -> Iterator[Any]:
    pipe = load_pipeline(dirs["score"], device="cpu")
    embeddings = load_pipeline(dirs["score"], "feature-extraction", device="cpu")
    yield from _client(create_app(pipe, SETTINGS, embeddings=embeddings))


def _direct(pipe: Any, texts: list[str], **fields: Any) -> np.ndarray:
    return np.array([r["embedding"] for r in pipe([pipe.parse({"text": t, **fields})
                                                   for t in texts])])


def _error(response: Any, status: int, field: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    return error["message"]


# --- OpenAI ---------------------------------------------------------------------------------------


def test_openai_shape_equals_the_pipeline(enc: Any, extractor: Any) -> None:
    body = enc.post("/v1/embeddings", json={"input": TEXTS, "model": "text-embedding-3-small"})
    assert body.status_code == 200, body.text
    out = body.json()
    assert out["object"] == "list" and out["model"] == "enc"
    assert [(d["object"], d["index"]) for d in out["data"]] == [("embedding", i)
                                                                 for i in range(3)]
    got = np.array([d["embedding"] for d in out["data"]])
    assert np.abs(got - _direct(extractor, TEXTS)).max() < 1e-5
    tokens = sum(len(extractor.tokenizer.encode(t)) for t in TEXTS)
    assert out["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    one = enc.post("/v1/embeddings", json={"input": TEXTS[0]}).json()
    assert len(one["data"]) == 1 and np.allclose(one["data"][0]["embedding"], got[0], atol=1e-6)


def test_openai_base64_is_little_endian_float32(enc: Any) -> None:
    floats = enc.post("/v1/embeddings", json={"input": TEXTS[:2]}).json()["data"]
    packed = enc.post("/v1/embeddings", json={"input": TEXTS[:2],
                                              "encoding_format": "base64"}).json()["data"]
    for f, p in zip(floats, packed):
        decoded = np.frombuffer(base64.b64decode(p["embedding"]), dtype="<f4")
        assert decoded.shape == (32,)
        assert np.abs(decoded - np.array(f["embedding"])).max() < 1e-6


def test_openai_normalize_and_truncate(enc: Any, extractor: Any) -> None:
    unit = enc.post("/v1/embeddings", json={"input": TEXTS, "normalize": True}).json()["data"]
    raw = _direct(extractor, TEXTS)
    for d, r in zip(unit, raw):
        assert math.isclose(np.linalg.norm(d["embedding"]), 1.0, rel_tol=1e-5)
        assert np.abs(np.array(d["embedding"]) - r / np.linalg.norm(r)).max() < 1e-5
    message = _error(enc.post("/v1/embeddings", json={"input": [TEXTS[0], LONG]}), 422,
                     "input[1]")
    assert "32" in message and '"truncate": true' in message
    cut = enc.post("/v1/embeddings", json={"input": [TEXTS[0], LONG], "truncate": True})
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == len(extractor.tokenizer.encode(TEXTS[0])) + 32
    alone = _direct(extractor, [LONG], truncate=True)[0]
    assert np.abs(np.array(cut.json()["data"][1]["embedding"]) - alone).max() < 1e-5


def test_the_previous_embeddings_shape_still_works(enc: Any, extractor: Any) -> None:
    one = enc.post("/v1/embeddings", json={"text": TEXTS[0]})
    assert one.status_code == 200 and one.json()["pooling"] == "mean"
    many = enc.post("/v1/embeddings", json={"inputs": [{"text": t} for t in TEXTS]}).json()
    got = np.array([o["embedding"] for o in many["outputs"]])
    assert np.abs(got - _direct(extractor, TEXTS)).max() < 1e-5


@pytest.mark.parametrize("body, status, field", [
    ({"input": []}, 422, "input"),
    ({"input": [1, 2, 3]}, 422, "input"),  # token ids: the whole value is the wrong kind
    ({"input": ["a", None]}, 422, "input[1]"),
    ({"input": ["a", "  "]}, 422, "input[1]"),
    ({"input": ["a"] * 5}, 413, "input"),
    ({"input": "x" * 401}, 413, "input"),
    ({"input": "a", "encoding_format": "int8"}, 422, "encoding_format"),
    ({"input": "a", "dimensions": 16}, 422, "dimensions"),
    ({"input": "a", "model": 3}, 422, "model"),
    ({"input": "a", "normalize": "yes"}, 422, "normalize"),
    ({"input": "a", "temperature": 1}, 422, "temperature"),
])
def test_openai_bad_requests_name_the_field(enc: Any, body: dict, status: int,
                                            field: str) -> None:
    _error(enc.post("/v1/embeddings", json=body), status, field)


def test_openai_dimensions_equal_to_the_hidden_size_is_accepted(enc: Any) -> None:
    response = enc.post("/v1/embeddings", json={"input": "paris", "dimensions": 32})
    assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 32


def test_requests_go_through_the_batcher(enc: Any) -> None:
    def batches() -> float:
        text = enc.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("bertforge_batch_size_count")
                   and 'task="feature-extraction"' in line)

    before = batches()
    assert enc.post("/embed", json={"inputs": TEXTS}).status_code == 200
    assert enc.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200
    assert batches() > before


# --- TEI --------------------------------------------------------------------------------------------


def test_embed_normalizes_by_default(enc: Any, extractor: Any) -> None:
    raw = _direct(extractor, TEXTS)
    unit = np.array(enc.post("/embed", json={"inputs": TEXTS}).json())
    assert unit.shape == (3, 32)
    assert np.abs(unit - raw / np.linalg.norm(raw, axis=1, keepdims=True)).max() < 1e-5
    plain = enc.post("/embed", json={"inputs": TEXTS[0], "normalize": False}).json()
    assert len(plain) == 1 and np.abs(np.array(plain[0]) - raw[0]).max() < 1e-5
    _error(enc.post("/embed", json={"inputs": [TEXTS[0], LONG]}), 422, "inputs[1]")
    assert enc.post("/embed", json={"inputs": LONG, "truncate": True}).status_code == 200
    _error(enc.post("/embed", json={"inputs": "a", "truncation_direction": "left"}), 422,
           "truncation_direction")
    _error(enc.post("/embed", json={"input": "a"}), 422, "input")


def test_tokenize_lists_tokens_with_offsets(enc: Any, extractor: Any) -> None:
    text = "Paris, the city"
    (tokens,) = enc.post("/tokenize", json={"inputs": text}).json()
    assert [t["id"] for t in tokens] == extractor.tokenizer.encode(text)
    assert tokens[0] == {"id": extractor.tokenizer.cls_id, "text": "[CLS]", "special": True,
                         "start": None, "stop": None}
    assert tokens[-1]["text"] == "[SEP]" and tokens[-1]["special"]
    for t in tokens[1:-1]:
        assert not t["special"] and text[t["start"]:t["stop"]] == t["text"]
    assert tokens[1]["text"] == "Paris"  # the input's own spelling, not the lower-cased token
    bare = enc.post("/tokenize", json={"inputs": [text, "seine"],
                                       "add_special_tokens": False}).json()
    assert len(bare) == 2 and [t["id"] for t in bare[0]] == [t["id"] for t in tokens[1:-1]]
    _error(enc.post("/tokenize", json={"inputs": ["a", 5]}), 422, "inputs[1]")


def test_rerank_bi_encoder_is_cosine_of_embeddings(enc: Any, extractor: Any) -> None:
    query = "the capital of france"
    ranked = enc.post("/rerank", json={"query": query, "texts": [*TEXTS, query],
                                       "return_text": True}).json()
    vectors = _direct(extractor, [query, *TEXTS, query])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    want = unit[1:] @ unit[0]
    assert [r["index"] for r in ranked] == list(np.argsort(-want, kind="stable"))
    assert ranked[0]["index"] == 3 and math.isclose(ranked[0]["score"], 1.0, rel_tol=1e-5)
    for r in ranked:
        assert math.isclose(r["score"], want[r["index"]], abs_tol=1e-5)
        assert r["text"] == [*TEXTS, query][r["index"]]
    _error(enc.post("/rerank", json={"query": "", "texts": TEXTS}), 422, "query")
    _error(enc.post("/rerank", json={"query": "a", "texts": "paris"}), 422, "texts")
    _error(enc.post("/rerank", json={"query": "a", "texts": ["paris", LONG]}), 422, "texts[1]")


def test_rerank_cross_encoder_scores_the_pair(scorer: Any, dirs: dict[str, Path]) -> None:
    classifier = load_pipeline(dirs["score"], device="cpu")
    query = "where is the eiffel tower?"
    logits = [r["score"] for r in classifier([classifier.parse({"text": query, "text_pair": t})
                                              for t in TEXTS])]
    ranked = scorer.post("/rerank", json={"query": query, "texts": TEXTS}).json()
    assert [r["index"] for r in ranked] == list(np.argsort(-np.array(logits), kind="stable"))
    for r in ranked:
        assert math.isclose(r["score"], 1 / (1 + math.exp(-logits[r["index"]])), rel_tol=1e-5)
        assert "text" not in r
    raw = scorer.post("/rerank", json={"query": query, "texts": TEXTS, "raw_scores": True}).json()
    assert sorted((r["index"], round(r["score"], 5)) for r in raw) == [
        (i, round(s, 5)) for i, s in enumerate(logits)]
    info = scorer.get("/info").json()
    assert info["rerank"] == "cross-encoder" and "reranker" in info["model_type"]
    _error(scorer.post("/rerank", json={"query": query, "texts": ["paris", LONG]}), 422,
           "texts[1]")
    cut = scorer.post("/rerank", json={"query": query, "texts": ["paris", LONG], "truncate": True})
    assert cut.status_code == 200 and len(cut.json()) == 2
    # The same per-item option on the classifier's own route.
    one = scorer.post("/v1/text-classification", json={"text": LONG, "truncate": True})
    assert one.status_code == 200 and one.json()["truncated"] is True


def test_rerank_pair_classifier_uses_its_matching_class(dirs: dict[str, Path]) -> None:
    pipe = load_pipeline(dirs["mrpc"], device="cpu")
    query = "paris is the capital"
    results = pipe([pipe.parse({"text": query, "text_pair": t}) for t in TEXTS])
    for client in _client(create_app(pipe, SETTINGS)):
        ranked = client.post("/rerank", json={"query": query, "texts": TEXTS}).json()
        raw = client.post("/rerank", json={"query": query, "texts": TEXTS,
                                           "raw_scores": True}).json()
        info = client.get("/info").json()
    assert info["rerank"] == "cross-encoder" and "equivalent" in info["rerank_scoring"]
    for r in ranked:
        assert math.isclose(r["score"], results[r["index"]]["scores"]["equivalent"], rel_tol=1e-6)
    for r in raw:  # the log-odds: sigmoid of the raw score is the probability
        p = results[r["index"]]["scores"]["equivalent"]
        assert math.isclose(1 / (1 + math.exp(-r["score"])), p, rel_tol=1e-6)


def test_info_describes_the_server(enc: Any) -> None:
    info = enc.get("/info").json()
    assert info["model_id"] == "enc" and info["task"] == "feature-extraction"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert (info["pooling"], info["normalize"], info["dimensions"]) == ("mean", False, 32)
    assert info["max_input_length"] == 32 and info["max_client_batch_size"] == 4
    assert info["max_batch_tokens"] == SETTINGS.max_batch_tokens
    assert info["backend"] == "pytorch" and info["rerank"] == "bi-encoder" and info["version"]
    assert {"/embed", "/rerank", "/tokenize", "/v1/embeddings"} <= set(info["endpoints"])


def test_routes_need_the_api_key_and_embed_says_why_it_is_missing(dirs: dict[str, Path]
                                                                  ) -> None:
    pipe = load_pipeline(dirs["mrpc"], device="cpu")
    settings = ServeSettings(api_key="sesame")
    for client in _client(create_app(pipe, settings)):
        for path, body in (("/embed", {"inputs": "a"}), ("/rerank", {"query": "a",
                                                                     "texts": ["b"]}),
                           ("/tokenize", {"inputs": "a"})):
            _error(client.post(path, json=body), 401, "Authorization")
        assert client.get("/info").status_code == 200  # open, like /health
        key = {"Authorization": "Bearer sesame"}
        assert "--no-embeddings" in _error(client.post("/embed", json={"inputs": "a"},
                                                       headers=key), 404, None)
        assert client.post("/tokenize", json={"inputs": "a"}, headers=key).status_code == 200
