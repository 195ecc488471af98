"""Model families (BERT, BART, ModernBERT): configs, presets, modules, task heads, Hugging Face interop."""

from bertforge.models.bart import (BartForConditionalGeneration, BartForSequenceClassification,
                                   BartModel, BartPreTrainedModel)
from bertforge.models.bart_config import BART_PRESETS, BartConfig
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
from bertforge.models.modernbert import (ModernBertModel, ModernBertModelOutput,
                                         ModernBertPreTrainedModel)
from bertforge.models.modernbert_config import ModernBertConfig
from bertforge.models.modernbert_heads import (MODERNBERT_CLASSES, ModernBertForMaskedLM,
                                               ModernBertForMultipleChoice,
                                               ModernBertForQuestionAnswering,
                                               ModernBertForSequenceClassification,
                                               ModernBertForTokenClassification)
from bertforge.models.presets import MODERNBERT_PRESETS, PRESETS, get_preset, preset_names

__all__ = [
    "BART_PRESETS",
    "BartConfig",
    "BartForConditionalGeneration",
    "BartForSequenceClassification",
    "BartModel",
    "BartPreTrainedModel",
    "MODEL_CLASSES",
    "MODERNBERT_CLASSES",
    "MODERNBERT_PRESETS",
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
    "ModernBertConfig",
    "ModernBertForMaskedLM",
    "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertModel",
    "ModernBertModelOutput",
    "ModernBertPreTrainedModel",
    "PreTrainedModel",
    "QuestionAnsweringOutput",
    "get_preset",
    "preset_names",
    "read_weights",
]
