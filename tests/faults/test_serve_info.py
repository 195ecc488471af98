"""What the server says about itself: ``/info`` names the served task as the task registry knows
it, whatever the backend; no route a client can reach without the API key, and no error
message, shows where the model lives on disk unless the operator asks for it
(``expose_paths``); and a model whose saved generation settings exceed the server's limits is
reported once at start-up, key by key, before requests meet the 413.

Apps are the product's (``create_app`` around pipelines loaded as ``bertforge serve`` loads
them, :func:`bertforge.serve.replica_worker.load_pipelines`), asked over real HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from bertforge.models import (BertConfig, BertForMaskedLM, BertForQuestionAnswering,
                              BertForTokenClassification)
from bertforge.serve.app import create_app
from bertforge.serve.replica_worker import load_pipelines
from bertforge.serve.replicas import ReplicaPipeline, ReplicaPool, ReplicaSpec, load_parsers
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import BertTokenizer
from serving import ServeProcess, save_tiny_classifier, stop_cleanly

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         *"the film was good bad who wrote it ada paris is a city".split()]
HEADS = {"fill-mask": BertForMaskedLM, "question-answering": BertForQuestionAnswering,
         "token-classification": BertForTokenClassification}
# TEI's kinds where TEI has one; the task's own name where it has none.
KIND = {"feature-extraction": "embedding", "text-classification": "classifier",
        "fill-mask": "fill-mask", "question-answering": "question-answering",
        "token-classification": "token-classification"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve_info")
    out = {"text-classification": save_tiny_classifier(root / "classify", VOCAB)}
    for task, head in HEADS.items():
        torch.manual_seed(0)
        config = BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB),
                                        max_position_embeddings=128, num_labels=3)
        out[task] = head(config).save_pretrained(root / task, tokenizer=BertTokenizer(VOCAB))
    out["feature-extraction"] = out["fill-mask"]
    return out


def _app(model: Path, task: str | None, backend: str = "torch",
         settings: ServeSettings = ServeSettings()) -> Any:
    pipeline, extractor = load_pipelines(model, task, backend, "cpu", None, True)
    return create_app(pipeline, settings, embeddings=extractor)


@pytest.mark.parametrize("task", sorted(KIND))
def test_info_describes_the_served_task(task: str, models: dict[str, Path]) -> None:
    with TestClient(_app(models[task], task)) as client:
        info = client.get("/info").json()
    assert info["task"] == task, info
    assert list(info["model_type"]) == [KIND[task]], info


def test_info_of_an_onnx_fill_mask_server_says_fill_mask(models: dict[str, Path],
                                                         tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from bertforge.export import export_onnx

    export_onnx(models["fill-mask"], tmp_path / "onnx", exporter="torchscript")
    with TestClient(_app(tmp_path / "onnx", None, "onnx")) as client:
        info = client.get("/info").json()
        health = client.get("/health").json()
    assert info["task"] == "fill-mask" and info["backend"] != "pytorch", info
    assert info["model_type"] == {"fill-mask": {}}, info
    assert info["pooling"] is None and info["dimensions"] is None, info
    assert health["task"] == "fill-mask"


# ---------------------------------------------------------------------------- paths


def _reached_without_the_key(client: TestClient) -> list[httpx.Response]:
    """Everything an unauthenticated client can ask: the open routes, the refusals of the
    protected ones, unknown routes and methods."""
    return [client.get("/health"), client.get("/info"), client.get("/docs"),
            client.get("/openapi.json"), client.get("/"), client.get("/metrics"),
            client.post("/v1/summarization", json={"text": "a"}), client.get("/nothing/here"),
            client.put("/health"), client.post("/tokenize", content=b"{")]


def _errors_with_the_key(client: TestClient) -> list[httpx.Response]:
    """Refusals a client with the key can provoke, one for each check that names a setting."""
    key = {"Authorization": "Bearer k"}
    return [client.post("/v1/summarization", json=body, headers=key) for body in (
        {"text": "the film", "max_length": 500}, {"text": "the film", "num_beams": 0},
        {"text": "the film", "min_length": 40, "max_length": 20}, {"text": ""},
        {"text": "the film", "length_penalty": "x"}, {"nope": 1}, {"text": "the film",
                                                                    "max_new_tokens": 900})]


def _shown(responses: list[httpx.Response], model: Path) -> list[str]:
    paths = {str(model), str(model.resolve()), str(model.parent), str(model.resolve().parent)}
    return [f"{r.request.method} {r.request.url.path}: {r.text[:300]}" for r in responses
            if any(path in r.text for path in paths)]


def test_no_path_reaches_a_client_unless_asked(tiny_bart: Path) -> None:
    settings = ServeSettings(api_key="k")
    with TestClient(_app(tiny_bart, None, settings=settings)) as client:
        answers = _reached_without_the_key(client) + _errors_with_the_key(client)
        info = client.get("/info").json()
    assert [r.status_code for r in answers[-7:]] != [200] * 7
    assert _shown(answers, tiny_bart) == []
    assert info["model_id"] == tiny_bart.name and info["model_path"] is None, info
    exposed = ServeSettings(api_key="k", expose_paths=True)
    with TestClient(_app(tiny_bart, None, settings=exposed)) as client:
        info = client.get("/info").json()
        health = client.get("/health").json()
    assert info["model_path"] == str(tiny_bart)
    assert health["endpoints"]["/v1/summarization"]["model"]["model"] == str(tiny_bart)


# ---------------------------------------------------------------------------- start-up warning


def _generation_config(tiny_bart: Path, target: Path, **settings: Any) -> Path:
    shutil.copytree(tiny_bart, target)
    path = target / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    return target


@pytest.mark.slow
def test_saved_generation_settings_over_the_limits_are_said_at_start_up(
        tiny_bart: Path, tmp_path: Path) -> None:
    model = _generation_config(tiny_bart, tmp_path / "model", num_beams=6, max_length=40)
    server = ServeProcess(model, tmp_path / "log", device="cpu", embeddings=False,
                          max_num_beams=4, max_generation_length=32,
                          max_generation_tokens=100).wait_ready()
    try:
        refused = httpx.post(server.url + "/v1/summarization", json={"text": "the film"},
                             timeout=60)
        stop_cleanly(server)
    finally:
        server.stop()
    lines = [line for line in server.log.read_text().splitlines() if "generation_config" in line]
    assert len(lines) == 3, server.log.read_text()
    beams, length, work = lines
    assert "num_beams=6" in beams and "--max-num-beams 4" in beams, beams
    assert "max_length=40" in length and "--max-generation-length 32" in length, length
    assert "240" in work and "--max-generation-tokens 100" in work, work
    assert all("413" in line for line in lines), lines  # what a request without the field gets
    assert refused.status_code == 413, refused.text


@pytest.mark.slow
def test_saved_generation_settings_within_the_limits_are_not_mentioned(
        tiny_bart: Path, tmp_path: Path) -> None:
    server = ServeProcess(tiny_bart, tmp_path / "log", device="cpu",
                          embeddings=False).wait_ready()
    try:
        stop_cleanly(server)
    finally:
        server.stop()
    assert "generation_config" not in server.log.read_text()


def _wait_for(check: Any, what: str, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def test_a_replica_that_cannot_load_again_shows_no_path(models: dict[str, Path],
                                                         tmp_path: Path) -> None:
    """A replica killed and restarted on a model that no longer loads: its /health row says why
    in the loader's words, which quote config.json by its path; /health, /info and /metrics
    show the directory's name instead, as every error does."""
    model = tmp_path / "classify"
    shutil.copytree(models["text-classification"], model)
    parser, _ = load_parsers(model, None, "torch", None, False)
    pool = ReplicaPool(ReplicaSpec(str(model), None, "torch", None, False), ["cpu"],
                       restarts=1, backoff=0.01)
    try:
        pool.start()
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "hidden_size": 1 << 22}))
        os.kill(pool.snapshot()[0]["pid"], signal.SIGKILL)
        _wait_for(lambda: pool.snapshot()[0]["state"] == "dead", "giving the replica up")
        failure = pool.snapshot()[0]["failure"]
        assert str(model / "config.json") in failure, failure  # the loader names the file
        app = create_app(ReplicaPipeline(parser, pool, "task"), ServeSettings(api_key="k"),
                         replicas=pool)
        with TestClient(app) as client:
            answers = [client.get("/health"), client.get("/info"),
                       client.get("/metrics", headers={"Authorization": "Bearer k"})]
    finally:
        pool.close()
    assert [r.status_code for r in answers] == [503, 200, 200], [r.text for r in answers]
    assert _shown(answers, model) == []
    row = answers[0].json()["replicas"][0]
    assert row["failure"].startswith("could not load the model again: classify/config.json: "
                                     "hidden_size="), row


# ---------------------------------------------------------------------------- one way to say it


def test_every_route_names_the_model_alike(models: dict[str, Path],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """/health, /info and OpenAI's embeddings answer call the model by one name, the
    directory's own, however it was given: served as ``.`` from inside it too."""
    model = models["feature-extraction"]
    monkeypatch.chdir(model)
    with TestClient(_app(Path("."), "feature-extraction")) as client:
        health = client.get("/health").json()
        info = client.get("/info").json()
        openai = client.post("/v1/embeddings", json={"input": "the film"}).json()
    names = {health["endpoints"]["/v1/embeddings"]["model"]["model"], info["model_id"],
             openai["model"]}
    assert names == {model.name}, names


def test_a_value_of_the_wrong_kind_is_named_alike_by_every_layer(
        models: dict[str, Path]) -> None:
    """The same wrong value is called the same by the pipeline (the Python API and the
    ``/v1/<task>`` routes) and by the OpenAI route's own checks."""
    from bertforge.inference.pipelines import InputError

    with TestClient(_app(models["text-classification"], "text-classification")) as client:
        task = client.post("/v1/text-classification", json={"text": ["a", "b"]}).json()
        openai = client.post("/v1/embeddings", json={"input": [["a", "b"]]}).json()
    pipeline, _ = load_pipelines(models["text-classification"], None, "torch", "cpu", None,
                                 False)
    with pytest.raises(InputError) as python:
        pipeline({"text": ["a", "b"]})
    said = [task["error"]["message"], openai["error"]["message"], str(python.value)]
    assert all("a list of strings" in message for message in said), said
