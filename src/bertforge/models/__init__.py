"""BERT model family: config, presets, encoder, task heads, Hugging Face checkpoint interop."""

from bertforge.models.bert import BertModel, BertModelOutput
from bertforge.models.config import BertConfig
from bertforge.models.heads import (
    MODEL_CLASSES,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertPreTrainingOutput,
    ClassifierOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
)
from bertforge.models.bert import BertPreTrainedModel
from bertforge.models.hub import LoadReport, PreTrainedModel, read_weights
from bertforge.models.presets import PRESETS, get_preset, preset_names

__all__ = [
    "MODEL_CLASSES",
    "PRESETS",
    "BertConfig",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertModelOutput",
    "BertPreTrainedModel",
    "BertPreTrainingOutput",
    "ClassifierOutput",
    "LoadReport",
    "MaskedLMOutput",
    "PreTrainedModel",
    "QuestionAnsweringOutput",
    "get_preset",
    "preset_names",
    "read_weights",
]
