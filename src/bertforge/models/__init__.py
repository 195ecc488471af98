"""Model families (BERT, BART, ModernBERT): configs, presets, modules, task heads, Hugging Face interop.

The names below load lazily (PEP 562): reading the family registry (``models.registry``) or a
config class imports this package, and that must not cost importing torch and every model.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BartForConditionalGeneration": "bertforge.models.bart",
    "BartForSequenceClassification": "bertforge.models.bart",
    "BartModel": "bertforge.models.bart",
    "BartPreTrainedModel": "bertforge.models.bart",
    "BART_PRESETS": "bertforge.models.bart_config",
    "BartConfig": "bertforge.models.bart_config",
    "BertForMaskedLM": "bertforge.models.bert",
    "BertForMultipleChoice": "bertforge.models.bert",
    "BertForPreTraining": "bertforge.models.bert",
    "BertForQuestionAnswering": "bertforge.models.bert",
    "BertForSequenceClassification": "bertforge.models.bert",
    "BertForTokenClassification": "bertforge.models.bert",
    "BertModel": "bertforge.models.bert",
    "BertPreTrainedModel": "bertforge.models.bert",
    "MODEL_CLASSES": "bertforge.models.bert",
    "BertConfig": "bertforge.models.config",
    "LoadReport": "bertforge.models.hub",
    "PreTrainedModel": "bertforge.models.hub",
    "read_weights": "bertforge.models.hub",
    "MODERNBERT_CLASSES": "bertforge.models.modernbert",
    "ModernBertForMaskedLM": "bertforge.models.modernbert",
    "ModernBertForMultipleChoice": "bertforge.models.modernbert",
    "ModernBertForQuestionAnswering": "bertforge.models.modernbert",
    "ModernBertForSequenceClassification": "bertforge.models.modernbert",
    "ModernBertForTokenClassification": "bertforge.models.modernbert",
    "ModernBertModel": "bertforge.models.modernbert",
    "ModernBertModelOutput": "bertforge.models.modernbert",
    "ModernBertPreTrainedModel": "bertforge.models.modernbert",
    "MODERNBERT_PRESETS": "bertforge.models.modernbert_config",
    "ModernBertConfig": "bertforge.models.modernbert_config",
    "BertModelOutput": "bertforge.models.outputs",
    "BertPreTrainingOutput": "bertforge.models.outputs",
    "ClassifierOutput": "bertforge.models.outputs",
    "MaskedLMOutput": "bertforge.models.outputs",
    "QuestionAnsweringOutput": "bertforge.models.outputs",
    "PRESETS": "bertforge.models.presets",
    "get_preset": "bertforge.models.presets",
    "preset_names": "bertforge.models.presets",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # cache: later lookups skip this hook
        return value
    raise AttributeError(f"module 'bertforge.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
