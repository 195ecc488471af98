"""Mistakes and hostile environments end in one line that says what, where and what to do, never a
traceback: a YAML list, a model too big for the machine, a NaN in a model config, a full disk
during a checkpoint save, an output_dir that is a file or read-only, SIGTERM during start-up."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.errors import ConfigError
from bertforge.models import BertConfig
from bertforge.train.guards import explain_oom, verify_checkpoint


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_yaml_whose_top_level_is_a_list(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("- train:\n    max_steps: 3\n")
    assert main(["pretrain", "--config", str(recipe)]) == 2
    assert one_error_line(capsys) == (
        f"error: config file {recipe}: the top level is a list; it must be a mapping of keys to "
        "values (e.g. `train:` then indented `max_steps: 100`)")


def test_a_model_too_big_for_the_machine_says_what_it_needs(tiny_args, tmp_path: Path,
                                                            capsys) -> None:
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"hidden_size": 2**17, "num_attention_heads": 1024,
                                "intermediate_size": 2**20, "num_hidden_layers": 24}))
    started = time.monotonic()
    assert main(["pretrain", *tiny_args(tmp_path / "run", f"--model={huge}")]) == 2
    err = one_error_line(capsys)
    assert time.monotonic() - started < 30  # refused from the shape, nothing allocated
    assert err.startswith(f"error: model {huge} (hidden_size=131072, intermediate_size=1048576,")
    assert "parameters; training it needs at least" in err and "Choose a smaller model" in err
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_an_allocation_failure_is_explained() -> None:
    config = BertConfig.from_preset("bert-large-uncased")
    with pytest.raises(ConfigError, match=r"not enough cpu memory for model bert-large .*336,\d{3},"
                                          r"\d{3} parameters take 1\.3 GiB in fp32"):
        with explain_oom(config, torch.device("cpu"), "bert-large"):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not "
                               "enough memory: you tried to allocate 128849018880 bytes.")
    with pytest.raises(RuntimeError, match="unrelated"):  # other errors pass through untouched
        with explain_oom(config, torch.device("cpu"), "bert-large"):
            raise RuntimeError("unrelated")


def test_a_nan_initializer_range(tiny_args, tmp_path: Path, capsys) -> None:
    model = tmp_path / "model.json"
    model.write_text('{"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, '
                     '"intermediate_size": 64, "initializer_range": NaN}')
    assert main(["pretrain", *tiny_args(tmp_path / "run", f"--model={model}")]) == 2
    assert one_error_line(capsys) == (f"error: {model}: BertConfig.initializer_range must be a "
                                      "positive finite number, got nan")


def test_an_attention_kernel_the_device_lacks_is_refused_before_the_model(
        tiny_args, tmp_path: Path, capsys, monkeypatch) -> None:
    """flash on a CPU (bf16 set, so the config itself is fine): refused when the run starts,
    not at the first forward after the model was built and the data opened."""
    import bertforge.train.guards as guards

    def never(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(guards, "load_model", never)
    assert main(["pretrain", *tiny_args(tmp_path / "run", "--precision=bf16",
                                         "--train.attention_backend=flash")]) == 2
    assert one_error_line(capsys).startswith(
        "error: train.attention_backend=flash: the flash backend needs the flash-attn package, "
        "a CUDA device and fp16/bf16 activations")


def test_output_dir_that_is_a_file(tiny_args, tmp_path: Path, capsys) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("precious")
    assert main(["pretrain", *tiny_args(target)]) == 2
    assert one_error_line(capsys) == (f"error: output_dir {target} is a file, not a directory; "
                                      "choose a directory path")
    assert target.read_text() == "precious"


def test_output_dir_on_a_read_only_file_system(tiny_args, tmp_path: Path, capsys,
                                               monkeypatch) -> None:
    # Tests may run as root, which ignores permission bits; a read-only mount is simulated at
    # the system call the write probe makes.
    target = tmp_path / "ro"
    target.mkdir()
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).startswith(str(target)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    assert main(["pretrain", *tiny_args(target)]) == 2
    err = one_error_line(capsys)
    assert err.startswith(f"error: output_dir {target} is not writable: Read-only file system")
    assert err.endswith("choose a writable directory or fix its permissions")


@pytest.mark.slow
def test_disk_full_while_saving_a_checkpoint_keeps_the_previous_one(finished, child_env,
                                                                   tmp_path: Path) -> None:
    # A real failed write: the child may not grow any file past the size of the weights, so the
    # optimizer state (twice as large) fails mid-write with EFBIG, as a full disk fails with
    # ENOSPC; both take the same path.
    out = tmp_path / "run"
    shutil.copytree(finished.out, out)
    shutil.rmtree(out / "checkpoint-4")
    shutil.rmtree(out / f"checkpoint-{finished.steps}")
    limit = (out / "checkpoint-2" / "model.safetensors").stat().st_size + 4096

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # report EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "bertforge.cli", "pretrain",
                           *finished.args(out)], env=child_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=limit_file_size)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert last == (f"error: File too large writing checkpoint-4/training_state/optimizer.pt in "
                    f"{out}; nothing of it was published and {out / 'checkpoint-2'} is intact. "
                    "Free space (or fix the file system), then run the same command to resume")
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
    verify_checkpoint(out / "checkpoint-2")


def wait_until(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def torch_is_loading(pid: int) -> bool:
    """True once the process has mapped torch's library: the import has begun, nothing else."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("moment", ["importing torch", "building data and model"])
def test_sigterm_during_start_up_exits_cleanly(moment: str, tiny_args, child_env,
                                               tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "pretrain",
                             *tiny_args(out, "--train.max_steps=100000")],
                            env=child_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        if moment == "importing torch":
            wait_until(lambda: torch_is_loading(proc.pid), proc)
        else:  # output_dir is checked after the data is opened, before the model is built
            wait_until(out.exists, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if "stopped for preemption" in stdout:  # a fast machine reached the loop: the other path
        pytest.skip("the train loop had started; its preemption is tested in test_resume.py")
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines()[-1] == "stopped by SIGTERM"
    assert "Traceback" not in stderr
    assert not list(out.glob("checkpoint-*")) if out.exists() else True
