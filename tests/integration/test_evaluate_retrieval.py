"""``bertforge evaluate retrieval|sts`` and ``bertforge mine`` on a tiny BERT saved as a
sentence-transformers directory (with query and document prompts) and a tiny BEIR set: the
printed metrics equal the metrics of sentence-transformers' own vectors searched by a full sort,
a reranker's equal those of sentence-transformers' CrossEncoder logits, STS equals scipy's
Spearman of its cosines, mining equals mining with its vectors, and bad input is refused in one
line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.export.sentence_transformers import write_sentence_transformers_files
from bertforge.metrics.retrieval import RETRIEVAL_KEYS, retrieval_metrics
from bertforge.models import BertConfig, BertForSequenceClassification, BertModel
from bertforge.retrieval.mining import mine
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

st = pytest.importorskip("sentence_transformers")
stats = pytest.importorskip("scipy.stats")

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!:'-")
WORDS = ("the a of is in river city tower bridge paris rome london old new tall long blue "
         "where what query passage").split()
PROMPTS = {"query": "query: ", "document": "passage: "}


def _tokenizer() -> BertTokenizer:
    return BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS,
                                             *[f"##{c}" for c in CHARS], *WORDS])))


def _config(tok: BertTokenizer, **kw) -> BertConfig:
    return BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=48,
                      **kw)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An embedding model (sentence-transformers layout, mean pooling, prompts) and a 1-label
    reranker, both random."""
    root, tok = tmp_path_factory.mktemp("retrieval-models"), _tokenizer()
    torch.manual_seed(0)
    encoder = BertModel(_config(tok)).save_pretrained(root / "encoder", tokenizer=tok)
    write_sentence_transformers_files(encoder, pooling="mean", normalize=False, dimensions=32,
                                      max_seq_length=48, prompts=PROMPTS)
    ranker = BertForSequenceClassification(_config(tok, num_labels=1,
                                                   finetuning_task="text-ranking"))
    classifier = BertForSequenceClassification(_config(tok, num_labels=3))
    return {"encoder": encoder,
            "reranker": ranker.save_pretrained(root / "reranker", tokenizer=tok),
            "classifier": classifier.save_pretrained(root / "classifier", tokenizer=tok)}


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS[:-4]) for _ in range(n))


@pytest.fixture(scope="module")
def beir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(1)
    root = tmp_path_factory.mktemp("beir")
    (root / "qrels").mkdir()
    corpus = [{"_id": f"d{i}", "title": rng.choice(["", "paris", "old rome"]),
               "text": _sentence(rng, rng.randint(2, 30))} for i in range(40)]
    queries = [{"_id": f"q{i}", "text": f"where is {_sentence(rng, 3)}"} for i in range(8)]
    lines = ["query-id\tcorpus-id\tscore"]
    for q in queries:
        for d in rng.sample(corpus, 3):
            lines.append(f"{q['_id']}\t{d['_id']}\t{rng.choice([0, 1, 2])}")
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return root


def _full_sort_run(query_ids, q, doc_ids, d) -> dict[str, dict[str, float]]:
    """Every document of every query, cosine similarity (the metrics sort them)."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    return {qid: dict(zip(doc_ids, row.tolist())) for qid, row in zip(query_ids, q @ d.T)}


def _printed(capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _beir_texts(beir: Path) -> tuple[dict, dict, dict]:
    from bertforge.data.beir import read_beir

    data = read_beir(beir)
    return data.corpus, data.queries, data.qrels


def test_evaluate_retrieval_equals_sentence_transformers_vectors_and_reranks(
        models: dict[str, Path], beir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "metrics.json"
    assert main(["evaluate", "retrieval", "--model", str(models["encoder"]), "--data",
                 str(beir), "--device", "cpu", "--block-size", "7", "--batch-size", "5",
                 "--output", str(out)]) == 0
    printed, err = _printed(capsys)
    assert list(printed) == list(RETRIEVAL_KEYS)
    assert json.loads(out.read_text()) == printed
    assert "nDCG@10" in err and "8 queries and 40 documents" in err
    corpus, queries, qrels = _beir_texts(beir)
    model = st.SentenceTransformer(str(models["encoder"]), device="cpu")
    q = model.encode(list(queries.values()), prompt_name="query")
    d = model.encode(list(corpus.values()), prompt_name="document")
    want = retrieval_metrics(_full_sort_run(list(queries), q, list(corpus), d), qrels)
    for key in RETRIEVAL_KEYS:
        assert printed[key] == pytest.approx(want[key], abs=1e-6), key
    # Without the prompts the vectors differ, and so would the comparison.
    plain = retrieval_metrics(_full_sort_run(list(queries), model.encode(list(queries.values())),
                                             list(corpus), model.encode(list(corpus.values()))),
                              qrels)
    assert plain != want

    assert main(["evaluate", "retrieval", "--model", str(models["encoder"]), "--data",
                 str(beir), "--device", "cpu", "--reranker", str(models["reranker"]),
                 "--rerank-top", "10"]) == 0
    reranked, err = _printed(capsys)
    assert reranked["first_stage"] == printed and "reranked top 10" in err
    cross = st.CrossEncoder(str(models["reranker"]), device="cpu")
    run = _full_sort_run(list(queries), q, list(corpus), d)
    top10 = {qid: sorted(docs, key=lambda doc: (-docs[doc], doc))[:10]
             for qid, docs in run.items()}
    pairs = [(queries[qid], corpus[doc]) for qid, docs in top10.items() for doc in docs]
    logits = cross.predict(pairs, activation_fn=torch.nn.Identity()).tolist()
    rescored: dict[str, dict[str, float]] = {qid: {} for qid in top10}
    for (qid, doc), logit in zip([(qid, doc) for qid, docs in top10.items() for doc in docs],
                                 logits):
        rescored[qid][doc] = logit
    want = retrieval_metrics(rescored, qrels)
    assert want != printed  # the reranker changed the order: the check below can fail
    for key in RETRIEVAL_KEYS:
        assert reranked[key] == pytest.approx(want[key], abs=1e-6), key


def test_evaluate_sts_equals_scipy_on_sentence_transformers_cosines(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(2)
    rows = [{"sentence1": _sentence(rng, rng.randint(2, 9)),
             "sentence2": _sentence(rng, rng.randint(2, 9)), "score": rng.randint(0, 50) / 10}
            for _ in range(30)]
    path = tmp_path / "sts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["evaluate", "sts", "--model", str(models["encoder"]), "--data", str(path),
                 "--device", "cpu"]) == 0
    printed, err = _printed(capsys)
    assert list(printed) == ["spearman", "pearson"] and "over 30 pairs" in err
    model = st.SentenceTransformer(str(models["encoder"]), device="cpu")
    a = model.encode([r["sentence1"] for r in rows], normalize_embeddings=True)
    b = model.encode([r["sentence2"] for r in rows], normalize_embeddings=True)
    cosine = (a * b).sum(1)
    gold = [r["score"] for r in rows]
    assert printed["spearman"] == pytest.approx(stats.spearmanr(cosine, gold).statistic,
                                                abs=1e-6)
    assert printed["pearson"] == pytest.approx(stats.pearsonr(cosine, gold).statistic, abs=1e-6)


def test_mine_end_to_end_equals_mining_with_sentence_transformers_vectors(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(3)
    pairs = [{"anchor": f"what is {_sentence(rng, 2)}", "positive": _sentence(rng, 6)}
             for _ in range(6)]
    pairs.append({"anchor": pairs[0]["anchor"], "positive": _sentence(rng, 5)})  # grouped
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    extra = [_sentence(rng, rng.randint(3, 12)) for _ in range(25)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(extra) + "\n\n")
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--model", str(models["encoder"]), "--data", str(data), "--corpus",
            str(corpus), "--output", str(out), "--range-min", "2", "--range-max", "12",
            "--negatives", "3", "--margin", "0.01", "--device", "cpu", "--block-size", "4"]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert f"{len(rows)} rows written from 7 (anchor, positive) pairs of 6 anchors" in summary
    assert rows and all(list(r) == ["anchor", "positive", "negative_1", "negative_2",
                                    "negative_3"] for r in rows)
    own = {p["anchor"]: set() for p in pairs}
    for p in pairs:
        own[p["anchor"]].add(p["positive"])
    assert all(not own[r["anchor"]] & {r[f"negative_{i}"] for i in (1, 2, 3)} for r in rows)
    model = st.SentenceTransformer(str(models["encoder"]), device="cpu")
    anchors = list(own)
    want, _ = mine(lambda t: model.encode(t, prompt_name="query"),
                   lambda t: model.encode(t, prompt_name="document"), anchors,
                   [[p["positive"] for p in pairs if p["anchor"] == a] for a in anchors], extra,
                   range_min=2, range_max=12, count=3, margin=0.01, similarity="cosine",
                   device="cpu")
    assert rows == want
    # An existing output is kept unless --overwrite.
    before = out.read_text()
    assert main(argv) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == before
    assert main([*argv, "--overwrite"]) == 0


def test_directory_encoder_embeds_empty_texts_as_sentence_transformers_does(
        models: dict[str, Path]) -> None:
    from bertforge.errors import DataError
    from bertforge.inference.embedding import DirectoryEncoder

    encoder = DirectoryEncoder(models["encoder"], device="cpu", batch_size=2)
    texts = ["", "paris", "the old tower " * 30, "rome"]  # one over max_seq_length: cut
    model = st.SentenceTransformer(str(models["encoder"]), device="cpu")
    assert np.abs(encoder.embed(texts) - model.encode(texts)).max() < 1e-5
    assert encoder.embed([]).shape == (0, 32)
    with pytest.raises(DataError, match="text 1 of a batch to embed: is not valid UTF-8"):
        encoder.embed(["ok", "bad \udc80"])


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "retrieval", "--data", "x"], "evaluate retrieval needs --model"),
    (["evaluate", "squad", "--data", "dev.json"], "evaluate squad needs --predictions"),
    (["evaluate", "sts", "--model", "m", "--data", "d", "--reranker", "r"],
     "--reranker applies to evaluate retrieval, not sts"),
    (["evaluate", "retrieval", "--model", "{encoder}", "--data", "{missing}"],
     "is not a directory; give a BEIR dataset directory"),
    (["evaluate", "retrieval", "--model", "{encoder}", "--data", "{beir}", "--reranker",
      "{classifier}"], "num_labels=3; a text-ranking model .a reranker. has one output"),
    (["mine", "--model", "m", "--data", "d", "--output", "o", "--range-min", "5",
      "--range-max", "5"], "--range-max 5 must be above --range-min 5"),
    (["mine", "--model", "m", "--data", "d", "--output", "o", "--range-min", "0",
      "--range-max", "3", "--negatives", "4"], "--negatives 4 cannot come from the 3 ranks"),
    (["mine", "--model", "{encoder}", "--data", "{scored}", "--output", "{out}"],
     "holds scored rows .* mining needs .anchor, positive. pairs"),
])
def test_bad_input_is_refused_in_one_line(argv: list[str], message: str,
                                          models: dict[str, Path], beir: Path,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import re

    scored = tmp_path / "scored.jsonl"
    scored.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "score": 1.0}) + "\n")
    places = {"encoder": str(models["encoder"]), "classifier": str(models["classifier"]),
              "beir": str(beir), "missing": str(tmp_path / "nope"),
              "scored": str(scored), "out": str(tmp_path / "o.jsonl")}
    assert main([a.format(**places) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(message, err) and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o.jsonl").exists()
