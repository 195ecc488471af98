"""The settings sections tasks add to the fine-tuning config, one record each.

A task with options of its own (``--embedding.pooling=cls``) declares them here: the config key
of its section, its typed dataclass (in a torch-free module of the task's, e.g.
tasks/embedding_settings.py), one line of help and the tasks that read it. ``bertforge.config``
composes ``FinetuneConfig`` from these records, so a new task's options are a record here and its
dataclass, not an edit of config.py; ``TaskSpec.settings`` (the task registry) answers from them.

Why not a field of the task registry's records: the registry names the task classes, and those
read the config, so a config that read the registry would close an import cycle (``Ref``s count
as imports). This module imports only ``core``: the config can read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertforge.core.refs import Ref
from bertforge.core.schema import check_fields


@dataclass(frozen=True)
class TaskSettings:
    key: str
    """The section's config key (``embedding``: ``--embedding.loss=...``, ``embedding:`` in YAML
    and in the saved config.yaml)."""
    settings: Ref
    """The section's dataclass: fields made with ``core.schema.opt``, torch-free, and no
    ``__post_init__`` (every fine-tuning config builds every section): its ``check()``, if it has
    one, runs after ``check_fields`` for the tasks that read it (:func:`check_task_settings`)."""
    help: str
    """One line for the section."""
    tasks: tuple[str, ...]
    """Canonical names of the tasks that read it (``bertforge.tasks.registry``)."""


TASK_SETTINGS: tuple[TaskSettings, ...] = (
    TaskSettings("embedding", Ref("bertforge.tasks.embedding_settings", "EmbeddingConfig"),
                 "Embedding and reranker training",
                 tasks=("sentence-similarity", "text-ranking")),
)


def settings_of(task: str) -> TaskSettings | None:
    """The settings section of the task named ``task`` (canonical name), if it has one."""
    return next((s for s in TASK_SETTINGS if task in s.tasks), None)


def check_task_settings(cfg: object, task: str) -> None:
    """ConfigError naming the key when the settings section of ``task`` in ``cfg`` (a
    ``FinetuneConfig``) breaks a declared rule (``choices``, ``minimum``) or its own ``check()``.
    A run of another task ignores the section, so it is not checked there."""
    record = settings_of(task)
    if record is None:
        return
    section = getattr(cfg, record.key)
    check_fields(section, record.key + ".")
    if hasattr(section, "check"):
        section.check()


__all__ = ["TASK_SETTINGS", "TaskSettings", "check_task_settings", "settings_of"]
