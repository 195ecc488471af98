"""ONNX export of the ModernBERT heads: parity with the eager PyTorch model on batches shorter and
longer than the sliding window with padded rows, inputs without token types, int8 quantization
with its reported change, Triton, and the exported directory served as ``serve --backend onnx``
serves it.

Models are random 3-layer, 64-wide ModernBERTs (the modernbert-tiny preset: a window of 8 tokens
each side, layers global, local, local) over a 600-token ModernBERT BPE trained on the test
corpus, so each export takes about a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from bertforge.export import DEFAULT_ATOL, EXPORTABLE, HEADS, OnnxModel, export_onnx
from bertforge.models.modernbert_config import ModernBertConfig
from bertforge.models.modernbert import MODERNBERT_CLASSES
from bertforge.models.registry import MODERNBERT
from bertforge.tokenization import ModernBpeTokenizer, load_tokenizer
from bertforge.tokenization.training import train_modern_bpe

pytest.importorskip("onnxruntime")

CORPUS = Path(__file__).resolve().parents[1] / "assets" / "tiny_corpus.txt"
ARCHITECTURES = [MODERNBERT.heads[h].name for h in MODERNBERT.exportable]
WINDOW = 8  # modernbert-tiny: local_attention 16
QUESTION = "who wrote the report?"
CONTEXT = "the report was written by ada in london in 1843, and the note came later."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ModernBpeTokenizer:
    out = tmp_path_factory.mktemp("modern-tok") / "tok"
    train_modern_bpe([CORPUS], 600, out, progress=False)
    return load_tokenizer(out)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory,
               tokenizer: ModernBpeTokenizer) -> dict[str, Path]:
    """One saved random ModernBERT per exportable head, keyed by architecture."""
    root = tmp_path_factory.mktemp("modern-models")
    ids = {"pad_token_id": tokenizer.pad_id, "cls_token_id": tokenizer.cls_id,
           "sep_token_id": tokenizer.sep_id, "bos_token_id": tokenizer.cls_id,
           "eos_token_id": tokenizer.sep_id}
    config = ModernBertConfig.from_preset("modernbert-tiny", vocab_size=tokenizer.vocab_size,
                                          num_labels=3, max_position_embeddings=128, **ids)
    assert config.window == WINDOW
    torch.manual_seed(0)
    dirs = {}
    for name in ARCHITECTURES:
        task = {"ModernBertForQuestionAnswering": "squad",
                "ModernBertForSequenceClassification": "glue/sst2"}.get(name)
        model = MODERNBERT_CLASSES[name](config.replace(finetuning_task=task))
        model.save_pretrained(root / name, tokenizer=tokenizer)
        dirs[name] = root / name
    return dirs


def _inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
    """A padded (batch, length) input: row 0 full, row i holding length - 3i... down to 2
    tokens, so one batch has rows both longer and shorter than the window."""
    gen = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(5, 600, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        mask[row, max(2, length - 17 * row):] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def _real(name: str, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """An output at real positions (what any consumer reads; padding positions hold unused
    values that the export's mask path and the eager one may fill differently)."""
    if value.ndim >= 2 and value.shape[:2] == mask.shape:
        return value[mask.bool()]
    return value


def test_every_exportable_modernbert_head_is_registered() -> None:
    assert set(ARCHITECTURES) <= set(EXPORTABLE) and not set(ARCHITECTURES) & set(HEADS)
    for name in ARCHITECTURES:
        assert EXPORTABLE[name].inputs == ("input_ids", "attention_mask")
    assert EXPORTABLE["ModernBertModel"].outputs == ("last_hidden_state",)  # no pooler


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_matches_pytorch_on_both_sides_of_the_window(
        architecture: str, model_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "onnx"
    report = export_onnx(model_dirs[architecture], out)
    assert all(v <= DEFAULT_ATOL for v in report.parity.values()), report.parity
    lengths = {s for _, s in report.parity_batches}
    assert min(lengths) <= WINDOW + 1 and max(lengths) > 2 * WINDOW + 1  # both sides
    assert {b for b, _ in report.parity_batches} >= {1, 3}

    graph = onnx.load(out / "model.onnx").graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.output] == list(EXPORTABLE[architecture].outputs)
    assert all(d.dim_param and not d.dim_value
               for i in graph.input for d in i.type.tensor_type.shape.dim)

    reference = MODERNBERT_CLASSES[architecture].from_pretrained(model_dirs[architecture]).eval()
    assert not reference.model.traceable if hasattr(reference, "model") else not reference.traceable
    onnx_model = OnnxModel(out, threads=1)
    for batch, length in [(1, 5), (3, 9), (1, 40), (3, 40), (2, 70)]:
        inputs = _inputs(batch, length)
        with torch.no_grad():
            want = reference(**inputs)
        # token types are not a ModernBERT input: given anyway, they are ignored
        got = onnx_model(**inputs, token_type_ids=torch.zeros_like(inputs["input_ids"]))
        assert isinstance(want, type(got))  # the task's output class (ModernBERT's subclasses it)
        for name in EXPORTABLE[architecture].outputs:
            a, b = getattr(want, name), getattr(got, name)
            assert b.shape == a.shape, (name, batch, length)
            diff = (_real(name, a, inputs["attention_mask"]) -
                    _real(name, b, inputs["attention_mask"])).abs().max().item()
            assert diff <= DEFAULT_ATOL, (name, batch, length, diff)
    info = json.loads((out / "export.json").read_text())
    assert set(info["inputs"]) == {"input_ids", "attention_mask"}
    assert (out / "tokenizer.json").is_file() and "tokenizer.json" in info["files"]


def test_unpadded_eager_model_agrees_with_the_export(model_dirs: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """The training layout (unpad, blocked window kernel) gives what the graph gives."""
    name = "ModernBertForTokenClassification"
    export_onnx(model_dirs[name], tmp_path / "onnx")
    reference = MODERNBERT_CLASSES[name].from_pretrained(model_dirs[name]).eval()
    reference.model.unpad = True
    inputs = _inputs(3, 60)
    with torch.no_grad():
        want = reference(**inputs).logits
    got = OnnxModel(tmp_path / "onnx", threads=1)(**inputs).logits
    mask = inputs["attention_mask"].bool()
    assert (want[mask] - got[mask]).abs().max().item() <= DEFAULT_ATOL


def test_int8_sample_and_triton(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    sample = tmp_path / "sample.tsv"
    sample.write_text(f"{QUESTION}\t{CONTEXT}\nwhere was it written?\t{CONTEXT} {CONTEXT}\n")
    out = tmp_path / "qa"
    report = export_onnx(model_dirs["ModernBertForQuestionAnswering"], out, quantize="int8",
                         sample=sample, triton=True)
    q = report.quantization
    assert q is not None and (out / "model.int8.onnx").is_file()
    assert q.size_bytes < q.fp32_size_bytes
    assert set(q.argmax_agreement) == {"start_logits", "end_logits"}
    assert q.answer_agreement is not None and 0 <= q.answer_f1 <= 100
    assert "int8" in report.summary() and "argmax agrees" in report.summary()
    info = json.loads((out / "export.json").read_text())
    assert info["quantization"]["max_abs_diff"] == pytest.approx(q.max_abs_diff)
    pbtxt = next((out / "triton").glob("*/config.pbtxt")).read_text()
    assert '"attention_mask"' in pbtxt and "token_type_ids" not in pbtxt
    assert "token_type_ids" not in (out / "triton" / "README.md").read_text()
    int8 = OnnxModel(out, quantized=True, threads=1)(**_inputs(2, 30))
    assert np.isfinite(int8.start_logits.numpy()).all()


@pytest.mark.parametrize("architecture", ["ModernBertForQuestionAnswering",
                                          "ModernBertForSequenceClassification",
                                          "ModernBertModel"])
def test_serve_backend_onnx_answers_as_pytorch(architecture: str, model_dirs: dict[str, Path],
                                               tmp_path: Path) -> None:
    from bertforge.serve.replica_worker import load_pipelines
    from bertforge.inference.pipelines import load_pipeline

    export_onnx(model_dirs[architecture], tmp_path / "onnx")
    served, _ = load_pipelines(tmp_path / "onnx", None, "onnx", "cpu", None, False)
    eager = load_pipeline(model_dirs[architecture], served.task, device="cpu")
    assert served.describe()["backend"] != "pytorch" and served.task == eager.task
    item = ({"question": QUESTION, "context": CONTEXT * 2} if "Question" in architecture
            else {"text": CONTEXT * 2})
    got, want = served([served.parse(item)])[0], eager([eager.parse(item)])[0]
    if "Question" in architecture:
        assert (got["answer"], got["start"]) == (want["answer"], want["start"])
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)
    elif "Sequence" in architecture:
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)
    else:
        assert np.allclose(got["embedding"], want["embedding"], atol=1e-4)


def test_sentence_transformers_export_of_a_modernbert_encoder(model_dirs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    """sentence-transformers (through transformers' ModernBERT) gives the vectors of bertforge's
    feature-extraction pipeline, for texts shorter and longer than the window."""
    st = pytest.importorskip("sentence_transformers")
    from bertforge.export.sentence_transformers import export_sentence_transformers
    from bertforge.inference.pipelines import load_pipeline

    out = tmp_path / "st"
    export_sentence_transformers(model_dirs["ModernBertForSequenceClassification"], out)
    texts = [CONTEXT * 2, "hello"]
    got = st.SentenceTransformer(str(out), device="cpu").encode(texts)
    pipeline = load_pipeline(out, "feature-extraction", device="cpu")
    want = np.array([r["embedding"] for r in pipeline([pipeline.parse({"text": t})
                                                       for t in texts])])
    assert np.abs(got - want).max() <= 1e-4
