"""Embedding models and rerankers as bertforge writes them load in sentence-transformers and give
the vectors and scores bertforge's pipelines and server give (CPU, fp32, max abs diff < 1e-5):

* an embedding directory pooled by mean, [CLS] or the last token, normalized or not, with the
  prompts {"query": "query: ", "document": "passage: "} and the Matryoshka sizes [32, 16, 8]:
  ``SentenceTransformer(DIR)`` gives the pipeline's and ``/v1/embeddings``' vectors,
  ``encode_query``/``encode_document`` those of ``prompt_name`` "query"/"document", and
  ``truncate_dim=16`` those of ``dimensions=16``; its ONNX export serves the same vectors;
* a text-ranking model (one output, ``finetuning_task`` "text-ranking") loads in
  ``CrossEncoder(DIR)``, whose ``predict`` equals ``/rerank``'s scores and the pipeline's;
* bad prompt names, sizes and saved files are refused with messages that say what to send.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.export.sentence_transformers import (export_sentence_transformers,
                                                    read_matryoshka_dims, read_pooling,
                                                    read_prompts,
                                                    write_sentence_transformers_files)
from bertforge.inference.pipelines import InputError, load_pipeline
from bertforge.models import BertConfig, BertForSequenceClassification, BertModel
from bertforge.serve.app import create_app
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

st = pytest.importorskip("sentence_transformers")
testclient = pytest.importorskip("starlette.testclient")

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-:")
WORDS = ["the", "capital", "of", "france", "is", "paris", "where", "eiffel", "tower", "in",
         "city", "river", "seine", "query", "passage"]
# Different lengths (padding, and so the last real token, differs per row), and one text over
# the 48 positions (cut to max_seq_length by sentence-transformers, and by truncate here).
TEXTS = ["The Eiffel Tower is in Paris.", "seine", "what is the capital of france? paris!",
         "the city where the river seine runs " * 6]
PROMPTS = {"query": "query: ", "document": "passage: "}
DIMS = [32, 16, 8]
PAIRS = [("capital of france", "paris is the capital of france."),
         ("capital of france", "the seine river"), ("eiffel tower", "the tower is in paris"),
         ("river", "seine")]


def _tokenizer() -> BertTokenizer:
    return BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS,
                                             *[f"##{c}" for c in CHARS], *WORDS])))


def _config(**more: Any) -> BertConfig:
    return BertConfig(vocab_size=_tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=48,
                      **more)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return BertModel(_config()).save_pretrained(tmp_path_factory.mktemp("emb") / "encoder",
                                                tokenizer=_tokenizer())


def _embedding_dir(encoder: Path, out: Path, pooling: str, normalize: bool,
                   dims: list[int] | None = DIMS,
                   prompts: dict[str, str] | None = PROMPTS) -> Path:
    shutil.copytree(encoder, out)
    write_sentence_transformers_files(out, pooling=pooling, normalize=normalize, dimensions=32,
                                      max_seq_length=48, prompts=prompts, matryoshka_dims=dims)
    return out


def _ours(pipe: Any, texts: list[str], **fields: Any) -> np.ndarray:
    return np.array([r["embedding"] for r in pipe(texts, **fields)])


def _served(client: Any, **body: Any) -> np.ndarray:
    response = client.post("/v1/embeddings", json={"input": TEXTS, "truncate": True, **body})
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]])


def _near(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> bool:
    return a.shape == b.shape and float(np.abs(a - b).max()) < tol


def _error(response: Any, field: str) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field, error
    return error["message"]


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_transformers_gives_the_pipelines_and_the_servers_vectors(
        encoder: Path, tmp_path: Path, pooling: str, normalize: bool) -> None:
    out = _embedding_dir(encoder, tmp_path / "st", pooling, normalize)
    pooled = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooled["pooling_mode_lasttoken"] is (pooling == "last")
    pipe = load_pipeline(out, device="cpu", truncation="truncate")
    assert (pipe.pooling, pipe.normalize, pipe.prompts, pipe.matryoshka_dims) == (
        pooling, normalize, PROMPTS, DIMS)
    model = st.SentenceTransformer(str(out), device="cpu")
    assert model.prompts["query"] == "query: " and model.truncate_dim is None
    plain = model.encode(TEXTS, batch_size=len(TEXTS))
    ours = _ours(pipe, TEXTS)
    assert _near(plain, ours)
    query = _ours(pipe, TEXTS, prompt_name="query")
    assert _near(model.encode_query(TEXTS, batch_size=len(TEXTS)), query)
    assert _near(model.encode_document(TEXTS, batch_size=len(TEXTS)),
                 _ours(pipe, TEXTS, prompt_name="document"))
    assert np.abs(query - ours).max() > 1e-3  # the prompt is read: the comparisons can fail
    # A Matryoshka size: sentence-transformers cuts after its Normalize module; normalizing the
    # cut vectors again is what normalize means for them here.
    cut = st.SentenceTransformer(str(out), device="cpu", truncate_dim=16).encode(
        TEXTS, batch_size=len(TEXTS), normalize_embeddings=normalize)
    small = _ours(pipe, TEXTS, dimensions=16)
    assert _near(cut, small) and _near(cut, plain[:, :16], 1e-3) != normalize
    assert np.allclose(np.linalg.norm(small, axis=1), 1.0, atol=1e-5) == normalize
    with testclient.TestClient(create_app(pipe, ServeSettings())) as client:
        assert _near(_served(client), plain)
        assert _near(_served(client, dimensions=16), cut)
        assert _near(_served(client, prompt_name="query"), query)
        embed = client.post("/embed", json={"inputs": TEXTS, "truncate": True, "dimensions": 8,
                                            "normalize": normalize, "prompt_name": "document"})
        assert embed.status_code == 200, embed.text
        theirs = model.encode_document(TEXTS, batch_size=len(TEXTS), truncate_dim=8,
                                       normalize_embeddings=normalize)
        assert _near(np.array(embed.json()), theirs)
        info = client.get("/info").json()
        assert (info["matryoshka_dims"], info["prompts"]) == (DIMS, PROMPTS)


def test_the_onnx_export_keeps_prompts_sizes_and_last_token_pooling(
        encoder: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from bertforge.export.runtime import OnnxModel

    source = _embedding_dir(encoder, tmp_path / "st", "last", True)
    out = tmp_path / "onnx"
    assert main(["export", "onnx", "--model", str(source), "--output", str(out)]) == 0
    assert (read_prompts(out), read_matryoshka_dims(out)) == (PROMPTS, DIMS)
    onnx = load_pipeline(out, "feature-extraction", backend=OnnxModel(out),
                         truncation="truncate")
    torch_pipe = load_pipeline(source, device="cpu", truncation="truncate")
    assert (onnx.pooling, onnx.normalize) == ("last", True)
    for fields in ({}, {"prompt_name": "query"}, {"dimensions": 8}):
        assert _near(_ours(onnx, TEXTS, **fields), _ours(torch_pipe, TEXTS, **fields)), fields
    theirs = st.SentenceTransformer(str(source), device="cpu").encode_query(TEXTS)
    with testclient.TestClient(create_app(onnx, ServeSettings())) as client:
        assert _near(_served(client, prompt_name="query"), theirs)


def test_export_keeps_the_saved_prompts_sizes_and_pooling(encoder: Path, tmp_path: Path) -> None:
    source = _embedding_dir(encoder, tmp_path / "st", "last", False)
    again = tmp_path / "again"
    export_sentence_transformers(source, again)
    saved = read_pooling(again)
    assert saved is not None and (saved.pooling, saved.normalize) == ("last", False)
    assert (read_prompts(again), read_matryoshka_dims(again)) == (PROMPTS, DIMS)
    # Without prompts or sizes the file says so (nulls and {}), and the readers give none.
    plain = tmp_path / "plain"
    export_sentence_transformers(encoder, plain)
    config = json.loads((plain / "config_sentence_transformers.json").read_text())
    assert (config["prompts"], config["matryoshka_dims"], config["similarity_fn_name"]) == (
        {}, None, "cosine")
    assert (read_prompts(plain), read_matryoshka_dims(plain)) == ({}, None)
    with pytest.raises(ConfigError, match="from 1 to the hidden size 32"):
        write_sentence_transformers_files(plain, pooling="mean", normalize=False,
                                          dimensions=32, max_seq_length=48,
                                          matryoshka_dims=[64, 32])


def test_bad_prompt_names_and_sizes_are_refused(encoder: Path, tmp_path: Path) -> None:
    pipe = load_pipeline(_embedding_dir(encoder, tmp_path / "st", "mean", True), device="cpu")
    with pytest.raises(InputError, match=r"'passage' is not a prompt of this model; its "
                                         r"prompts: query, document"):
        pipe("paris", prompt_name="passage")
    for size in (0, 33):
        with pytest.raises(InputError, match=rf"dimensions: must be from 1 to this model's 32 "
                                             rf".*got {size}"):
            pipe("paris", dimensions=size)
    assert len(pipe("paris", dimensions=5)["embedding"]) == 5  # any size, not only DIMS
    fixed = load_pipeline(_embedding_dir(encoder, tmp_path / "fixed", "mean", True, None, None),
                          device="cpu")
    with pytest.raises(InputError, match="not shortened"):
        fixed("paris", dimensions=16)
    with pytest.raises(InputError, match="it has none"):
        fixed("paris", prompt_name="query")
    with testclient.TestClient(create_app(pipe, ServeSettings())) as client:
        message = _error(client.post("/v1/embeddings", json={"input": ["a", "b"],
                                                             "prompt_name": "passage"}),
                         "prompt_name")
        assert "query, document" in message, message
        assert "33" in _error(client.post("/embed", json={"inputs": "a", "dimensions": 33}),
                              "dimensions")
        assert "got a string" in _error(client.post("/v1/embeddings", json={
            "input": "a", "dimensions": "16"}), "dimensions")
    with testclient.TestClient(create_app(fixed, ServeSettings())) as client:
        assert "not shortened" in _error(client.post("/v1/embeddings", json={
            "input": "a", "dimensions": 16}), "dimensions")


@pytest.mark.parametrize("content, says", [
    ({"matryoshka_dims": [64, 32]}, "go past the model's hidden size 32"),
    ({"matryoshka_dims": [16, 16]}, "distinct sizes"),
    ({"prompts": {"query": 3}}, "prompts must map names to texts"),
    ({"prompts": {"query": "q: "}, "default_prompt_name": "doc"}, "is not one of its prompts"),
])
def test_a_bad_saved_file_is_a_config_error(encoder: Path, tmp_path: Path, content: dict,
                                            says: str) -> None:
    out = _embedding_dir(encoder, tmp_path / "st", "mean", True)
    (out / "config_sentence_transformers.json").write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=f"config_sentence_transformers.json.*{says}"):
        load_pipeline(out, device="cpu")
    (out / "config_sentence_transformers.json").write_text('{"prompts": ')
    with pytest.raises(ConfigError, match=r"config_sentence_transformers.json:1:\d+: not valid"):
        load_pipeline(out, device="cpu")


# --------------------------------------------------------------- rerankers (cross-encoders)

@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    # Large random weights: scores spread over (0, 1), not all ~0.5 as at the usual 0.02.
    model = BertForSequenceClassification(_config(num_labels=1, finetuning_task="text-ranking",
                                                  initializer_range=0.5))
    return model.save_pretrained(tmp_path_factory.mktemp("rank") / "reranker",
                                 tokenizer=_tokenizer())


def test_cross_encoder_gives_the_pipelines_and_reranks_scores(reranker: Path) -> None:
    pipe = load_pipeline(reranker, device="cpu")
    assert pipe.task == "text-ranking"
    theirs = st.CrossEncoder(str(reranker), device="cpu").predict(PAIRS, batch_size=len(PAIRS))
    results = pipe([{"text": q, "text_pair": p} for q, p in PAIRS])
    scores = np.array([r["score"] for r in results])
    logits = np.array([r["logit"] for r in results])
    assert _near(scores, np.asarray(theirs)) and np.ptp(scores) > 0.3
    assert _near(scores, 1 / (1 + np.exp(-logits)))
    query, passages = PAIRS[0][0], [p for q, p in PAIRS if q == PAIRS[0][0]]
    with testclient.TestClient(create_app(pipe, ServeSettings())) as client:
        for raw, want in ((False, scores), (True, logits)):
            ranked = client.post("/rerank", json={"query": query, "texts": passages,
                                                  "raw_scores": raw}).json()
            assert [r["index"] for r in ranked] == sorted(
                range(len(passages)), key=lambda i: -want[i])
            assert _near(np.array([r["score"] for r in sorted(ranked, key=lambda r: r["index"])]),
                         want[:len(passages)])
        info = client.get("/info").json()
        assert info["rerank"] == "cross-encoder" and "reranker" in info["model_type"], info
        direct = client.post("/v1/text-ranking", json={"text": query, "text_pair": passages[0]})
        assert abs(direct.json()["score"] - scores[0]) < 1e-6, direct.text


def test_rerank_items_and_the_command_line(reranker: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    pipe = load_pipeline(reranker, device="cpu")
    with pytest.raises(InputError, match="text_pair: is required"):
        pipe("capital of france")
    tabbed = pipe("capital of france\tparis is the capital of france.")
    assert tabbed == pipe(text="capital of france", text_pair="paris is the capital of france.")
    assert main(["predict", "rerank", "--model", str(reranker), "--device", "cpu", "--json",
                 "--text", "capital of france\tparis is the capital of france."]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(printed["score"] - tabbed["score"]) < 1e-6
    three = tmp_path / "three"
    torch.manual_seed(0)
    BertForSequenceClassification(_config(num_labels=3)).save_pretrained(
        three, tokenizer=_tokenizer())
    with pytest.raises(ConfigError, match="num_labels=3; a text-ranking model"):
        load_pipeline(three, "text-ranking", device="cpu")
