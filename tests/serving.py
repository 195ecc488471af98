"""What the serving tests share: a tiny classifier saved as a model directory, and an app served
in this process by uvicorn as ``bertforge serve`` configures it, for real HTTP requests."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from bertforge.models import BertConfig, BertForSequenceClassification
from bertforge.serve.server import uvicorn_config
from bertforge.serve.settings import ServeSettings
from bertforge.tokenization import BertTokenizer


def save_tiny_classifier(root: Path, vocab: Sequence[str], **config: Any) -> Path:
    """A seeded 2-label bert-tiny text classifier with a WordPiece tokenizer of ``vocab``, saved
    in ``root``; ``config`` adds to (or overrides) its config.json fields."""
    torch.manual_seed(0)
    fields = dict(vocab_size=len(vocab), max_position_embeddings=64, num_labels=2,
                  finetuning_task="classification", **config)
    model = BertForSequenceClassification(BertConfig.from_preset("bert-tiny", **fields))
    model.save_pretrained(root, tokenizer=BertTokenizer(list(vocab)))
    return root


@contextmanager
def running(app: Any, settings: ServeSettings) -> Iterator[str]:
    """``app`` served on a free port; yields the base URL, stops the server after."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn_config(app, settings, "critical", configure_logging=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
