"""bertforge: BERT and BART pretraining and fine-tuning in modern PyTorch, with Hugging Face checkpoints natively.

The Python API (docs/python.md): ``pipeline(task, model)`` answers text as transformers'
pipelines do; the model classes, tokenizers (callable as transformers'), generation, and the
``finetune``/``pretrain`` runs with their configs. All are exported lazily (PEP 562) so that
``import bertforge`` (and with it every command-line call, ``--help`` included) does not pay for
importing torch.

What each model family exports (its config class, its model classes, functions such as
``convert_nvidia_checkpoint``) is read from its record (``FamilySpec.public_names``): a new
family, or a class that moves file, needs no edit here. Reading the records imports the model
package (and torch), so only a family's name, ``dir(bertforge)`` and ``__all__`` pay for it.
"""

from __future__ import annotations

import importlib
from pathlib import Path as _Path
from typing import Any

__version__ = "0.1.0"

_LAZY = {  # name -> module, for what no model family's record names
    "BpeTokenizer": "bertforge.tokenization.bpe",
    "BertTokenizer": "bertforge.tokenization",
    "load_tokenizer": "bertforge.tokenization",
    "GenerationConfig": "bertforge.models.generation",
    "generate": "bertforge.models.generation",
    "pipeline": "bertforge.inference.pipelines",
    "load_pipeline": "bertforge.inference.pipelines",
    "Pipeline": "bertforge.inference.pipelines",
    "InputError": "bertforge.inference.pipelines",
    "FinetuneConfig": "bertforge.config",
    "PretrainConfig": "bertforge.config",
    "load_config": "bertforge.config",
    "finetune": "bertforge.commands.train",
    "pretrain": "bertforge.commands.train",
}
_PACKAGE = _Path(__file__).parent


def _family_names() -> dict[str, str]:
    """Name -> module of every public name of every model family (their records), read once."""
    if "_FAMILY_NAMES" not in globals():
        from bertforge.models.registry import FAMILIES

        globals()["_FAMILY_NAMES"] = {name: module for family in FAMILIES
                                      for name, module in family.public_names().items()}
    return globals()["_FAMILY_NAMES"]


def _is_submodule(name: str) -> bool:
    """A module or package of bertforge: ``from bertforge import cli`` asks this hook before
    importing it, and must not pay for the family records."""
    return (_PACKAGE / f"{name}.py").is_file() or (_PACKAGE / name / "__init__.py").is_file()


def __getattr__(name: str) -> Any:
    if name == "__all__":
        return ["__version__", *_family_names(), *_LAZY]
    if name in _LAZY:
        module = _LAZY[name]
    elif name.startswith("_") or _is_submodule(name) or name not in _family_names():
        raise AttributeError(f"module 'bertforge' has no attribute {name!r}")
    else:
        module = _family_names()[name]
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_family_names()))
