"""What the serving tests share: a tiny classifier saved as a model directory, an app served in
this process by uvicorn as ``bertforge serve`` configures it, for real HTTP requests, and
``serve`` itself in a child process (:class:`ServeProcess`), for real signals and replicas."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import psutil
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


LAUNCH = ("import json, sys; from bertforge.serve import serve; "
          "raise SystemExit(serve(sys.argv[1], port=0, **json.loads(sys.argv[2])))")
GONE_WITHIN_S = 15.0


class ServeProcess:
    """``serve(model, port=0, **options)`` in a child process; ``url`` once it listens (read
    from its ``listening on`` line), its stderr in ``log``. ``prelude``: Python run in the
    child first (a test's wrapper around the loaded pipelines). ``group``: in a process group of
    its own, as a shell starts a command (``os.killpg(proc.pid, ...)`` then signals it and its
    replicas together, as Ctrl-C or a scheduler does). ``env``: environment variables added to
    the child's."""

    def __init__(self, model: Path, log: Path, prelude: str = "", group: bool = False,
                 env: dict[str, str] | None = None, **options: Any) -> None:
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-c", f"{prelude}\n{LAUNCH}",
                                          str(model), json.dumps(options)],
                                         stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                         start_new_session=group)
        self.url = ""

    def wait_ready(self, timeout: float = 120.0) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"listening on (http://\S+)", self.log.read_text())
            if found:
                self.url = found.group(1)
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"the server did not start:\n{self.log.read_text()}")

    def family(self) -> list[Any]:
        """The server's descendants (psutil processes): its replicas and multiprocessing's
        resource tracker."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for child in self.family():
                child.kill()
            self.proc.kill()
            raise


def alive(proc: Any) -> bool:
    """Whether a psutil process still runs (a zombie has ended: an orphan's adoptive parent may
    be slow to reap it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(procs: list[Any], within: float = GONE_WITHIN_S) -> list[Any]:
    """Those of ``procs`` still running after at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while (running_ := [p for p in procs if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running_


def stop_cleanly(server: ServeProcess) -> None:
    """SIGTERM: exit status 0 and no replica (or other child) left running."""
    family = server.family()
    assert server.stop() == 0, server.log.read_text()
    assert survivors(family) == [], server.log.read_text()
