"""bertforge: BERT and BART pretraining and fine-tuning in modern PyTorch, with Hugging Face checkpoints natively.

The Python API (docs/python.md): ``pipeline(task, model)`` answers text as transformers'
pipelines do; the model classes, tokenizers (callable as transformers'), generation, and the
``finetune``/``pretrain`` runs with their configs. All are exported lazily (PEP 562) so that
``import bertforge`` (and with it every command-line call, ``--help`` included) does not pay for
importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "BertConfig": "bertforge.models.config",
    "BertModel": "bertforge.models.bert",
    "BertForPreTraining": "bertforge.models.heads",
    "BertForMaskedLM": "bertforge.models.heads",
    "BertForQuestionAnswering": "bertforge.models.heads",
    "BertForSequenceClassification": "bertforge.models.heads",
    "BertForMultipleChoice": "bertforge.models.heads",
    "BertForTokenClassification": "bertforge.models.heads",
    "convert_nvidia_checkpoint": "bertforge.models.convert",
    "BartConfig": "bertforge.models.bart_config",
    "BartModel": "bertforge.models.bart",
    "BartForConditionalGeneration": "bertforge.models.bart",
    "BartForSequenceClassification": "bertforge.models.bart",
    "ModernBertConfig": "bertforge.models.modernbert_config",
    "ModernBertModel": "bertforge.models.modernbert",
    "ModernBertForMaskedLM": "bertforge.models.modernbert_heads",
    "ModernBertForSequenceClassification": "bertforge.models.modernbert_heads",
    "ModernBertForTokenClassification": "bertforge.models.modernbert_heads",
    "ModernBertForQuestionAnswering": "bertforge.models.modernbert_heads",
    "ModernBertForMultipleChoice": "bertforge.models.modernbert_heads",
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
    "finetune": "bertforge.tasks.finetune",
    "pretrain": "bertforge.tasks.pretrain",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # cache: later lookups skip this hook
        return value
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
