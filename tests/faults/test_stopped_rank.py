"""A rank that stops answering (SIGSTOP: a hung process, a frozen node) does not hang the job: the
live rank gives up after ``train.dist_timeout_s`` and exits non-zero with one line naming the
unresponsive rank. Two real gloo processes, started the way torchrun starts them (RANK,
WORLD_SIZE, MASTER_ADDR/PORT in the environment)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT_S = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_within_the_timeout(tiny_args, child_env,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = tiny_args(out, "--train.max_steps=100000", "--checkpoint.every=100000",
                     f"--train.dist_timeout_s={TIMEOUT_S}", "--train.micro_batch_size=4",
                     "--train.global_batch_size=8")
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**child_env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        log = open(tmp_path / f"rank{rank}.err", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", "bertforge.cli", "pretrain", *args],
                                      env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                      stderr=log))
        log.close()
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").stat().st_size:
            assert time.monotonic() < deadline, "training never started"
            assert all(p.poll() is None for p in procs), "a rank exited early"
            time.sleep(0.2)
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        code = procs[0].wait(timeout=TIMEOUT_S + 60)
        waited = time.monotonic() - stopped
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # SIGKILL ends a stopped process too
                p.wait()
    err = (tmp_path / "rank0.err").read_text()
    last = err.strip().splitlines()[-1]
    assert code == 1, err[-3000:]
    assert last.startswith("error: rank 0: rank 1 stopped responding: a collective waited up "
                           f"to {TIMEOUT_S} s (train.dist_timeout_s)"), last
    assert "Traceback" not in err
    assert waited < TIMEOUT_S + 30  # not the 30 minutes of torch's old default
