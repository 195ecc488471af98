"""Model families (BERT, BART, ModernBERT): configs, presets, modules, task heads, Hugging Face interop.

The names below load lazily (PEP 562): reading the family registry (``models.registry``) or a
config class imports this package, and that must not cost importing torch and every model. A
family's config and model classes come from its record (``FamilySpec.public_names``), so a new
family needs no edit here.
"""

from __future__ import annotations

import importlib
from typing import Any

from bertforge.models.registry import FAMILIES  # plain data: its Refs load nothing

_LAZY = {
    # besides every family's config and model classes (their records' public_names)
    "BartPreTrainedModel": "bertforge.models.bart",
    "BART_PRESETS": "bertforge.models.bart_config",
    "BertPreTrainedModel": "bertforge.models.bert",
    "MODEL_CLASSES": "bertforge.models.bert",
    "LoadReport": "bertforge.models.hub",
    "PreTrainedModel": "bertforge.models.hub",
    "read_weights": "bertforge.models.hub",
    "MODERNBERT_CLASSES": "bertforge.models.modernbert",
    "ModernBertModelOutput": "bertforge.models.modernbert",
    "ModernBertPreTrainedModel": "bertforge.models.modernbert",
    "MODERNBERT_PRESETS": "bertforge.models.modernbert_config",
    "BertModelOutput": "bertforge.models.outputs",
    "BertPreTrainingOutput": "bertforge.models.outputs",
    "ClassifierOutput": "bertforge.models.outputs",
    "MaskedLMOutput": "bertforge.models.outputs",
    "QuestionAnsweringOutput": "bertforge.models.outputs",
    "PRESETS": "bertforge.models.presets",
    "get_preset": "bertforge.models.presets",
    "preset_names": "bertforge.models.presets",
}
_LAZY.update({name: module for family in FAMILIES for name, module in family.public_names().items()
              if module.startswith(__name__ + ".")})

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # cache: later lookups skip this hook
        return value
    raise AttributeError(f"module 'bertforge.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
