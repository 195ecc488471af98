"""How a run learns its place among the ranks; how the SLURM job script launches and requeues it.

``init_distributed`` reads torchrun's variables, else srun's (only inside a job step), else runs
alone; the process group itself is replaced by a recorder, so no test here starts one (but the
last of them: two real gloo processes that meet through srun's variables alone).

``scripts/pretrain.sbatch`` runs under bash with fake ``srun``, ``torchrun``, ``python``,
``scontrol`` and ``scancel`` first on PATH: each appends what it was asked to a log. The fake
task sleeps until told to stop; the fake srun, like SLURM's, answers SIGTERM to itself with
SIGKILL to its task, so a script that signalled srun instead of the step would fail here.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bertforge.errors import ConfigError
from bertforge.train.distributed import init_distributed

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "scripts" / "pretrain.sbatch"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
               "SLURM_LOCALID", "SLURM_STEP_ID", "SLURM_STEPID", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """No launcher variable set; ``init_process_group`` records its calls (returned) instead of
    starting a group. setenv before delenv: monkeypatch then restores even a variable that was
    unset, which matters because init_distributed itself exports RANK and friends."""
    for name in LAUNCH_VARS:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    calls: list[dict] = []

    def record(**kwargs) -> None:
        calls.append({**kwargs, "env": {k: os.environ.get(k) for k in LAUNCH_VARS}})

    monkeypatch.setattr(dist, "init_process_group", record)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    return calls


def _setenv(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


SRUN_TASK = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_STEP_ID": "0"}
MASTER = {"MASTER_ADDR": "gpu-node01", "MASTER_PORT": "29500"}


def test_torchrun_variables_win_over_slurm(launch_env, monkeypatch) -> None:
    # srun torchrun: SLURM_PROCID numbers the node's torchrun task, not this worker.
    _setenv(monkeypatch, **SRUN_TASK, **MASTER, RANK="3", WORLD_SIZE="16", LOCAL_RANK="3")
    info = init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.local_rank) == (3, 16, 3)
    assert info.device == torch.device("cpu")
    [call] = launch_env
    assert call["backend"] == "gloo"
    assert call["env"]["RANK"] == "3" and call["env"]["WORLD_SIZE"] == "16"


@pytest.mark.parametrize("step_var", ["SLURM_STEP_ID", "SLURM_STEPID"])
def test_srun_task_gives_rank_and_exports_it_for_env_rendezvous(launch_env, monkeypatch, caplog,
                                                                step_var) -> None:
    task = {**SRUN_TASK}
    del task["SLURM_STEP_ID"]
    _setenv(monkeypatch, **task, **MASTER, **{step_var: "2"})
    with caplog.at_level(logging.INFO, logger="bertforge.train.distributed"):
        info = init_distributed(device="cpu", timeout_s=42)
    assert (info.rank, info.world_size, info.local_rank) == (5, 8, 1)
    assert info.timeout_s == 42
    [call] = launch_env
    assert call["backend"] == "gloo" and call["timeout"].total_seconds() == 42
    # What env:// reads, in place when the group is created.
    assert {k: call["env"][k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")} == \
        {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert "launcher: srun; rank 5 of 8, local rank 1" in caplog.text


def test_srun_task_picks_its_gpu_by_local_id(launch_env, monkeypatch) -> None:
    # No GPU is touched: set_device and the process group are recorders.
    picked: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "set_device", picked.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    _setenv(monkeypatch, **SRUN_TASK, **MASTER)
    info = init_distributed(device="cuda")
    assert info.device == torch.device("cuda", 1) and picked == [info.device]
    assert launch_env[0]["backend"] == "nccl"
    # --gpus-per-task / --gpu-bind: each task sees only its own GPU, as cuda:0. (Also a second
    # run in the same process, which finds the RANK etc. that the first one exported.)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert init_distributed(device="cuda").device == torch.device("cuda", 0)


def test_batch_step_slurm_variables_mean_one_process(launch_env, monkeypatch, caplog) -> None:
    # The batch script's own shell: SLURM_PROCID=0 and the job's task count, but no job step.
    _setenv(monkeypatch, SLURM_PROCID="0", SLURM_NTASKS="16", SLURM_LOCALID="0")
    with caplog.at_level(logging.INFO, logger="bertforge.train.distributed"):
        info = init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.local_rank) == (0, 1, 0)
    assert not info.distributed and launch_env == []
    assert os.environ.get("RANK") is None
    assert "no job step" in caplog.text


def test_no_launcher_is_one_process(launch_env) -> None:
    info = init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.local_rank) == (0, 1, 0) and launch_env == []


@pytest.mark.parametrize("missing", [("MASTER_ADDR",), ("MASTER_PORT",),
                                     ("MASTER_ADDR", "MASTER_PORT")])
def test_srun_without_master_address_is_a_one_line_error(launch_env, monkeypatch,
                                                         missing) -> None:
    _setenv(monkeypatch, **SRUN_TASK, **{k: v for k, v in MASTER.items() if k not in missing})
    with pytest.raises(ConfigError) as err:
        init_distributed(device="cpu")
    message = str(err.value)
    assert "\n" not in message and all(name in message for name in missing)
    assert "export MASTER_ADDR" in message and "scontrol show hostnames" in message
    assert launch_env == [] and os.environ.get("RANK") is None


def test_srun_with_one_task_needs_no_master_address(launch_env, monkeypatch) -> None:
    _setenv(monkeypatch, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0",
            SLURM_STEP_ID="7")
    info = init_distributed(device="cpu")
    assert (info.rank, info.world_size) == (0, 1) and launch_env == []


@pytest.mark.parametrize("values, named", [
    ({"SLURM_PROCID": "one"}, "SLURM_PROCID='one'"),
    ({"SLURM_PROCID": "8"}, "rank 8 of 8"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "rank 0 of 0"),
])
def test_bad_launcher_values_are_one_line_errors(launch_env, monkeypatch, values, named) -> None:
    _setenv(monkeypatch, **{**SRUN_TASK, **MASTER, **values})
    with pytest.raises(ConfigError, match=named) as err:
        init_distributed(device="cpu")
    assert "\n" not in str(err.value) and launch_env == []


# ---- scripts/pretrain.sbatch under fake SLURM commands ----

FAKES = {
    # Options up to the command; the task runs as srun's child. SIGTERM to srun itself kills
    # the task with SIGKILL, as SLURM's srun does ("forcing job termination").
    "srun": """\
printf 'srun %s\\n' "$*" >> "$FAKE_LOG"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
"$@" &
task=$!
trap 'echo "srun got SIGTERM" >> "$FAKE_LOG"; kill -KILL $task' TERM
until status=0; wait $task || status=$?; ! kill -0 $task 2>/dev/null; do :; done
exit $status
""",
    # The training process: sleeps FAKE_TASK_S, exits FAKE_TASK_RC; SIGTERM ends it with 0 after
    # a moment (a checkpoint saved at the next step boundary), which the script must wait for.
    "task": """\
printf '%s %s\\n' "${0##*/}" "$*" >> "$FAKE_LOG"
echo "task env MASTER_ADDR=${MASTER_ADDR-} MASTER_PORT=${MASTER_PORT-}" >> "$FAKE_LOG"
echo $$ > "$FAKE_DIR/task.pid"
sleep "${FAKE_TASK_S:-0}" &
nap=$!
trap 'kill $nap; echo "task got SIGTERM" >> "$FAKE_LOG"; sleep 0.3
      echo "task saved a checkpoint" >> "$FAKE_LOG"; exit 0' TERM
echo "task started" >> "$FAKE_LOG"
wait $nap
echo "task finished" >> "$FAKE_LOG"
exit "${FAKE_TASK_RC:-0}"
""",
    "scontrol": """\
printf 'scontrol %s\\n' "$*" >> "$FAKE_LOG"
if [ "$1 $2" = "show hostnames" ]; then printf 'gpu-node01\\ngpu-node02\\n'; fi
""",
    # SLURM signals every process of the job's steps: here, the one fake task.
    "scancel": """\
printf 'scancel %s\\n' "$*" >> "$FAKE_LOG"
case "$1" in --signal=*) kill -s "${1#--signal=}" "$(cat "$FAKE_DIR/task.pid")" ;; esac
""",
}


class Job:
    """One run of the job script under the fake commands; ``log()`` is what they were asked."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name, body in {**FAKES, "torchrun": FAKES["task"], "python": FAKES["task"]}.items():
            if name != "task":
                (bin_dir / name).write_text("#!/bin/bash\n" + body)
                (bin_dir / name).chmod(0o755)
        self.log_path = tmp_path / "fake.log"
        self.log_path.touch()
        self.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(self.log_path),
                    "FAKE_DIR": str(tmp_path), "SLURM_JOB_ID": "4242",
                    "SLURM_JOB_NODELIST": "gpu-node[01-02]", "SLURM_NNODES": "2",
                    "SLURM_CPUS_ON_NODE": "64", **env}
        self.cwd = tmp_path
        self.proc: subprocess.Popen | None = None

    def start(self, *args: str) -> subprocess.Popen:
        # Output to files, not pipes: a fake task's orphaned sleep must not hold the test up.
        with open(self.cwd / "out.txt", "w") as out, open(self.cwd / "err.txt", "w") as err:
            self.proc = subprocess.Popen(["bash", str(SBATCH), *args], env=self.env,
                                         cwd=self.cwd, stdout=out, stderr=err,
                                         start_new_session=True)
        return self.proc

    def log(self) -> list[str]:
        return self.log_path.read_text().splitlines()

    def wait_for(self, line: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.log():
            assert self.proc.poll() is None, f"script ended early: {self.stderr()}"
            assert time.monotonic() < deadline, f"no {line!r} in {self.log()}"
            time.sleep(0.02)

    def stderr(self) -> str:
        return (self.cwd / "err.txt").read_text()

    def finish(self, timeout: float = 10.0) -> tuple[int, str]:
        """The script's exit status and stderr."""
        return self.proc.wait(timeout=timeout), self.stderr()

    def kill(self) -> None:
        """Whatever is left of the script's process group (a fake task's sleep after a failure)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


@pytest.fixture
def job(tmp_path: Path):
    made: list[Job] = []

    def make(**env: str) -> Job:
        made.append(Job(tmp_path, **env))
        return made[-1]

    yield make
    for j in made:
        j.kill()


ARGS = ("bert-tiny", "--train.max_steps=5")


def test_torchrun_launcher_runs_one_torchrun_per_node(job) -> None:
    j = job()
    j.start(*ARGS)
    status, err = j.finish()
    assert status == 0, err
    log = j.log()
    assert "scontrol show hostnames gpu-node[01-02]" in log
    assert ("srun --kill-on-bad-exit=1 --nodes=2 --ntasks=2 --ntasks-per-node=1 torchrun "
            "--nnodes=2 --nproc_per_node=8 --rdzv_id=4242 --rdzv_backend=c10d "
            "--rdzv_endpoint=gpu-node01:29500 -m bertforge.cli pretrain --config bert-tiny "
            "--train.max_steps=5") in log
    assert "task finished" in log
    # A run that ends by itself is not requeued.
    assert not any(line.startswith(("scancel", "scontrol requeue")) for line in log)


def test_srun_launcher_runs_one_bertforge_per_gpu(job) -> None:
    j = job(LAUNCHER="srun", MASTER_PORT="31000")
    j.start(*ARGS)
    status, err = j.finish()
    assert status == 0, err
    log = j.log()
    assert ("srun --kill-on-bad-exit=1 --nodes=2 --ntasks=16 --ntasks-per-node=8 "
            "--cpus-per-task=8 python -m bertforge.cli pretrain --config bert-tiny "
            "--train.max_steps=5") in log
    # bertforge's env:// rendezvous needs both, exported to every task.
    assert "task env MASTER_ADDR=gpu-node01 MASTER_PORT=31000" in log
    assert not any(line.startswith(("torchrun", "scancel", "scontrol requeue")) for line in log)


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_time_limit_signal_stops_the_step_then_requeues(job, launcher) -> None:
    j = job(LAUNCHER=launcher, FAKE_TASK_S="30")
    j.start(*ARGS)
    j.wait_for("task started")
    j.proc.send_signal(signal.SIGUSR1)  # --signal=B:USR1@180: to the batch shell only
    status, err = j.finish()
    assert status == 0, err
    log = j.log()
    assert "srun got SIGTERM" not in log and "task finished" not in log
    order = [log.index(line) for line in ("scancel --signal=TERM 4242", "task got SIGTERM",
                                          "task saved a checkpoint", "scontrol requeue 4242")]
    assert order == sorted(order), log
    assert "requeueing job 4242" in err


def test_failed_step_is_not_requeued_and_its_status_kept(job) -> None:
    j = job(FAKE_TASK_RC="3")
    j.start(*ARGS)
    status, _ = j.finish()
    assert status == 3
    assert not any(line.startswith(("scancel", "scontrol requeue")) for line in j.log())


def test_unknown_launcher_is_refused_before_any_step(job) -> None:
    j = job(LAUNCHER="mpirun")
    j.start(*ARGS)
    status, err = j.finish()
    assert status == 2 and "LAUNCHER=mpirun" in err
    assert not any(line.startswith("srun") for line in j.log())


# ---- two real processes, as srun would start them ----

RENDEZVOUS = """\
import torch
from bertforge.train.distributed import all_reduce_sum, cleanup, init_distributed
info = init_distributed(device="cpu", timeout_s=60)
total = all_reduce_sum(torch.tensor([info.rank + 1.0]))
print(info.rank, info.world_size, info.local_rank, int(total.item()))
cleanup()
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_srun_tasks_meet_through_slurm_variables(child_env) -> None:
    base = {k: v for k, v in child_env.items() if k not in LAUNCH_VARS}
    base.update(SLURM_NTASKS="2", SLURM_STEP_ID="0", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()))
    procs = [subprocess.Popen([sys.executable, "-c", RENDEZVOUS], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert [out.split() for out, _ in outs] == [["0", "2", "0", "3"], ["1", "2", "1", "3"]]
