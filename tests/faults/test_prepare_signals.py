"""Fault injection: `bertforge prepare --workers 2` ended by a signal in the middle of a run.

Real processes throughout: the command runs as a subprocess on a corpus of many chunks, and
psutil records its children (the two pool workers and the multiprocessing resource tracker) once
a first shard is written. SIGKILL of the main process must take all of them down (workers watch
their parent); SIGTERM must end the run cleanly (exit 143, a message, finished shards kept, no
temporary file, no child left), and the same command must then resume to the very bytes of an
uninterrupted run; a worker killed as the OOM killer would must end the run with an error, not
hang it.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import string
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import psutil
import pytest

from bertforge.core.io import TMP_MARK

pytestmark = pytest.mark.slow

CHUNK_DOCS = 2048  # prepare's docs_per_shard: the CLI has no flag for it
CHUNKS = 20  # ~3 s with two workers: still running well after the first shard is written
GONE_WITHIN_S = 15.0  # workers poll for their parent every 0.5 s; slack for a loaded machine
STARTUP_S = 60.0  # until the first shard: interpreter and worker start-up on a busy machine
WORDS = ("the cat dog sat on mat ran fast slow big small red blue green house tree car road river "
         "sky sun moon star light dark old new good bad happy sad").split()
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # three busy processes share a small machine


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``CHUNKS * CHUNK_DOCS`` documents of three sentences (~4 MB) and a vocab covering them."""
    root = tmp_path_factory.mktemp("signals")
    letters = list(string.ascii_lowercase)
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *letters,
                                *("##" + c for c in letters), *WORDS]) + "\n")
    rng = random.Random(0)
    docs = ("\n".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) + "." for _ in range(3))
            for _ in range(CHUNKS * CHUNK_DOCS))
    text = root / "corpus.txt"
    text.write_text("\n\n".join(docs) + "\n")
    return {"text": text, "vocab": vocab}


def command(corpus: dict[str, Path], out: Path) -> list[str]:
    return [sys.executable, "-m", "bertforge.cli", "prepare", "--input", str(corpus["text"]),
            "--input-format", "sentences", "--vocab", str(corpus["vocab"]), "--output", str(out),
            "--workers", "2"]


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@dataclass
class Run:
    """A `bertforge prepare` subprocess writing to ``out``, its stderr in a file (a pipe nobody
    reads could fill up and stall it), and its children once :meth:`wait_until_working` saw them."""

    proc: subprocess.Popen
    out: Path
    stderr: Path
    children: list[psutil.Process] = field(default_factory=list)

    def wait_until_working(self) -> list[psutil.Process]:
        """Wait for both workers, the resource tracker and a finished chunk (a train shard, its
        last file), so the workers are past their start-up and busy; return the children."""
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prepare ended early:\n{self.stderr.read_text()}"
            self.children = psutil.Process(self.proc.pid).children(recursive=True)
            kinds = [_kind(p) for p in self.children]
            if (kinds.count("worker") == 2 and "tracker" in kinds
                    and any((self.out / "train").glob("shard-*"))):
                return self.children
            time.sleep(0.05)
        raise AssertionError(f"no worker finished a chunk in {STARTUP_S} s: {self.children}")


def _kind(proc: psutil.Process) -> str:
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:  # it ended meanwhile
        return "gone"
    return "tracker" if "resource_tracker" in line else "worker" if "spawn_main" in line else "?"


def _alive(proc: psutil.Process) -> bool:
    try:  # an orphan's adoptive parent may be slow to reap it: a zombie has ended
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(procs: list[psutil.Process], within: float = GONE_WITHIN_S) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while (alive := [p for p in procs if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _sigint_default() -> None:
    """SIGINT as a terminal's command line gets it. A suite started in the background by a
    non-interactive shell (``nohup make test &``) runs with SIGINT ignored, which its children
    inherit, and Python then keeps ignoring it instead of raising KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def start(corpus: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """``start(name)`` launches prepare into ``tmp_path/name``. Whatever a test asserts, every
    process it started, and every child seen, is killed afterwards: none outlives the test."""
    runs: list[Run] = []

    def launch(name: str, group: bool = False) -> Run:
        """``group``: in a process group of its own, as a shell starts a command line."""
        stderr = tmp_path / f"{name}.stderr"
        with stderr.open("w") as err:
            proc = subprocess.Popen(command(corpus, tmp_path / name), stdout=subprocess.DEVNULL,
                                    stderr=err, env=ENV, process_group=0 if group else None,
                                    preexec_fn=_sigint_default)
        runs.append(Run(proc, tmp_path / name, stderr))
        return runs[-1]

    yield launch
    for run in runs:
        if run.proc.poll() is None:  # not reaped yet, so its pid is still its own
            run.children += psutil.Process(run.proc.pid).children(recursive=True)
            run.proc.kill()
            run.proc.wait()
        for proc in survivors(run.children, within=0):
            with suppress(psutil.NoSuchProcess):
                proc.kill()


def test_sigkill_of_prepare_takes_its_workers_and_resource_tracker_down(
        start: Callable[[str], Run]) -> None:
    run = start("out")
    children = run.wait_until_working()
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait()
    assert survivors(children) == []


def test_sigterm_stops_prepare_cleanly_and_the_same_command_resumes(
        start: Callable[[str], Run], corpus: dict[str, Path], tmp_path: Path) -> None:
    reference = subprocess.run(command(corpus, tmp_path / "ref"), env=ENV, capture_output=True,
                               text=True, timeout=120)
    assert reference.returncode == 0, reference.stderr

    run = start("out")
    children = run.wait_until_working()
    run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=60) == 128 + signal.SIGTERM
    stderr = run.stderr.read_text()
    assert ("prepare: stopped by SIGTERM; finished shards are kept, run the same command to "
            "resume") in stderr
    assert "stopped by SIGTERM" in stderr.splitlines()  # the CLI's own line
    assert survivors(children) == []
    assert not (run.out / "manifest.json").exists()
    assert list(run.out.rglob(f"*{TMP_MARK}*")) == []

    again = subprocess.run(command(corpus, run.out), env=ENV, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert "done by an earlier run" in again.stdout  # the stopped run's shards were kept
    assert digests(run.out) == digests(tmp_path / "ref")


def test_a_killed_worker_ends_prepare_with_an_error_not_a_hang(
        start: Callable[[str], Run]) -> None:
    run = start("out")
    children = run.wait_until_working()
    next(p for p in children if _kind(p) == "worker").kill()  # as the OOM killer would
    assert run.proc.wait(timeout=60) == 2
    assert "error: a prepare worker process died" in run.stderr.read_text()
    assert survivors(children) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1],
                         ids=lambda sig: signal.Signals(sig).name)
def test_a_signal_to_the_whole_group_reaches_only_the_main_process(
        sig: signal.Signals, start: Callable[..., Run]) -> None:
    # Ctrl-C in a terminal, `timeout` or a scheduler signal every process of the group: the
    # workers and the resource tracker ignore it, the main process stops the run cleanly.
    run = start("out", group=True)
    children = run.wait_until_working()
    os.killpg(run.proc.pid, sig)
    assert run.proc.wait(timeout=60) == 128 + sig
    stderr = run.stderr.read_text()
    why = "interrupted" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
    assert f"prepare: {why}; finished shards are kept" in stderr and "Traceback" not in stderr
    assert "resource_tracker" not in stderr, stderr  # it did not die and complain
    assert survivors(children) == []
    assert list(run.out.rglob(f"*{TMP_MARK}*")) == []
