"""``bertforge finetune --task=sentence-similarity`` end to end on a tiny BERT: the issue's command
as written, its output loaded by sentence-transformers with the same vectors, retrieval that
improves with training, the losses each data shape picks, prompts, Matryoshka sizes, the cached
loss, the best evaluation kept, and errors for data a loss cannot train on."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from topics import TOPICS, save_tiny_encoder, sentence, write_rows

st = pytest.importorskip("sentence_transformers")



@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("enc") / "bert")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Pairs (each topic's question to a sentence about it), triplets with a sentence of another
    topic as the hard negative, scored pairs, and a held-out BEIR set of new sentences."""
    rng = random.Random(0)
    root = tmp_path_factory.mktemp("emb-data")
    pairs, triplets, scored = [], [], []
    for _ in range(4):
        for i, topic in enumerate(TOPICS):
            other = TOPICS[(i + 1 + rng.randrange(len(TOPICS) - 1)) % len(TOPICS)]
            anchor, positive = f"where {topic}", sentence(rng, topic, 5)
            pairs.append({"anchor": anchor, "positive": positive})
            triplets.append({"anchor": anchor, "positive": positive,
                             "negative": sentence(rng, other, 5)})
            scored.append({"sentence1": sentence(rng, topic, 3),
                           "sentence2": sentence(rng, rng.choice((topic, other)), 3)})
            scored[-1]["score"] = 1.0 if topic in scored[-1]["sentence2"].split() else 0.0
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    write_rows(beir / "corpus.jsonl", [{"_id": f"d{i}", "title": "",
                                        "text": sentence(rng, t, 6)}
                                       for i, t in enumerate(TOPICS)])
    write_rows(beir / "queries.jsonl", [{"_id": f"q{i}", "text": f"what {t}"}
                                        for i, t in enumerate(TOPICS)])
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(TOPICS))))
    return {"pairs": write_rows(root / "pairs.jsonl", pairs),
            "triplets": write_rows(root / "triplets.jsonl", triplets),
            "scored": write_rows(root / "scored.jsonl", scored), "beir": beir}


def finetune(model: Path, train: Path, out: Path, *extra: str) -> Path:
    # The issue's command line, as written, plus the test's own settings.
    assert main(["finetune", "--task=sentence-similarity", f"--model={model}",
                 f"--data.train={train}", f"--output_dir={out}", "--train.epochs=1",
                 "--train.global_batch_size=32", "--train.micro_batch_size=32",
                 "--optim.lr=2e-5", "--optim.warmup=0.1", "--data.max_seq_length=256",
                 "--train.seed=1", "--tensorboard=false", *extra]) == 0
    return out


def ndcg(model: Path, beir: Path, capsys: pytest.CaptureFixture) -> float:
    capsys.readouterr()
    assert main(["evaluate", "retrieval", "--model", str(model), "--data", str(beir)]) == 0
    out = capsys.readouterr().out
    assert "ndcg@10" in out
    return json.loads(out[out.index("{"):out.rindex("}") + 1])["ndcg@10"]


def test_the_issue_command_trains_a_model_sentence_transformers_loads(
        tiny_encoder: Path, data: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    out = finetune(tiny_encoder, data["pairs"], tmp_path / "out")
    assert (out / "modules.json").is_file()
    texts = ["where kaba", "the kaba is near red", "blue " * 300]  # the last over 256 tokens
    from bertforge.inference.pipelines import load_pipeline

    pipe = load_pipeline(out, device="cpu", truncation="truncate")
    ours = np.array([r["embedding"] for r in pipe([pipe.parse({"text": t}) for t in texts])])
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.allclose(np.linalg.norm(theirs, axis=1), 1.0, atol=1e-5)  # normalize by default
    assert ndcg(out, data["beir"], capsys) >= 0.0


def test_training_improves_retrieval_on_held_out_sentences(
        tiny_encoder: Path, data: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    from bertforge.export.sentence_transformers import export_sentence_transformers

    start = tmp_path / "start"
    export_sentence_transformers(tiny_encoder, start, normalize=True)
    before = ndcg(start, data["beir"], capsys)
    out = finetune(tiny_encoder, data["triplets"], tmp_path / "out", "--train.epochs=8",
                   "--optim.lr=1e-3", f"--data.validation={data['beir']}",
                   "--train.eval_every=12")
    after = ndcg(out, data["beir"], capsys)
    assert after > before + 0.2, (before, after)
    best = json.loads((out / "best" / "eval_results.json").read_text())
    assert best["ndcg@10"] >= json.loads((out / "eval_results.json").read_text())["ndcg@10"] - 1e-9
    assert (out / "best" / "modules.json").is_file()


def test_scored_pairs_train_with_cosent_and_a_loss_needs_its_data(
        tiny_encoder: Path, data: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    out = finetune(tiny_encoder, data["scored"], tmp_path / "cosent",
                   f"--data.validation={data['scored']}")
    metrics = json.loads((out / "eval_results.json").read_text())
    assert set(metrics) >= {"spearman", "pearson"}
    assert main(["finetune", "--task=embedding", f"--model={tiny_encoder}",
                 f"--data.train={data['pairs']}", f"--output_dir={tmp_path / 'bad'}",
                 "--embedding.loss=cosent"]) == 2
    err = capsys.readouterr().err
    assert "embedding.loss=cosent needs scored pairs" in err and "pairs.jsonl" in err
    assert "Traceback" not in err


def test_prompts_matryoshka_and_the_cached_loss(tiny_encoder: Path, data: dict[str, Path],
                                                tmp_path: Path) -> None:
    plain = finetune(tiny_encoder, data["triplets"], tmp_path / "plain", "--train.epochs=2",
                     "--embedding.query_prompt=query: ", "--embedding.passage_prompt=passage: ",
                     "--embedding.matryoshka_dims=[32,16]")
    cached = finetune(tiny_encoder, data["triplets"], tmp_path / "cached", "--train.epochs=2",
                      "--embedding.query_prompt=query: ", "--embedding.passage_prompt=passage: ",
                      "--embedding.matryoshka_dims=[32,16]",
                      "--embedding.cache_chunk=7")
    from safetensors.torch import load_file

    a, b = (load_file(d / "model.safetensors") for d in (plain, cached))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5  # the same training
    model = st.SentenceTransformer(str(cached), device="cpu")
    assert model.prompts.get("query") == "query: "
    q = model.encode_query(["where kaba"])
    np.testing.assert_allclose(q, model.encode(["query: where kaba"]), atol=1e-6)
    short = st.SentenceTransformer(str(cached), device="cpu", truncate_dim=16)
    assert short.encode(["where kaba"]).shape == (1, 16)


@pytest.mark.parametrize("sharding", [(), ("--train.fsdp=true",)], ids=["ddp", "fsdp"])
def test_two_gloo_ranks_train_like_one_process_with_the_same_global_batch(
        tiny_encoder: Path, data: dict[str, Path], tmp_path: Path, child_env, run_metrics,
        sharding: tuple[str, ...]) -> None:
    """Each rank embeds half of every global batch; the anchors meet all ranks' candidates
    (gathered with gradients), so the loss, the gradients and the weights are one process's."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    from ranks import free_port

    common = ["--task=sentence-similarity", f"--model={tiny_encoder}",
              f"--data.train={data['triplets']}", "--train.max_steps=3",
              "--train.global_batch_size=32", "--optim.lr=2e-5", "--train.log_every=1",
              "--tensorboard=false", "--embedding.symmetric=true", "--train.seed=3"]
    single = tmp_path / "single"
    assert main(["finetune", *common, "--train.micro_batch_size=32",
                 f"--output_dir={single}"]) == 0
    ddp = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "bertforge.cli",
         "finetune", *common, *sharding, "--train.micro_batch_size=16",
         f"--output_dir={ddp}"],
        env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [(a, b) for a, b in zip(run_metrics(single), run_metrics(ddp)) if "loss" in a]
    assert len(lines) == 3
    for a, b in lines:
        for key in ("loss", "acc", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (key, a, b)
    wa, wb = (load_file(d / "model.safetensors") for d in (single, ddp))
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6


def test_a_modernbert_encoder_trains_into_a_sentence_transformers_model(
        data: dict[str, Path], tmp_path: Path) -> None:
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.models.modernbert_config import ModernBertConfig
    from bertforge.models.modernbert import MODERNBERT_CLASSES
    from bertforge.tokenization import load_tokenizer
    from bertforge.tokenization.training import train_modern_bpe

    corpus = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
    train_modern_bpe([corpus], 600, tmp_path / "tok", progress=False)
    tok = load_tokenizer(tmp_path / "tok")
    config = ModernBertConfig.from_preset(
        "modernbert-tiny", vocab_size=tok.vocab_size, max_position_embeddings=256,
        pad_token_id=tok.pad_id, cls_token_id=tok.cls_id, sep_token_id=tok.sep_id,
        bos_token_id=tok.cls_id, eos_token_id=tok.sep_id)
    torch.manual_seed(0)
    start = MODERNBERT_CLASSES["ModernBertModel"](config).save_pretrained(tmp_path / "mb",
                                                                          tokenizer=tok)
    out = finetune(start, data["triplets"], tmp_path / "out", "--embedding.pooling=cls",
                   "--embedding.query_prompt=query: ")
    texts = ["where kaba", "the kaba is near red", "blue " * 300]
    pipe = load_pipeline(out, device="cpu", truncation="truncate")
    ours = np.array([r["embedding"] for r in pipe([pipe.parse({"text": t}) for t in texts])])
    model = st.SentenceTransformer(str(out), device="cpu")
    np.testing.assert_allclose(ours, model.encode(texts), atol=1e-5)
    served = pipe([pipe.parse({"text": texts[0], "prompt_name": "query"})])[0]["embedding"]
    np.testing.assert_allclose(served, model.encode_query(texts[:1])[0], atol=1e-5)


def test_a_stopped_and_resumed_run_equals_the_straight_run(
        tiny_encoder: Path, data: dict[str, Path], tmp_path: Path, monkeypatch,
        stop_after) -> None:
    """Exact resume with the arranged (no-duplicates) order, the cached pass and a best model:
    the stopped run's second half draws the same batches and ends with the same bytes."""
    import bertforge.train.loop

    common = ("--train.epochs=2", "--checkpoint.every=2", "--embedding.cache_chunk=24",
              f"--data.validation={data['beir']}", "--train.eval_every=3",
              "--train.global_batch_size=16", "--train.micro_batch_size=16")
    straight = finetune(tiny_encoder, data["pairs"], tmp_path / "a", *common)
    monkeypatch.setattr(bertforge.train.loop, "PreemptionFlag", stop_after(5))
    stopped = finetune(tiny_encoder, data["pairs"], tmp_path / "b", *common)
    assert not (stopped / "model.safetensors").exists()  # stopped: no final model yet
    monkeypatch.undo()
    resumed = finetune(tiny_encoder, data["pairs"], tmp_path / "b", *common)
    assert ((resumed / "model.safetensors").read_bytes()
            == (straight / "model.safetensors").read_bytes())
    for results in ("eval_results.json", "best/eval_results.json"):  # the best survives a stop
        assert (json.loads((resumed / results).read_text())
                == json.loads((straight / results).read_text()))


def test_a_sentence_transformers_start_keeps_its_max_seq_length(
        tiny_encoder: Path, data: dict[str, Path], tmp_path: Path) -> None:
    from bertforge.export.sentence_transformers import export_sentence_transformers

    start = tmp_path / "start"
    export_sentence_transformers(tiny_encoder, start)
    config = json.loads((start / "sentence_bert_config.json").read_text())
    (start / "sentence_bert_config.json").write_text(json.dumps({**config,
                                                                 "max_seq_length": 40}))
    out = tmp_path / "out"
    assert main(["finetune", "--task=embedding", f"--model={start}",
                 f"--data.train={data['pairs']}", f"--output_dir={out}",
                 "--train.max_steps=1", "--tensorboard=false"]) == 0
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 40
