"""Stop signals sent to a whole process group (Ctrl-C in a terminal, `timeout`, a batch scheduler)
while training runs with DataLoader worker processes: the main process owns shutdown. Workers
ignore the signals, the step finishes, a checkpoint is written and the command exits 0, with no
traceback; under two gloo ranks every rank does so.

Real processes throughout: each command runs in a process group of its own (so ``os.killpg``
reaches it and its workers, as a terminal's Ctrl-C does) and is signalled once its first metrics
line shows it is inside the train loop. A run whose workers are alive when its main process is
SIGKILLed leaves the output lock free at once (only the main process ever holds it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from bertforge.core.io import LOCK_NAME, output_lock
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.commands.train import pretrain
from bertforge.tokenization import BertTokenizer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MRPC = ROOT / "tests" / "assets" / "finetune" / "mrpc.tsv"
# More steps than any run here takes before its signal lands, however fast the machine: the run
# ends only by the signal (a run that could finish first would race it).
STEPS = 100_000
WORKERS = "--data.num_workers=2"
START_S = 180.0  # until the first metrics line: interpreter, torch and workers on a busy machine

NAME = lambda sig: signal.Signals(sig).name  # noqa: E731 (test ids)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Command:
    """A `bertforge` subprocess (its stdout and stderr in files) in the process group ``pgid``,
    or in a new group of its own (as a shell starts a command line)."""
    proc: subprocess.Popen
    stdout: Path
    stderr: Path

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], cwd: Path, name: str,
              pgid: int | None = None) -> "Command":
        out, err = cwd / f"{name}.out", cwd / f"{name}.err"
        with open(out, "w") as so, open(err, "w") as se:
            proc = subprocess.Popen([sys.executable, "-m", "bertforge.cli", *argv], env=env,
                                    cwd=cwd, stdout=so, stderr=se,
                                    process_group=pgid or 0)
        return cls(proc, out, err)

    def wait(self, timeout: float = 180) -> tuple[int, str, str]:
        return self.proc.wait(timeout=timeout), self.stdout.read_text(), self.stderr.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_in_loop(commands: list[Command], metrics: Path) -> None:
    """Until ``metrics`` has a line: the run is inside its train loop (and its workers run)."""
    deadline = time.monotonic() + START_S
    while not (metrics.is_file() and metrics.stat().st_size > 0):
        for c in commands:
            if c.proc.poll() is not None:
                pytest.fail(f"exited with {c.proc.returncode} before its first metrics line: "
                            f"{c.stderr.read_text()[-3000:]}")
        assert time.monotonic() < deadline, "no metrics line in time"
        time.sleep(0.01)


def workers_of(proc: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(proc.pid).children(recursive=True)


def assert_stopped_with_a_checkpoint(code: int, stdout: str, stderr: str, out: Path) -> int:
    """The run ended by its own preemption path: exit 0, one complete checkpoint, no traceback.
    Returns the step it stopped at."""
    assert code == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "stopped for preemption" in stdout, stderr[-3000:]
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert len(checkpoints) == 1 and (checkpoints[0] / "COMPLETE").is_file(), checkpoints
    step = json.loads((checkpoints[0] / "training_state" / "meta.json").read_text())["step"]
    assert 1 <= step < STEPS
    return step


def checkpoint_weights(result) -> bytes:
    return (result.final_checkpoint / "model.safetensors").read_bytes()


# No warm-up: over STEPS steps the default one would keep the rate near zero for every step
# these runs take, and the resume comparison would compare weights that barely moved.
RUN = (f"--train.max_steps={STEPS}", "--optim.warmup=0")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=NAME)
def test_a_signal_to_the_process_group_checkpoints_and_exits_zero(
        sig: signal.Signals, tiny_args, tiny_config, child_env, stop_after, monkeypatch,
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = Command.start(["pretrain", *tiny_args(out, *RUN, WORKERS)], child_env, tmp_path,
                        "pretrain")
    try:
        wait_in_loop([run], out / "metrics.jsonl")
        assert len(workers_of(run.proc)) >= 2  # the DataLoader workers are alive
        os.killpg(run.proc.pid, sig)
        code, stdout, stderr = run.wait()
    finally:
        run.kill()
    stopped_at = assert_stopped_with_a_checkpoint(code, stdout, stderr, out)
    if sig == signal.SIGINT:
        # The checkpoint resumes as the uninterrupted run goes on: four more steps from it give
        # the weights of one run of stopped_at + 4 steps (both stopped there by the stand-in
        # flag, so neither has to run all STEPS).
        from bertforge.train import loop

        monkeypatch.setattr(loop, "PreemptionFlag", stop_after(4))
        resumed = pretrain(tiny_config(out, *RUN))
        monkeypatch.setattr(loop, "PreemptionFlag", stop_after(stopped_at + 4))
        straight = pretrain(tiny_config(tmp_path / "straight", *RUN))
        assert resumed.step == straight.step == stopped_at + 4
        assert checkpoint_weights(resumed) == checkpoint_weights(straight)


# `bertforge pretrain` whose step HANG_AT never gets its first micro-batch, as a DataLoader
# stuck for good leaves it (a hung file system, a deadlocked worker): the main process waits
# inside the step until the file argv[1] appears, after writing argv[2] when it starts waiting.
# argv[3]: the Ctrl-C window to use ("" keeps the loop's own); argv[4]: the step that hangs, of
# two micro-batches each; the rest: the command line.
HANG_SCRIPT = r"""
import sys, time
from pathlib import Path
import bertforge.train.loop as loop
from bertforge.cli import main

release, waiting, window = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if window:
    loop.SIGINT_AGAIN_S = float(window)
first_of_step = 2 * (int(sys.argv[4]) - 1) + 1
real, calls = loop.to_device, []

def to_device(batch, device):
    calls.append(1)
    if len(calls) == first_of_step:
        waiting.write_text("waiting")
        while not release.exists():
            time.sleep(0.01)
    return real(batch, device)

loop.to_device = to_device
sys.exit(main(sys.argv[5:]))
"""
HANG_AT = 5
INTERRUPTED = "interrupted: a second Ctrl-C stopped the run at once"
SAID_ONCE = "press Ctrl-C again (after"


@dataclass
class HungRun:
    command: Command
    out: Path
    release: Path
    waiting: Path

    def wait_for(self, path: Path, text: str = "") -> None:
        """Until ``path`` exists (and holds ``text``), failing if the run ends first."""
        deadline = time.monotonic() + START_S
        while not (path.is_file() and text in path.read_text()):
            if self.command.proc.poll() is not None:
                pytest.fail(f"exited with {self.command.proc.returncode}: "
                            f"{self.command.stderr.read_text()[-3000:]}")
            assert time.monotonic() < deadline, f"{path} did not show {text!r} in time"
            time.sleep(0.01)


@pytest.fixture
def hung_run(tiny_args, child_env, tmp_path: Path):
    """Start a pretraining run (checkpoints every 2 steps) that hangs in step HANG_AT; the
    fixture's argument is the Ctrl-C window ("" for the loop's own)."""
    runs: list[HungRun] = []

    def start(window: str) -> HungRun:
        out, release, waiting = tmp_path / "run", tmp_path / "release", tmp_path / "waiting"
        argv = ["pretrain", *tiny_args(out, *RUN, "--train.global_batch_size=8",
                                       "--train.micro_batch_size=4", "--checkpoint.every=2")]
        err, so = tmp_path / "hung.err", tmp_path / "hung.out"
        with open(so, "w") as stdout, open(err, "w") as stderr:
            proc = subprocess.Popen([sys.executable, "-c", HANG_SCRIPT, str(release),
                                     str(waiting), window, str(HANG_AT), *argv],
                                    env=child_env, cwd=tmp_path,
                                    stdout=stdout, stderr=stderr, process_group=0)
        runs.append(HungRun(Command(proc, so, err), out, release, waiting))
        runs[-1].wait_for(waiting)  # inside step HANG_AT, its batch not coming
        return runs[-1]

    yield start
    for run in runs:
        run.command.kill()


def complete_checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*") if (p / "COMPLETE").is_file())


def test_a_second_ctrl_c_some_seconds_later_stops_a_hung_step_at_once(hung_run) -> None:
    """A step that never ends (here its batch never comes) still gives the terminal back: the
    first Ctrl-C asks for a checkpoint after the step and says how to stop at once; one more,
    a few seconds later, stops the run there: exit 130, one line, no traceback, the checkpoints
    written before whole and nothing of the unfinished step written."""
    from bertforge.core.io import LOCK_NAME, output_lock
    from bertforge.train.loop import SIGINT_AGAIN_S

    run = hung_run("")
    before = complete_checkpoints(run.out)
    assert before == ["checkpoint-2", "checkpoint-4"], before
    os.kill(run.command.proc.pid, signal.SIGINT)
    run.wait_for(run.command.stderr, SAID_ONCE)  # the handler ran: the window starts
    time.sleep(SIGINT_AGAIN_S + 0.5)  # the behaviour under test is "seconds later"
    assert run.command.proc.poll() is None  # the first Ctrl-C alone waits for the step
    os.kill(run.command.proc.pid, signal.SIGINT)
    code, _, stderr = run.command.wait(timeout=120)
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.count(SAID_ONCE) == 1, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("interrupted")] == [
        next(line for line in stderr.splitlines() if line.startswith(INTERRUPTED))]
    assert complete_checkpoints(run.out) == before
    assert sorted(p.name for p in run.out.iterdir() if p.name.startswith("checkpoint")) == before
    with output_lock(run.out, "output_dir", "bertforge pretrain"):  # released on the way out
        assert json.loads((run.out / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_ctrl_c_repeated_at_once_still_saves_after_the_step(hung_run) -> None:
    """Two SIGINTs together (a terminal's and torchrun's forwarded one) are one request: the
    step finishes when its batch comes, a checkpoint is saved, exit 0. The window is made long
    here so that a slow machine cannot stretch "together" past it."""
    run = hung_run("600")
    os.kill(run.command.proc.pid, signal.SIGINT)
    run.wait_for(run.command.stderr, SAID_ONCE)
    os.kill(run.command.proc.pid, signal.SIGINT)
    run.release.write_text("go")
    code, stdout, stderr = run.command.wait()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert "stopped for preemption" in stdout and stderr.count(SAID_ONCE) == 1, stderr[-3000:]
    assert complete_checkpoints(run.out) == ["checkpoint-2", "checkpoint-4",
                                             f"checkpoint-{HANG_AT}"]


@pytest.fixture(scope="module")
def tiny_bert(tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("stop_signals_bert")
    tokenizer = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    return BertForPreTraining(config).save_pretrained(directory, tokenizer=tokenizer)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=NAME)
def test_fine_tuning_stopped_by_a_signal_to_its_group_checkpoints(
        sig: signal.Signals, tiny_bert: Path, child_env, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = Command.start(["finetune", "--task=glue", "--data.task_name=mrpc",
                         f"--model={tiny_bert}", f"--data.train={MRPC}", f"--output_dir={out}",
                         f"--train.max_steps={STEPS}", "--train.global_batch_size=4",
                         "--train.micro_batch_size=2", "--train.log_every=1",
                         "--precision=fp32", "--tensorboard=false"], child_env, tmp_path,
                        "finetune")
    try:
        wait_in_loop([run], out / "metrics.jsonl")
        os.killpg(run.proc.pid, sig)
        code, stdout, stderr = run.wait()
    finally:
        run.kill()
    assert_stopped_with_a_checkpoint(code, stdout, stderr, out)


def test_a_stop_during_fine_tuning_seeds_ends_the_command(tiny_bert: Path, child_env,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    run = Command.start(["finetune", "--task=glue", "--data.task_name=mrpc",
                         f"--model={tiny_bert}", f"--data.train={MRPC}",
                         f"--data.validation={MRPC}", f"--output_dir={out}", "--seeds", "1,2",
                         f"--train.max_steps={STEPS}", "--train.global_batch_size=4",
                         "--train.micro_batch_size=2", "--train.log_every=1",
                         "--precision=fp32", "--tensorboard=false"], child_env, tmp_path,
                        "finetune")
    try:
        wait_in_loop([run], out / "seed-1" / "metrics.jsonl")
        os.killpg(run.proc.pid, signal.SIGTERM)
        code, stdout, stderr = run.wait()
    finally:
        run.kill()
    assert_stopped_with_a_checkpoint(code, stdout, stderr, out / "seed-1")
    assert "seeds: stopped during seed 1" in stdout
    assert not (out / "seed-2").exists() and not (out / "seeds.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=NAME)
def test_two_ranks_signalled_as_a_group_both_stop_cleanly(
        sig: signal.Signals, tiny_args, child_env, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = tiny_args(out, f"--train.max_steps={STEPS}", WORKERS, "--train.dist_timeout_s=60")
    port, ranks = free_port(), []
    try:
        for rank in (0, 1):
            env = {**child_env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            ranks.append(Command.start(["pretrain", *args], env, tmp_path, f"rank{rank}",
                                       pgid=ranks[0].proc.pid if ranks else None))
        wait_in_loop(ranks, out / "metrics.jsonl")
        os.killpg(ranks[0].proc.pid, sig)
        results = [r.wait() for r in ranks]
    finally:
        for r in ranks:
            r.kill()
    for code, _, stderr in results:
        assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert_stopped_with_a_checkpoint(*results[0], out)


def test_workers_of_a_killed_run_do_not_keep_its_lock(tiny_args, child_env,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = Command.start(["pretrain", *tiny_args(out, "--train.max_steps=100000", WORKERS)],
                        child_env, tmp_path, "pretrain")
    workers: list[psutil.Process] = []
    try:
        wait_in_loop([run], out / "metrics.jsonl")
        workers = workers_of(run.proc)
        assert len(workers) >= 2
        for w in workers:  # as if they had not yet noticed that their parent is gone
            w.suspend()
        run.proc.kill()
        run.proc.wait()
        assert any(w.is_running() for w in workers)
        with output_lock(out, "output_dir", "bertforge pretrain"):  # at once, not a refusal
            assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        for w in workers:
            with suppress(psutil.Error):
                w.kill()
        run.kill()


# A DataLoader worker paused right after torch set its own signal handlers and before the
# loader's worker_init_fn runs, the group signalled then: the worker must survive (the signal
# waits, blocked, and is then ignored) and the main process must still get the signal.
WINDOW_SCRIPT = r"""
import json, os, signal, sys, threading
import torch
import torch.utils.data._utils.signal_handling as handling
from bertforge.data.loader import PretrainingLoader

sig = signal.Signals[sys.argv[1]]
forked_r, forked_w = os.pipe()
go_r, go_w = os.pipe()
real = handling._set_worker_signal_handlers

def paused(*args):
    real(*args)
    os.write(forked_w, b"x")
    os.read(go_r, 1)

handling._set_worker_signal_handlers = paused
got = []
signal.signal(sig, lambda signum, frame: got.append(signum))  # as the train loop's flag does

def signal_the_group():
    os.read(forked_r, 1)
    os.killpg(0, sig)
    os.write(go_w, b"x")

class Data:
    lengths = [4] * 8
    fingerprint = "eight"
    def __len__(self):
        return 8
    def __getitem__(self, key):
        return {"indices": torch.as_tensor(key[1])}

threading.Thread(target=signal_the_group, daemon=True).start()
loader = PretrainingLoader(Data(), global_batch_size=4, micro_batch_size=4, num_workers=1,
                           make_batch=Data())
batch = next(iter(loader))
print(json.dumps({"main_got": got, "batch": batch["indices"].tolist()}))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=NAME)
def test_a_signal_while_a_worker_starts_reaches_only_the_main_process(
        sig: signal.Signals, child_env, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", WINDOW_SCRIPT, sig.name], env=child_env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          process_group=0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["main_got"] == [int(sig)] and len(result["batch"]) == 4
