"""The `bertforge` command: every --help works, and user mistakes end in one `error:` line on
stderr with exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge import cli
from bertforge.cli import build_parser, main
from bertforge.commands import COMMANDS
from bertforge.recipes import resolve_recipe

ROOT = Path(__file__).resolve().parents[2]
DEBUG_RECIPE = resolve_recipe("debug/tiny-cpu")


def subcommands() -> list[str]:
    return sorted(c.name for c in COMMANDS)


def test_every_journey_has_a_subcommand() -> None:
    assert {"vocab", "prepare", "inspect", "convert", "pretrain", "plan", "demo"} <= set(
        subcommands())


@pytest.mark.parametrize("command", [[]] + [[c] for c in subcommands()],
                         ids=lambda c: " ".join(c) or "bertforge")
def test_help_exits_zero(command: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main([*command, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: bertforge {' '.join(command)}".rstrip())
    assert "default" in out or not command  # options show their defaults
    if command:  # the help of the parser built for this command alone
        assert out == cli.command_parser(cli.BY_NAME[command[0]],
                                         f"bertforge {command[0]}").format_help()


def test_parsing_a_command_builds_its_parser_only(monkeypatch, capsys) -> None:
    built: list[str] = []
    real = cli.command_parser

    def counted(command, prog):
        built.append(command.name)
        return real(command, prog)

    monkeypatch.setattr(cli, "command_parser", counted)
    command, cfg, _ = cli.resolve(["finetune", "--task=squad", "--model=m", "--seeds", "1,2"])
    assert (command.name, cfg.task, built) == ("finetune", "squad", ["finetune"])
    built.clear()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert built == [] and "finetune" in capsys.readouterr().out


def test_the_command_list_is_argparse_s_own(capsys) -> None:
    """``bertforge --help`` lists the commands as a parser holding all of them would (the way
    it was built before), without building them."""
    whole = argparse.ArgumentParser(prog="bertforge", formatter_class=cli._Formatter,
                                    description=build_parser().description)
    whole.add_argument("-v", "--verbose", action="store_true", help="Debug logging.")
    whole.add_argument("--version", action="version", version="",
                       help="Print the versions of bertforge, Python and torch, and exit.")
    sub = whole.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        sub.add_parser(command.name, help=command.help)
    assert build_parser().format_help() == whole.format_help()
    assert build_parser().format_usage() == whole.format_usage()


def test_an_unknown_command_gets_the_closest_one(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["finetun", "--task=squad"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertforge: error: argument COMMAND: invalid choice: 'finetun' "
                              "(choose from 'vocab', 'prepare',")
    assert err[-1].endswith(". Did you mean 'finetune'?")
    with pytest.raises(SystemExit):
        main(["zzz"])
    assert "Did you mean" not in capsys.readouterr().err


def test_task_help_and_did_you_mean_come_from_the_task_records(capsys, tmp_path) -> None:
    from bertforge.tasks.registry import TASKS

    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    out = capsys.readouterr().out
    start = out.index("  --task=")
    block = out[start:out.index("  --data.", start)]
    for spec in TASKS:  # each task finetune trains, with its summary and aliases; no other
        trains = spec.trainer is not None and spec.command == "finetune"
        assert (f"        {spec.name}" in block) == trains, spec.name
        assert (spec.summary in block) == trains, spec.name
        assert not trains or all(a in block for a in spec.aliases)
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "text-ranking, or an alias" in " ".join(capsys.readouterr().out.split())
    # A wrong name is refused with the registry's closest, before anything runs.
    assert main(["finetune", "--task=squadd", f"--output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: task='squadd' is an unknown task. Did you mean 'squad'?")
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()
    assert main(["finetune", "--task=fill-mask"]) == 2
    assert "is not a task finetune does" in capsys.readouterr().err


def test_pretrain_help_lists_the_config_keys(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    for key in ("--train.max_steps=1000", "--optim.lr=0.006", "--data.path=None", "--resume='auto'"):
        assert key in out


def test_console_script_runs(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "bertforge"
    if not script.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "pretrain" in proc.stdout and not proc.stderr


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bertforge.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["pretrain", "--config", str(DEBUG_RECIPE), "--data.path=no/such/data",
      "--output_dir=run"], "error: no/such/data: no such file or directory"),
    (["pretrain", "--config", str(DEBUG_RECIPE), "--train.max_steps=abc"],
     "error: bad value for 'train.max_steps' in the command line"),
    (["pretrain", "--train.max_step=3"],
     "error: unknown config key 'train.max_step' in the command line. "
     "Did you mean 'train.max_steps'?"),
    (["pretrain", "--config", "missing.yaml"], "error: config file not found: missing.yaml"),
    (["pretrain", "--train.max_steps", "3"],
     "error: override '--train.max_steps' must look like --section.key=value"),
    (["plan", "--gpus", "3", "--global-batch-size", "100"],
     "error: global batch size 100 is not divisible by 3 GPUs"),
], ids=["missing-data", "bad-type", "unknown-key", "missing-config", "no-equals", "plan"])
def test_user_errors_print_one_line_and_exit_2(args: list[str], message: str,
                                               tmp_path: Path) -> None:
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not list(tmp_path.iterdir())  # a refused run writes nothing


def test_stray_arguments_of_other_commands_are_refused(capsys: pytest.CaptureFixture) -> None:
    # Every command takes --key=value settings of its own config; another command's key is an
    # unknown key (one error line), a stray word is argparse's usage error.
    assert main(["plan", "--train.max_steps=3"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown config key 'train' in the "
                                              "command line")
    with pytest.raises(SystemExit) as stop:
        main(["plan", "extra"])
    assert stop.value.code == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err


def test_plan_prints_a_proposal(capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", "--model", "bert-base-uncased", "--gpus", "8", "--gpu-memory", "80",
                 "--global-batch-size", "65536", "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "global batch 65536 = micro-batch" in out and "--train.micro_batch_size=" in out


@pytest.mark.parametrize("args", [["inspect", "data", "--num", "-1"],
                                  ["vocab", "--input", "x", "--output", "v.txt", "--vocab-size", "0"],
                                  ["plan", "--gpus", "0"]])
def test_counts_must_be_positive(args: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    assert "must be a whole number >= 1" in capsys.readouterr().err


def test_os_errors_are_one_line(capsys: pytest.CaptureFixture) -> None:
    # /proc refuses new directories even to root: an OSError from the system, not a bug.
    code = main(["vocab", "--input", str(ROOT / "tests" / "assets" / "tiny_corpus.txt"),
                 "--output", "/proc/bertforge-no/vocab.txt", "--vocab-size", "100"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "%|" not in ln]
    assert code == 1 and len(err) == 1 and err[0].startswith("error: ")
    assert "/proc/bertforge-no" in err[0] and "Traceback" not in err[0]


def test_version_names_bertforge_python_and_torch(capsys) -> None:
    import platform
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"bertforge {version('bertforge')} (Python {platform.python_version()}, torch "
        f"{version('torch')})")


def test_progress_is_drawn_on_terminals_only(tmp_path, monkeypatch, capsys) -> None:
    """A log file gets plain lines, not carriage-return redraws of a bar."""
    import io

    from bertforge.core.progress import PROGRESS_ENV, progress_bar
    from bertforge.train.loop import RunLogger

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress_bar(total=3).disable
    monkeypatch.setenv(PROGRESS_ENV, "always")
    assert not progress_bar(total=3, file=io.StringIO()).disable
    monkeypatch.setenv(PROGRESS_ENV, "never")
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress_bar(total=3).disable
    monkeypatch.delenv(PROGRESS_ENV)
    assert not progress_bar(total=3, file=io.StringIO()).disable
    log_file = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log_file)
    run = RunLogger(tmp_path, enabled=True, total_steps=4, start_step=0, tensorboard=False)
    run.log(2, {"loss": 7.25, "lr": 1e-4, "seq_per_s": 356.25})
    run.close()
    assert log_file.getvalue() == "train: step 2/4: loss 7.25, lr 0.0001, seq_per_s 356.2\n"
