"""Which onnxruntime execution providers a device asks for, and which device the served model
reports: the one its session really runs on.

onnxruntime's provider list and torch's GPU check are monkeypatched, and ``InferenceSession``
replaced by a fake that records the providers it was given and answers ``get_providers()`` with
chosen ones, so the CUDA cases run on a CPU-only machine with the plain onnxruntime wheel. A
real CPU session checks the default path end to end; a ``gpu`` test runs the CUDA provider for
real where onnxruntime-gpu and a GPU are present.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.export import runtime
from bertforge.export.runtime import (CPU_PROVIDER, CUDA_PROVIDER, OnnxModel,
                                      execution_providers, ort_session)
from bertforge.inference.pipelines import load_pipeline
from bertforge.models import BertConfig, BertForQuestionAnswering
from bertforge.tokenization import BertTokenizer

ort = pytest.importorskip("onnxruntime")

WORDS = "the report was written by ada in 1843 . who wrote it ?".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS)]
ITEM = {"question": "who wrote it ?", "context": "the report was written by ada in 1843 ."}


class FakeSession:
    """Stands in for ``onnxruntime.InferenceSession``: records what it was given and reports
    ``FakeSession.kept`` (None: all it was given) as the providers in use."""

    kept: list[str] | None = None
    created: list[list] = []

    def __init__(self, path: str, sess_options=None, providers=None) -> None:
        self.providers = list(providers)
        FakeSession.created.append(self.providers)

    def get_providers(self) -> list[str]:
        names = [p if isinstance(p, str) else p[0] for p in self.providers]
        return list(FakeSession.kept if FakeSession.kept is not None else names)

    def get_outputs(self) -> list:
        return [type("Output", (), {"name": n})() for n in ("start_logits", "end_logits")]


def _machine(monkeypatch: pytest.MonkeyPatch, *, ort_cuda: bool, torch_gpu: bool) -> None:
    """onnxruntime with or without the CUDA provider, torch with or without a GPU."""
    available = [CUDA_PROVIDER, CPU_PROVIDER] if ort_cuda else [CPU_PROVIDER]
    monkeypatch.setattr(ort, "get_available_providers", lambda: list(available))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: torch_gpu)


@pytest.fixture
def fake_session(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeSession]]:
    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    FakeSession.kept, FakeSession.created = None, []
    yield FakeSession


class _Records(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def warnings_of_runtime() -> Iterator[_Records]:
    """The runtime logger's warnings, caught on the logger itself: a serve run configures the
    ``bertforge`` logger not to propagate, out of caplog's reach."""
    logger, handler = logging.getLogger(runtime.__name__), _Records()
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny QA model directory with a placeholder model.onnx (the fake session never reads it)."""
    out = tmp_path_factory.mktemp("onnx") / "qa"
    torch.manual_seed(0)
    config = BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB),
                                    max_position_embeddings=128, finetuning_task="squad")
    BertForQuestionAnswering(config).save_pretrained(out, tokenizer=BertTokenizer(VOCAB))
    (out / "model.onnx").write_bytes(b"")
    return out


# --- execution_providers ------------------------------------------------------------------------

@pytest.mark.parametrize("ort_cuda", [False, True])
def test_cpu_asks_for_the_cpu_provider_only(monkeypatch, ort_cuda):
    _machine(monkeypatch, ort_cuda=ort_cuda, torch_gpu=True)
    assert execution_providers("cpu") == [CPU_PROVIDER]
    assert execution_providers(torch.device("cpu")) == [CPU_PROVIDER]


def test_cuda_puts_the_cuda_provider_first_then_the_cpu(monkeypatch):
    _machine(monkeypatch, ort_cuda=True, torch_gpu=True)
    assert execution_providers("cuda") == [CUDA_PROVIDER, CPU_PROVIDER]
    assert execution_providers("cuda:1") == [(CUDA_PROVIDER, {"device_id": 1}), CPU_PROVIDER]


def test_cuda_without_the_cuda_provider_is_a_one_line_error(monkeypatch):
    _machine(monkeypatch, ort_cuda=False, torch_gpu=True)
    with pytest.raises(ConfigError) as caught:
        execution_providers("cuda")
    message = str(caught.value)
    assert "\n" not in message
    assert "pip install onnxruntime-gpu" in message and "--device cpu" in message
    assert CUDA_PROVIDER in message


@pytest.mark.parametrize("ort_cuda, torch_gpu", [(True, False), (False, True), (False, False)])
def test_auto_falls_back_to_the_cpu(monkeypatch, ort_cuda, torch_gpu):
    _machine(monkeypatch, ort_cuda=ort_cuda, torch_gpu=torch_gpu)
    assert execution_providers("auto") == [CPU_PROVIDER]


def test_auto_takes_cuda_when_both_torch_and_onnxruntime_can(monkeypatch):
    _machine(monkeypatch, ort_cuda=True, torch_gpu=True)
    assert execution_providers("auto") == [CUDA_PROVIDER, CPU_PROVIDER]


@pytest.mark.parametrize("device", ["tpu", "mps", "cuda:x", ""])
def test_a_device_onnxruntime_cannot_use_is_refused(device):
    with pytest.raises(ConfigError, match="auto, cpu, cuda or cuda:N"):
        execution_providers(device)


# --- the session and the device reported -------------------------------------------------------

def test_the_model_gives_the_session_the_providers_of_its_device(monkeypatch, fake_session,
                                                                 qa_dir):
    _machine(monkeypatch, ort_cuda=True, torch_gpu=True)
    assert OnnxModel(qa_dir).device == torch.device("cpu")  # the Python default stays the CPU
    assert OnnxModel(qa_dir, device="cuda").device == torch.device("cuda")
    assert OnnxModel(qa_dir, device="cuda:1").device == torch.device("cuda", 1)
    assert fake_session.created == [[CPU_PROVIDER], [CUDA_PROVIDER, CPU_PROVIDER],
                                    [(CUDA_PROVIDER, {"device_id": 1}), CPU_PROVIDER]]


def test_cuda_without_the_provider_fails_before_any_session(monkeypatch, fake_session, qa_dir):
    _machine(monkeypatch, ort_cuda=False, torch_gpu=True)
    with pytest.raises(ConfigError, match="onnxruntime-gpu"):
        OnnxModel(qa_dir, device="cuda")
    assert fake_session.created == []


def test_a_session_that_dropped_cuda_reports_cpu_and_warns(monkeypatch, fake_session, qa_dir,
                                                           warnings_of_runtime):
    _machine(monkeypatch, ort_cuda=True, torch_gpu=True)
    fake_session.kept = [CPU_PROVIDER]  # the CUDA libraries failed to load
    model = OnnxModel(qa_dir, device="cuda")
    assert fake_session.created == [[CUDA_PROVIDER, CPU_PROVIDER]]
    assert model.device == torch.device("cpu")
    warned = [r.getMessage() for r in warnings_of_runtime.records]
    assert len(warned) == 1 and CUDA_PROVIDER in warned[0] and "CPU" in warned[0]


def test_serve_reports_cpu_when_onnxruntime_dropped_cuda(monkeypatch, fake_session, qa_dir,
                                                         warnings_of_runtime):
    """The serve loading path: /health shows the pipeline's description, whose device must be
    the session's, not the cuda the user asked for."""
    from bertforge.serve.server import _load

    _machine(monkeypatch, ort_cuda=True, torch_gpu=True)
    fake_session.kept = [CPU_PROVIDER]
    pipeline, extractor = _load(qa_dir, None, "onnx", "cuda", None, True)
    assert extractor is None
    described = pipeline.describe()
    assert described["device"] == "cpu" and described["precision"] == "fp32"
    assert pipeline.device == torch.device("cpu")  # inputs stay on the CPU for onnxruntime
    assert any(CUDA_PROVIDER in r.getMessage() for r in warnings_of_runtime.records)


def test_serve_runs_onnx_on_cuda_without_torch_cuda(monkeypatch, fake_session, qa_dir):
    """onnxruntime-gpu beside a CPU build of torch: the session's device is the pipeline's;
    torch is not asked whether it sees the GPU."""
    from bertforge.serve.server import _load

    _machine(monkeypatch, ort_cuda=True, torch_gpu=False)
    pipeline, _ = _load(qa_dir, None, "onnx", "cuda", None, True)
    assert fake_session.created == [[CUDA_PROVIDER, CPU_PROVIDER]]
    assert pipeline.device == torch.device("cuda") and pipeline.describe()["device"] == "cuda"


def test_serve_refuses_cuda_without_onnxruntime_gpu(monkeypatch, fake_session, qa_dir):
    from bertforge.serve import serve

    _machine(monkeypatch, ort_cuda=False, torch_gpu=True)
    with pytest.raises(ConfigError, match="pip install onnxruntime-gpu"):
        serve(qa_dir, backend="onnx", device="cuda", port=0)
    assert fake_session.created == []


# --- real onnxruntime ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real export of a tiny QA model (about a second)."""
    from bertforge.export import export_onnx

    root = tmp_path_factory.mktemp("real")
    torch.manual_seed(0)
    config = BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB),
                                    max_position_embeddings=128, finetuning_task="squad")
    BertForQuestionAnswering(config).save_pretrained(root / "qa", tokenizer=BertTokenizer(VOCAB))
    export_onnx(root / "qa", root / "export")
    return root / "export"


def test_a_real_session_on_auto_without_a_gpu_runs_and_reports_the_cpu(monkeypatch, export_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ort_session(export_dir / "model.onnx").get_providers() == [CPU_PROVIDER]
    model = OnnxModel(export_dir, device="auto", threads=1)
    assert model.session.get_providers() == [CPU_PROVIDER]
    pipeline = load_pipeline(export_dir, device="auto", backend=model)
    assert pipeline.describe()["device"] == "cpu"
    assert pipeline([pipeline.parse(ITEM)])[0]["answer"]


@pytest.mark.gpu
@pytest.mark.skipif(CUDA_PROVIDER not in ort.get_available_providers()
                    or not torch.cuda.is_available(),
                    reason="needs onnxruntime-gpu and a CUDA GPU")
def test_the_cuda_provider_runs_and_agrees_with_the_cpu(export_dir):
    gpu = OnnxModel(export_dir, device="cuda")
    assert gpu.device.type == "cuda", gpu.session.get_providers()
    assert gpu.session.get_providers()[0] == CUDA_PROVIDER
    cpu = OnnxModel(export_dir, device="cpu")
    ids = torch.randint(5, len(VOCAB), (2, 16))
    for name in ("start_logits", "end_logits"):
        np.testing.assert_allclose(getattr(gpu(ids), name).numpy(),
                                   getattr(cpu(ids), name).numpy(), atol=1e-3)
