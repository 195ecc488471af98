"""Whole numbers typed by people are ASCII digits, wherever the code base reads one by hand.

``str.isdigit`` accepts "²" (and ``int`` then raises ValueError: a traceback), and ``int``
accepts "３", "٣", "1_000" and "+2" (a value nobody meant). Every integer option, setting,
environment variable, label and file-name number read from text goes through one helper
(:mod:`bertforge.core.numbers`): ASCII digits only, else one line naming the option.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.cli import main, resolve
from bertforge.errors import ConfigError, DataError

NOT_ASCII = ["²", "３", "٣", "1_000", "+2", "2.0", "0x2", "-1"]


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    return last


@pytest.mark.parametrize("value", NOT_ASCII)
def test_serve_replicas_is_ascii_digits_or_auto(value: str, tmp_path: Path, capsys) -> None:
    assert main(["serve", "--model", str(tmp_path), "--replicas", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: --replicas must be a whole number") and "0-9" in err, err


def test_serve_replicas_takes_digits_and_auto() -> None:
    from bertforge.serve.replicas import plan_replicas

    assert plan_replicas(" 2 ", "cpu") == ["cpu", "cpu"]
    assert plan_replicas("AUTO", "cpu") is None


@pytest.mark.parametrize("flag", ["--port", "--max-batch-items"])
@pytest.mark.parametrize("value", ["３", "٣", "1_000", "+2"])
def test_integer_flags_take_ascii_digits_only(flag: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--model", "m", f"{flag}={value}"])
    assert stopped.value.code == 2
    err = one_error_line(capsys)
    assert flag in err and "0-9" in err, err


@pytest.mark.parametrize("value", ["３", "٣", "²"])
def test_integer_config_keys_take_ascii_digits_only(value: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.max_steps.*0-9"):
        resolve(["pretrain", "--config", "debug/tiny-cpu", f"--train.max_steps={value}"])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"train:\n  max_steps: {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"train\.max_steps.*0-9"):
        resolve(["pretrain", "--config", str(recipe)])
    # Digits in quotes are still a number.
    recipe.write_text('train:\n  max_steps: "7"\n', encoding="utf-8")
    assert resolve(["pretrain", "--config", str(recipe)])[1].train.max_steps == 7


def test_seed_lists_take_ascii_digits_only(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["finetune", "--config", "finetune/debug-cpu", "--seeds", "1,３"])
    assert "--seeds" in one_error_line(capsys)


@pytest.mark.parametrize("value", ["²", "３", "٣"])
def test_a_thread_count_from_the_environment_that_is_not_ascii_digits(
        value: str, monkeypatch) -> None:
    """OMP_NUM_THREADS that is not a count leaves the threads automatic (as "many" does, and
    OpenMP warns about it itself): never a ValueError, never a count nobody typed."""
    from bertforge.serve.execution import model_threads, thread_counts

    monkeypatch.setattr("bertforge.serve.execution.cores", lambda: 4)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert model_threads(0) == 3 and thread_counts(0) == (3, 4)


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_launcher_variables(name: str, monkeypatch) -> None:
    from bertforge.train.distributed import init_distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(var, "0" if var != "WORLD_SIZE" else "1")
    monkeypatch.setenv(name, "１" if name == "WORLD_SIZE" else "０")
    with pytest.raises(ConfigError, match=name):
        init_distributed("cpu")


@pytest.mark.parametrize("label", ["²", "١"])
def test_data_labels(label: str, tmp_path: Path) -> None:
    from bertforge.data.finetuning import read_glue, read_swag

    glue = tmp_path / "r.tsv"
    glue.write_text(f"sentence1\tsentence2\tlabel\na\tb\t{label}\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"{glue}:2: label"):
        read_glue(glue, "rte")
    swag = tmp_path / "s.csv"
    swag.write_text(f"sent1,sent2,ending0,ending1,label\na,b,c,d,{label}\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"{swag}:2: label"):
        read_swag(swag)


def test_a_run_folder_with_an_odd_checkpoint_name(tmp_path: Path) -> None:
    from bertforge.models.loading import model_directory

    for name in ("checkpoint-²", "checkpoint-٣"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="is not a model directory"):
        model_directory(tmp_path)
