"""The page at ``/`` in a real browser: headless Chromium loads it with the form prefilled from
query parameters and ``submit=1``, the page calls the API, and the DOM it leaves holds the answer
highlighted in the context. No browser driver: ``--dump-dom`` prints the DOM once the page is
idle (``--virtual-time-budget`` lets its fetches finish first). Skipped without a Chromium or
Chrome binary."""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
import torch

from bertforge.models import BertConfig, BertForQuestionAnswering
from bertforge.tokenization import BertTokenizer

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium or chrome binary found")

CONTEXT = "The report was written by Ada in 1843, a long note about engines and music."
QUESTION = "Who wrote the report?"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(
    re.findall(r"\w+|[^\w\s]", (CONTEXT + " " + QUESTION).lower()))]
SERVE = ("import sys; from bertforge.serve import serve; "
         "raise SystemExit(serve(sys.argv[1], port=0))")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("browser")
    torch.manual_seed(0)
    config = BertConfig.from_preset("bert-tiny", vocab_size=len(VOCAB),
                                    max_position_embeddings=128, finetuning_task="squad")
    BertForQuestionAnswering(config).save_pretrained(root / "qa", tokenizer=BertTokenizer(VOCAB))
    log = root / "serve.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, str(root / "qa")],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on (http://\S+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def _dom(url: str, profile: Path) -> str:
    """The DOM of ``url`` after its scripts ran, from headless Chromium."""
    result = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", url],
        capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_page_highlights_the_answer_in_the_context(server: str, tmp_path: Path) -> None:
    expected = httpx.post(server + "/v1/question-answering",
                          json={"question": QUESTION, "context": CONTEXT}).json()
    query = urlencode({"question": QUESTION, "context": CONTEXT, "submit": "1"})
    dom = _dom(f"{server}/?{query}", tmp_path / "profile")
    assert 'data-state="done"' in dom, dom[-3000:]
    assert expected["answer"], expected  # SQuAD v1 (finetuning_task squad): always a span
    marked = re.search(r'<mark id="answer">(.*?)</mark>', dom, re.S)
    assert marked, dom[-3000:]
    assert html.unescape(marked.group(1)) == expected["answer"] == CONTEXT[
        expected["start"]:expected["end"]]
    # The highlight sits inside the whole context, at the answer's offsets.
    shown = re.search(r'<div id="output">.*?<div>(.*?)</div>', dom, re.S)
    assert shown and html.unescape(re.sub(r"<[^>]+>", "", shown.group(1))) == CONTEXT
    before = html.unescape(re.sub(r"<[^>]+>", "", shown.group(1).split("<mark", 1)[0]))
    assert before == CONTEXT[:expected["start"]]


def test_page_reports_an_api_error(server: str, tmp_path: Path) -> None:
    query = urlencode({"question": "", "context": CONTEXT, "submit": "1"})
    dom = _dom(f"{server}/?{query}", tmp_path / "profile")
    error = re.search(r'<div id="error" role="alert">(.*?)</div>', dom, re.S)
    assert error and error.group(1).startswith("422: ") and "question" in error.group(1)
