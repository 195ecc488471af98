"""The command line end to end: `bertforge export onnx` writes a parity-checked export (int8 and
Triton included), and `bertforge serve --backend onnx` serves it over HTTP with the answers of the
PyTorch pipeline; SIGTERM ends the server with status 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.inference.pipelines import load_pipeline
from bertforge.models import BertConfig, BertForQuestionAnswering
from bertforge.tokenization import BertTokenizer

httpx = pytest.importorskip("httpx")
pytest.importorskip("onnxruntime")

WORDS = "the report was written by ada in 1843 . who wrote when did she it london note".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS)]
ITEM = {"question": "who wrote the report ?", "context": "the report was written by ada in 1843 ."}


@pytest.fixture(scope="module")
def qa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "qa"
    torch.manual_seed(0)
    config = BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB),
                                    max_position_embeddings=128, finetuning_task="squad")
    BertForQuestionAnswering(config).save_pretrained(out, tokenizer=BertTokenizer(VOCAB))
    return out


def test_export_then_serve_the_onnx_model(tmp_path, qa_model, capsys):
    export = tmp_path / "export"
    sample = tmp_path / "sample.tsv"
    sample.write_text(f"{ITEM['question']}\t{ITEM['context']}\n")
    assert main(["export", "onnx", "--model", str(qa_model), "--output", str(export),
                 "--quantize", "int8", "--sample", str(sample), "--triton"]) == 0
    printed = capsys.readouterr().out
    assert "parity" in printed.lower()
    for name in ("model.onnx", "model.int8.onnx", "export.json", "vocab.txt", "config.json"):
        assert (export / name).is_file(), name
    assert list((export / "triton").glob("*/config.pbtxt"))
    assert main(["export", "onnx", "--model", str(qa_model), "--output", str(export)]) == 2
    assert "error:" in capsys.readouterr().err  # a non-empty output is refused

    want = load_pipeline(qa_model)([load_pipeline(qa_model).parse(ITEM)])[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "serve.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "serve", "--model",
                                 str(export), "--backend", "onnx", "--port", "0"],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"listening on (http://\S+)", log.read_text())
            url = found.group(1) if found else None
            time.sleep(0.05)
        assert url, log.read_text()
        with httpx.Client(base_url=url, timeout=30) as client:
            served = client.get("/health").json()["endpoints"]["/v1/question-answering"]
            assert served["model"]["backend"] != "pytorch"
            got = client.post("/v1/question-answering", json=ITEM)
        assert got.status_code == 200, got.text
        answer = got.json()
        assert (answer["answer"], answer["start"], answer["end"]) == (
            want["answer"], want["start"], want["end"])
        assert answer["score"] == pytest.approx(want["score"], abs=1e-4)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert json.loads((export / "export.json").read_text())["parity"]
