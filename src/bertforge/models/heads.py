"""BERT with task heads: pretraining (MLM + NSP), masked LM, QA, classification, multiple choice, tagging.

Module names (``bert``, ``cls.predictions``, ``cls.seq_relationship``, ``qa_outputs``, ``classifier``)
match Hugging Face so each class reads and writes the checkpoint of the transformers class of the
same name. Models return logits only; losses live with the training code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from bertforge.models.bert import BertModel, BertPreTrainedModel
from bertforge.models.config import BertConfig
from bertforge.ops.dropout import Dropout
from bertforge.ops.linear import Linear
from bertforge.ops.unpad import TokenLayout


@dataclass
class BertPreTrainingOutput:
    mlm_logits: torch.Tensor
    """(B, S, vocab_size), or (N, vocab_size) at the N ``masked_positions`` in row-major order."""
    nsp_logits: torch.Tensor
    """(B, 2), one row per sequence (more than B for packed rows): 0 = IsNext, 1 = random."""


@dataclass
class MaskedLMOutput:
    logits: torch.Tensor
    """(B, S, vocab_size), or (N, vocab_size) at the N ``masked_positions``."""


@dataclass
class QuestionAnsweringOutput:
    start_logits: torch.Tensor
    """(B, S) answer-start scores."""
    end_logits: torch.Tensor
    """(B, S) answer-end scores."""


@dataclass
class ClassifierOutput:
    logits: torch.Tensor
    """(B, num_labels) per sequence, (B, C) per choice, or (B, S, num_labels) per token."""


class BertPredictionHeadTransform(nn.Module):
    """dense -> activation -> LayerNorm applied before the vocabulary projection."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = config.hidden_act
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden, self.act))


class BertLMPredictionHead(nn.Module):
    """Vocabulary scores: transform, then the decoder whose weight is the word-embedding matrix.

    ``decoder.weight`` and ``decoder.bias`` are aliases of the word embeddings and of ``bias``
    (the owning model ties the weight); the checkpoint stores only ``cls.predictions.bias``.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.padded_vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., vocab_size). The matmul runs over the padded rows (tensor-core friendly
        shapes); the padding columns are sliced off, which is a view, not a copy."""
        return self.decoder(self.transform(hidden))[..., : self.vocab_size]


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def _classifier_dropout(config: BertConfig) -> float:
    return config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout


class BertForPreTraining(BertPreTrainedModel):
    """Encoder + MLM and NSP heads (``cls.predictions``, ``cls.seq_relationship``)."""

    last_layer_at = "predicted"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.init_weights(skip_prefix="bert")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        layout: TokenLayout | None = None,
    ) -> BertPreTrainingOutput:
        """(B, S) inputs; ``masked_positions`` ((B, S) bool, or flat int64 positions) limits MLM
        logits, and the encoder's last layer with them, to those positions (and the first
        tokens, for NSP; ``BertModel.forward``'s ``only_at``). ``position_ids``/``layout``: as
        ``BertModel``; NSP logits are per sequence, (N, 2), for packed rows."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, layout,
                        only_at=masked_positions)
        mlm = self.cls.predictions(out.select(masked_positions))
        return BertPreTrainingOutput(mlm_logits=mlm, nsp_logits=self.cls.seq_relationship(out.pooler_output))


class BertForMaskedLM(BertPreTrainedModel):
    """Encoder (no pooler) + MLM head (``cls.predictions``)."""

    last_layer_at = "predicted"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.init_weights(skip_prefix="bert")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        layout: TokenLayout | None = None,
    ) -> MaskedLMOutput:
        """As ``BertForPreTraining.forward``, without the NSP head."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, layout,
                        only_at=masked_positions)
        return MaskedLMOutput(logits=self.cls.predictions(out.select(masked_positions)))


class BertForQuestionAnswering(BertPreTrainedModel):
    """Encoder (no pooler) + span head ``qa_outputs`` (H -> 2: start, end)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights(skip_prefix="bert")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        logits = self.qa_outputs(self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state)
        start, end = logits.unbind(dim=-1)  # (B, S, 2) -> 2 x (B, S)
        return QuestionAnsweringOutput(start_logits=start, end_logits=end)


def _with_labels(config: BertConfig, num_labels: int | None) -> BertConfig:
    return config if num_labels is None or num_labels == config.num_labels else config.replace(num_labels=num_labels)


class BertForSequenceClassification(BertPreTrainedModel):
    """Encoder + dropout + ``classifier`` on the pooled [CLS] vector.

    ``num_labels`` (default: ``config.num_labels``) is stored in ``self.config`` and saved as id2label.
    """

    last_layer_at = "first"

    def __init__(self, config: BertConfig, num_labels: int | None = None) -> None:
        super().__init__()
        self.config = config = _with_labels(config, num_labels)
        self.bert = BertModel(config)
        self.dropout = Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights(skip_prefix="bert")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> ClassifierOutput:
        pooled = self.bert(input_ids, attention_mask, token_type_ids, only_at="first").pooler_output
        return ClassifierOutput(logits=self.classifier(self.dropout(pooled)))  # (B, num_labels)


class BertForMultipleChoice(BertPreTrainedModel):
    """Scores C candidate sequences per example: inputs (B, C, S) -> logits (B, C)."""

    last_layer_at = "first"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights(skip_prefix="bert")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> ClassifierOutput:
        b, c, s = input_ids.shape
        # Every choice is an independent sequence: (B, C, S) -> (B*C, S).
        flat = [t.reshape(b * c, s) if t is not None else None for t in (input_ids, attention_mask, token_type_ids)]
        pooled = self.bert(*flat, only_at="first").pooler_output  # (B*C, H)
        return ClassifierOutput(logits=self.classifier(self.dropout(pooled)).view(b, c))


class BertForTokenClassification(BertPreTrainedModel):
    """Encoder (no pooler) + dropout + per-token ``classifier``: logits (B, S, num_labels)."""

    def __init__(self, config: BertConfig, num_labels: int | None = None) -> None:
        super().__init__()
        self.config = config = _with_labels(config, num_labels)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights(skip_prefix="bert")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> ClassifierOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return ClassifierOutput(logits=self.classifier(self.dropout(hidden)))


MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (BertModel, BertForPreTraining, BertForMaskedLM, BertForQuestionAnswering,
                BertForSequenceClassification, BertForMultipleChoice, BertForTokenClassification)
}
"""Class name (as written in config.json ``architectures``) -> bertforge class."""
