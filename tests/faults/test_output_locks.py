"""The output lock is a regular file that the lock itself created, held by the main process only.

Whatever is planted at the lock's path (a symbolic link to a file worth keeping, a dangling link,
a directory, a FIFO, a socket, a hard link) is refused with one line naming the path, by the lock
and by every command that takes one, and nothing behind it is written or removed; a FIFO never
hangs the command. A lock file that someone else replaced is not removed on release. A child
process (DataLoader workers fork) never holds its parent's lock, so a SIGKILLed holder frees it
at once. Single-file outputs (`predict --output`, `generate --output`) are locked as directories
are. A run's metrics.jsonl, appended to in place, follows the lock file's rule.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import stat
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.core.io import LOCK_NAME, output_lock
from bertforge.errors import ConfigError
from bertforge.models import BertConfig, BertForSequenceClassification
from bertforge.tokenization import BertTokenizer
from cli_output import one_error_line

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "assets" / "tiny_corpus.txt"
MRPC = ROOT / "tests" / "assets" / "finetune" / "mrpc.tsv"
PRECIOUS = '{"keep": "this file is not a lock"}\n'


def _plant(kind: str, path: Path, victim: Path) -> None:
    """Put a ``kind`` of thing that is not a lock file of ours at ``path``."""
    victim.write_text(PRECIOUS)
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "dangling symlink":
        path.symlink_to(victim.with_name("nothing-here"))
    elif kind == "symlink to a directory":
        path.symlink_to(victim.parent)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "hard link":
        os.link(victim, path)


KINDS = ["symlink", "dangling symlink", "symlink to a directory", "directory", "fifo", "socket",
         "hard link"]


def _unchanged(path: Path, victim: Path, kind: str) -> None:
    assert victim.read_text() == PRECIOUS
    assert not (victim.parent / "nothing-here").exists()  # a dangling link is not followed
    assert os.path.lexists(path) and (kind != "directory" or not any(path.iterdir()))


@pytest.mark.parametrize("beside", [False, True], ids=["directory lock", "beside lock"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_lock_path_that_is_not_a_regular_file_is_refused(kind: str, beside: bool,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "out"
    if beside:
        lock = tmp_path / f".out{LOCK_NAME}"
    else:
        out.mkdir()
        lock = out / LOCK_NAME
    victim = tmp_path / "victim.json"
    _plant(kind, lock, victim)
    with pytest.raises(ConfigError) as refused:
        with output_lock(out, "--output", "test", beside=beside):
            pytest.fail("the lock was taken")
    message = str(refused.value)
    assert "\n" not in message and str(lock) in message and "remove it" in message, message
    _unchanged(lock, victim, kind)


@pytest.fixture(scope="module")
def classifier(tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = BertTokenizer.from_file(tiny.vocab)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        num_labels=2, id2label={0: "0", 1: "1"}, finetuning_task="glue/mrpc")
    torch.manual_seed(0)
    return BertForSequenceClassification(config).save_pretrained(
        tmp_path_factory.mktemp("locks") / "classify", tokenizer=tok)


def _commands(tiny, tiny_args, classifier: Path, tiny_bart: Path, tmp: Path
              ) -> dict[str, tuple[list[str], Path, Path]]:
    """Each command that takes a lock: (argv, its output, the path of its lock)."""
    (tmp / "in.txt").write_text("some text to summarise\n")
    out = tmp / "out"
    inside, beside = out / LOCK_NAME, tmp / f".out{LOCK_NAME}"
    return {
        "pretrain": (["pretrain", *tiny_args(out)], out, inside),
        "finetune": (["finetune", "--task=glue", "--data.task_name=mrpc",
                      f"--model={classifier}", f"--data.train={MRPC}", f"--output_dir={out}",
                      "--train.max_steps=1"], out, inside),
        "prepare": (["prepare", "--input", str(CORPUS), "--vocab", str(tiny.vocab), "--output",
                     str(out), "--workers", "1"], out, inside),
        "export onnx": (["export", "onnx", "--model", str(classifier), "--output", str(out)],
                        out, beside),
        "export sentence-transformers": (["export", "sentence-transformers", "--model",
                                          str(classifier), "--output", str(out)], out, beside),
        "predict": (["predict", "--model", str(classifier), "--data", str(MRPC), "--output",
                     str(out)], out, beside),
        "generate": (["generate", "--model", str(tiny_bart), "--input", str(tmp / "in.txt"),
                      "--output", str(out)], out, beside),
    }


COMMANDS = ["pretrain", "finetune", "prepare", "export onnx", "export sentence-transformers",
            "predict", "generate"]


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
@pytest.mark.parametrize("command", COMMANDS)
def test_commands_refuse_a_planted_lock_in_one_line(command: str, kind: str, tiny, tiny_args,
                                                    classifier: Path, tiny_bart: Path,
                                                    tmp_path: Path, capsys) -> None:
    argv, out, lock = _commands(tiny, tiny_args, classifier, tiny_bart, tmp_path)[command]
    if lock.parent == out:
        out.mkdir()
    victim = tmp_path / "victim.json"
    _plant(kind, lock, victim)
    assert main(argv) == 2
    err = one_error_line(capsys)
    assert str(lock) in err and "not a regular file" in err, err
    _unchanged(lock, victim, kind)
    left = sorted(p.name for p in out.iterdir()) if out.is_dir() else [out.name] * out.exists()
    assert left == ([LOCK_NAME] if lock.parent == out else [])  # nothing else written


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "fifo", "hard link"])
def test_a_planted_metrics_file_is_refused_not_written_through(kind: str, tiny_args,
                                                               tmp_path: Path, capsys) -> None:
    """metrics.jsonl is appended to in place, so it gets the lock file's rule: a link planted
    there (even a dangling one, whose target the append would create), a FIFO (which would hang
    the resume's read) or a hard link is one line, and nothing behind it is written."""
    out = tmp_path / "out"
    out.mkdir()
    metrics, victim = out / "metrics.jsonl", tmp_path / "victim.json"
    _plant(kind, metrics, victim)
    assert main(["pretrain", *tiny_args(out)]) == 2
    err = one_error_line(capsys)
    assert str(metrics) in err and "not a regular file" in err, err
    _unchanged(metrics, victim, kind)


@pytest.mark.parametrize("command", ["predict", "generate"])
def test_single_file_outputs_are_locked(command: str, tiny, tiny_args, classifier: Path,
                                        tiny_bart: Path, tmp_path: Path, capsys) -> None:
    argv, out, lock = _commands(tiny, tiny_args, classifier, tiny_bart, tmp_path)[command]
    with output_lock(out, "--output", "another", beside=True):
        assert main(argv) == 2
    assert f"--output {out} is in use by another bertforge command" in one_error_line(capsys)
    assert not out.exists() and not lock.exists()
    assert main(argv) == 0 and out.is_file() and not lock.exists()  # free again, and removed


def test_release_leaves_a_lock_file_that_replaced_its_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = output_lock(out, "output_dir", "first")
    first.__enter__()
    (out / LOCK_NAME).unlink()  # someone removed it; a second command then took a new one
    with output_lock(out, "output_dir", "second"):
        first.__exit__(None, None, None)
        assert (out / LOCK_NAME).is_file()
        with pytest.raises(ConfigError, match="in use by another bertforge command"):
            with output_lock(out, "output_dir", "third"):
                pass
    assert not (out / LOCK_NAME).exists()


def _hold_and_fork(directory: str, ready, child_pid) -> None:
    """Take the lock, fork a child that outlives us (a worker), then wait to be killed."""
    with output_lock(directory, "output_dir", "bertforge pretrain"):
        pid = os.fork()
        if pid == 0:  # the child: still running when its parent is SIGKILLed
            signal.pause()
            os._exit(0)
        child_pid.value = pid
        ready.set()
        signal.pause()


def test_a_child_process_never_holds_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    ready, child_pid = ctx.Event(), ctx.Value("i", 0)
    holder = ctx.Process(target=_hold_and_fork, args=(str(out), ready, child_pid))
    holder.start()
    try:
        assert ready.wait(30)
        os.kill(holder.pid, signal.SIGKILL)
        os.waitpid(holder.pid, 0)  # (join() would wait for the orphan: it shares the sentinel)
        os.kill(child_pid.value, 0)  # the orphan is alive
        with output_lock(out, "output_dir", "next"):  # at once: no refusal naming the dead pid
            pass
    finally:
        if child_pid.value:
            os.kill(child_pid.value, signal.SIGKILL)
        holder.join(30)


def test_an_unlocked_stale_lock_file_is_reused_not_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text('{"pid": 1}')  # left by a SIGKILLed run: ours, and free
    with output_lock(out, "output_dir", "next"):
        assert stat.S_ISREG(os.lstat(out / LOCK_NAME).st_mode)
    assert not (out / LOCK_NAME).exists()
