"""What a command is: its typed config, how it runs, and where its resolved config is saved
(``beside`` its one output file, or in its output folder, by ``core.schema.save_config``).

A :class:`Command` is plain data read by the command line (``bertforge.cli`` builds each
subcommand's options from ``config``'s fields) and by the docs. ``run(cfg)`` (or
``run(cfg, options)`` when the command has run-mode ``options`` outside its saved config)
returns the exit status; it imports its back end lazily, so building the parser stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from bertforge.core.limits import INFERENCE_PRECISIONS
from bertforge.core.schema import opt


@dataclass(frozen=True)
class Command:
    """One ``bertforge`` subcommand.

    ``flat``: each config field is also a ``--kebab-case`` flag (``--vocab-size 30522``);
    pretrain and finetune have nested sections, set only as ``--section.key=value`` and listed
    in the epilog. ``recipes``: the folders whose recipe names ``--config`` also accepts.
    ``passthrough``: a list field that collects the ``--key=value`` settings that are not this
    config's keys (predict hands them to the fine-tuning config of a run). ``saves``: where the
    resolved config is written, for ``--help``. ``key_help``: help texts of config keys (dotted)
    that replace the fields' own in ``--help``, made when the help is printed: text from the
    registries, which the config modules below them may not read (``--task``'s list of tasks).
    """

    name: str
    help: str
    config: type
    run: Callable[..., int]
    options: type | None = None
    flat: bool = True
    recipes: tuple[str, ...] = ()
    passthrough: str | None = None
    saves: str = ""
    key_help: Callable[[], Mapping[str, str]] | None = None

    def help_of_keys(self) -> Mapping[str, str]:
        return self.key_help() if self.key_help is not None else {}


def beside(output: str | Path) -> Path:
    """Where the resolved config of a command whose output is one file goes: next to it,
    ``summaries.jsonl`` -> ``summaries.jsonl.config.yaml``."""
    output = Path(output)
    return output.with_name(output.name + ".config.yaml")


def precision_option(scope: str = "", default: str = "auto", then: str = "") -> Any:
    """The ``--precision`` of the commands that run a model for inference
    (``bertforge.runtime.guard``); ``scope`` says where it applies (``"torch backend: "``),
    ``then`` what the command does with it besides."""
    return opt(default, f"{scope}auto: on a CPU the fastest of bf16 (AMX, AVX512-BF16) and "
               "int8 (VNNI) whose outputs keep a cosine >= 0.999 to fp32's on a probe, else "
               "fp32 (logged with the reason); on a GPU bf16 where supported. Or fp32, bf16, "
               f"int8 (CPU: dynamically quantized linear layers) or fp16.{then}",
               choices=INFERENCE_PRECISIONS)


__all__ = ["Command", "beside", "precision_option"]
