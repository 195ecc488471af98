"""ONNX export and serving when something is off: the optional packages are missing, model.onnx is
cut short, config.json was edited to another label count than the graph's, or a client asks an
ONNX server for embeddings. Each is one line (exit 2) or a JSON answer, never a traceback or a
silently wrong model.

One tiny classification model is exported once (TorchScript exporter, about a second); each test
copies the export before damaging it.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bertforge.cli import main
from bertforge.errors import CheckpointError
from serving import save_tiny_classifier

pytest.importorskip("onnxruntime")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"a good film bad boring plot".split()]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("onnx_faults") / "model", VOCAB,
                                id2label={0: "negative", 1: "positive"})


@pytest.fixture(scope="module")
def exported(model_dir: Path) -> Path:
    from bertforge.export import export_onnx

    out = model_dir.parent / "export"
    export_onnx(model_dir, out, exporter="torchscript")
    return out


@pytest.fixture
def export_copy(exported: Path, tmp_path: Path) -> Path:
    out = tmp_path / "export"
    shutil.copytree(exported, out)
    return out


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: "), err
    return err


def test_a_config_with_another_label_count_is_refused_at_load(export_copy: Path) -> None:
    from bertforge.serve.server import _load

    config = json.loads((export_copy / "config.json").read_text())
    config["id2label"] = {"0": "negative", "1": "neutral", "2": "positive"}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (export_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        _load(export_copy, None, "onnx", "cpu", None, True)
    message = str(caught.value)
    assert "\n" not in message
    assert str(export_copy / "model.onnx") in message
    assert str(export_copy / "config.json") in message
    assert "num_labels=2" in message and "num_labels=3" in message
    assert "export the model again" in message


def test_the_untouched_export_still_loads(exported: Path) -> None:
    from bertforge.serve.server import _load

    pipeline, extractor = _load(exported, None, "onnx", "cpu", None, True)
    assert extractor is None
    assert set(pipeline([pipeline.parse({"text": "a good film"})])[0]["scores"]) == {
        "negative", "positive"}


def test_a_truncated_model_onnx_is_one_line_naming_the_file(export_copy: Path, capsys) -> None:
    data = (export_copy / "model.onnx").read_bytes()
    (export_copy / "model.onnx").write_bytes(data[: len(data) // 2])
    assert main(["serve", "--model", str(export_copy), "--backend", "onnx", "--port", "0"]) == 2
    err = one_error_line(capsys)
    assert str(export_copy / "model.onnx") in err and "export the model again" in err


def test_serve_onnx_without_onnxruntime_names_the_extra(exported: Path, capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    assert main(["serve", "--model", str(exported), "--backend", "onnx", "--port", "0"]) == 2
    err = one_error_line(capsys)
    assert "onnxruntime" in err and "pip install 'bertforge[onnx]'" in err


def test_export_without_onnx_names_the_extra(model_dir: Path, tmp_path: Path, capsys,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    out = tmp_path / "export"
    assert main(["export", "onnx", "--model", str(model_dir), "--output", str(out),
                 "--exporter", "torchscript"]) == 2
    err = one_error_line(capsys)
    assert "the onnx package" in err and "pip install 'bertforge[onnx]'" in err
    assert not out.exists()


def test_embeddings_on_the_onnx_backend_are_a_json_404(exported: Path, child_env: dict,
                                                       tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "serve", "--model",
                                 str(exported), "--backend", "onnx", "--port", "0",
                                 "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=stderr,
                                env=child_env)
    try:
        deadline, url = time.monotonic() + 60, None
        while url is None and proc.poll() is None and time.monotonic() < deadline:
            found = re.search(r"listening on (http://\S+)", log.read_text())
            url = found.group(1) if found else time.sleep(0.05)
        assert url, log.read_text()
        response = httpx.post(url + "/v1/embeddings", json={"text": "a good film"}, timeout=30)
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["field"] is None
        assert "not served with the onnx backend" in error["message"]
        assert "--backend torch" in error["message"]
        served = httpx.post(url + "/v1/text-classification", json={"text": "a good film"},
                            timeout=30)
        assert served.status_code == 200, served.text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
