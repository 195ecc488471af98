"""Layering and the runner's task contract (structure item 7).

* ``bertforge.ops`` imports no models, data, train or tasks module, and the data loader no
  model module (checked in a fresh interpreter: what importing them pulls in);
* the speed options are applied from outside: ``apply_speed_options`` sets the flags a forward
  pass reads, on BERT and BART alike, and refuses an unknown attention backend;
* the runner asks the task, not the config's type: ``supports_fsdp`` refuses sharding before
  anything is built, ``total_steps()`` is the schedule's length (with the temporary fallback for
  task classes that do not define them yet).
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.models import BertConfig, BertForPreTraining
from bertforge.models.bart import BartForConditionalGeneration
from bertforge.models.bart_config import BartConfig
from bertforge.train.task import steps_for_epochs
from bertforge.train.distributed import DistInfo
from bertforge.speed import apply_speed_options, check_attention_backend
from bertforge.train.run import _Setup


def imported_by(module: str) -> set[str]:
    code = (f"import sys, {module}; print(' '.join(m for m in sys.modules "
            "if m.startswith('bertforge.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("module", ["bertforge.ops.unpad", "bertforge.ops.attention"])
def test_ops_import_nothing_above_them(module) -> None:
    above = ("bertforge.models", "bertforge.data", "bertforge.train", "bertforge.tasks")
    assert not {m for m in imported_by(module) if m.startswith(above)}


def test_the_loader_imports_no_model_code() -> None:
    loaded = imported_by("bertforge.data.loader") | imported_by("bertforge.data.collate.seq2seq")
    assert not {m for m in loaded if m.startswith("bertforge.models")}


def flags(model: torch.nn.Module, name: str) -> set:
    return {getattr(m, name) for m in model.modules() if hasattr(m, name)}


def test_speed_options_set_the_flags_a_forward_reads() -> None:
    bert = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=32))
    bart = BartForConditionalGeneration(BartConfig.from_preset("bart-tiny", vocab_size=61))
    for model in (bert, bart):
        assert flags(model, "unpad") == {False} and flags(model, "varlen_backend") == {"auto"}
        apply_speed_options(model, unpad=True, attention_backend="padded",
                            gradient_checkpointing=True)
        assert flags(model, "unpad") == {True} and flags(model, "varlen_backend") == {"padded"}
        assert flags(model, "gradient_checkpointing") == {True}
        apply_speed_options(model, unpad=False)
        assert flags(model, "unpad") == {False}
        assert flags(model, "gradient_checkpointing") == {False}
    with pytest.raises(ValueError, match="not one of"):
        apply_speed_options(bert, unpad=True, attention_backend="fast")
    with pytest.raises(ConfigError, match="train.attention_backend=flash: the flash backend"):
        check_attention_backend("flash", torch.device("cpu"), torch.float32)


class FakeTask:
    name = "fake"
    train = SimpleNamespace(batches_per_epoch=7, accumulation_steps=1)

    def __init__(self, **members) -> None:
        self.__dict__.update(members)


def two_ranks() -> DistInfo:
    return DistInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))


def test_the_runner_refuses_fsdp_for_a_task_that_cannot_shard(tmp_path) -> None:
    cfg = SimpleNamespace(output_dir=str(tmp_path), checkpoint=SimpleNamespace(keep=1),
                          train=SimpleNamespace(fsdp=True))
    with pytest.raises(ConfigError, match="train.fsdp=true is not supported by fake"):
        _Setup(FakeTask(supports_fsdp=False), cfg, two_ranks(), benchmark=True)
    # which tasks shard: pretraining does; fine-tuning writes its model from rank 0 alone
    from bertforge.tasks.denoise import DenoiseTask
    from bertforge.tasks.finetuning import FinetuneTask
    from bertforge.tasks.mlm import PretrainTask

    assert PretrainTask.supports_fsdp and DenoiseTask.supports_fsdp
    assert not FinetuneTask.supports_fsdp


def test_total_steps_come_from_the_task() -> None:
    assert steps_for_epochs(2.0, FakeTask.train) == 14  # 2.0 epochs x 7 batches
    assert steps_for_epochs(0.01, FakeTask.train) == 1
