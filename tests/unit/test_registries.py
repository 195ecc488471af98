"""The task and model-family registries: every reference resolves, and the records agree with the
code they name (a record that drifted from its class would fail a user only at run time)."""

from __future__ import annotations

import dataclasses

import pytest

from bertforge.core.refs import Ref
from bertforge.errors import ConfigError
from bertforge.models.registry import FAMILIES, HEAD_KINDS, family_of_architecture, resolve_config
from bertforge.tasks.registry import (TASKS, get_task, predict_modes, task_names,
                                      task_of_finetuned, task_of_objective)


def refs(record: object) -> list[Ref]:
    out = []
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        values = value.values() if isinstance(value, dict) else [value]
        out += [v for v in values if isinstance(v, Ref)]
        out += [v for inner in values if dataclasses.is_dataclass(inner)
                for v in refs(inner)]
    return out


@pytest.mark.parametrize("record", [*TASKS, *FAMILIES], ids=lambda r: r.name)
def test_every_reference_resolves(record) -> None:
    for ref in refs(record):
        assert ref.load() is not None, ref


def test_names_and_modes_are_unique_and_resolve_to_their_task() -> None:
    for spec in TASKS:
        for name in spec.names():
            assert get_task(name) is spec
    modes = [t.predict_mode for t in TASKS if t.predict_mode]
    assert len(modes) == len(set(modes)) and set(predict_modes().values()) <= set(task_names())


def test_heads_exist_in_some_family_and_served_tasks_are_complete() -> None:
    for spec in TASKS:
        assert spec.head in HEAD_KINDS, spec.name
        assert any(spec.head in family.heads for family in FAMILIES), spec.name
        if spec.pipeline is not None:
            assert spec.serving is not None and spec.predict_mode, spec.name
            assert spec.serving.route.startswith("/v1/")


def test_export_outputs_are_what_the_output_type_is_built_from() -> None:
    """OnnxModel rebuilds the head's output object from the graph's outputs by name."""
    import inspect

    for spec in TASKS:
        if spec.export is not None:
            params = inspect.signature(spec.export.output_type.load()).parameters
            assert set(spec.export.output_names) <= set(params), spec.name


def test_every_architecture_of_a_family_maps_back_to_it() -> None:
    for family in FAMILIES:
        for name, heads in family.architectures().items():
            assert family_of_architecture(name) == (family, heads[0])
            assert family.model_class(heads[0]).__name__ == name


def test_lookups_by_checkpoint_and_data_facts() -> None:
    assert task_of_finetuned("squad_v2").name == "question-answering"
    assert task_of_finetuned("glue/mrpc").name == "text-classification"
    assert task_of_finetuned("unheard-of") is None
    assert task_of_objective("sop").name == "masked-lm"
    assert task_of_objective("denoise").name == "denoising"
    assert resolve_config("bart-tiny")[0].seq2seq and not resolve_config("bert-tiny")[0].seq2seq


def test_an_unknown_or_misplaced_task_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'squadd' is an unknown task\. Did you mean 'squad'"):
        get_task("squadd")
    with pytest.raises(ConfigError, match="not a task finetune does"):
        get_task("fill-mask", command="finetune")
