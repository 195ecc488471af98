"""ModernBERT with task heads: masked LM, sequence / token classification, QA, multiple choice.

Module names (``model``, ``head``, ``decoder``, ``drop``, ``classifier``) are transformers', so
each class reads and writes the checkpoint of the transformers class of the same name. Every
head starts with ``head`` (dense -> activation -> LayerNorm, the "prediction head"), as in
transformers. Models return logits only (the BERT heads' output classes); losses live with the
training code.

Per-token heads run on the layout the encoder ran in (the real tokens of an unpadded pass) and
pad their logits once at the end. Sequence heads pool each sequence ("cls": its first token,
"mean": the mean of its real tokens; one vector per packed sequence in packed rows).
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.models.heads import (
    ClassifierOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
)
from bertforge.models.modernbert import (
    ModernBertModel,
    ModernBertModelOutput,
    ModernBertPreTrainedModel,
    activation,
    layer_norm,
)
from bertforge.models.modernbert_config import ModernBertConfig
from bertforge.ops.dropout import Dropout
from bertforge.ops.unpad import RowLayout, TokenLayout, token_layout


class ModernBertPredictionHead(nn.Module):
    """dense -> ``classifier_activation`` -> LayerNorm, before the decoder or a classifier."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden)))


def _token_means(states: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """(T, H) real-token states -> (N, H) mean of each sequence."""
    sums = states.new_zeros((layout.num_sequences, states.shape[-1]))
    sums = sums.index_add(0, layout.sequence_of_token(), states)
    return sums / layout.lengths().to(states.dtype)[:, None]


def pool(out: ModernBertModelOutput, how: str, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(N, H) one vector per sequence: its first token ("cls") or the mean of its real tokens
    ("mean", transformers' masked mean)."""
    layout, states = out.layout, out.states
    if how == "cls":
        return layout.first_tokens(states)
    if isinstance(layout, TokenLayout):
        return _token_means(states, layout)
    mask = attention_mask if attention_mask is not None else states.new_ones(layout.shape)
    if isinstance(layout, RowLayout) and layout.positions is not None:  # packed padded rows
        tokens = token_layout(mask, layout.positions)
        return _token_means(tokens.unpad(states), tokens)
    weights = mask.to(states.dtype).unsqueeze(-1)                      # (B, S, 1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1)


def _with_labels(config: ModernBertConfig, num_labels: int | None) -> ModernBertConfig:
    if num_labels is None or num_labels == config.num_labels:
        return config
    return config.replace(num_labels=num_labels)


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """Encoder + prediction head + ``decoder`` (tied to the token embeddings; bias per
    ``decoder_bias``). The masked-LM and pretraining head of the family."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight
        self.init_weights(skip_prefix="model")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> MaskedLMOutput:
        """(B, S) inputs -> logits (B, S, vocab_size), or (N, vocab_size) at the N
        ``masked_positions`` ((B, S) bool or flat int64 ``row * S + column``, as
        ``BertForMaskedLM``): the decoder, the costliest matmul, runs where it is scored."""
        out = self.model(input_ids, attention_mask, position_ids, layout)
        return MaskedLMOutput(logits=self.decoder(self.head(out.select(masked_positions))))


class _Classifier(ModernBertPreTrainedModel):
    """Encoder + prediction head + dropout + a linear classifier of ``outputs`` (transformers'
    layout of every ModernBERT classifier)."""

    def __init__(self, config: ModernBertConfig, outputs: int) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.init_weights(skip_prefix="model")


class _PooledClassifier(_Classifier):
    """A classifier of each sequence, pooled as ``classifier_pooling`` says."""

    def scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               position_ids: torch.Tensor | None, layout: TokenLayout | None) -> torch.Tensor:
        """(B, S) -> (N, outputs), one row per sequence."""
        out = self.model(input_ids, attention_mask, position_ids, layout)
        pooled = pool(out, self.config.classifier_pooling, attention_mask)
        return self.classifier(self.drop(self.head(pooled)))


class ModernBertForSequenceClassification(_PooledClassifier):
    """Logits (B, num_labels) per sequence (N rows for packed rows). ``num_labels`` (default:
    ``config.num_labels``) is stored in ``self.config`` and saved as id2label."""

    def __init__(self, config: ModernBertConfig, num_labels: int | None = None) -> None:
        config = _with_labels(config, num_labels)
        super().__init__(config, config.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> ClassifierOutput:
        return ClassifierOutput(logits=self.scores(input_ids, attention_mask, position_ids, layout))


class ModernBertForMultipleChoice(_PooledClassifier):
    """Scores C candidate sequences per example: inputs (B, C, S) -> logits (B, C)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(config, 1)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> ClassifierOutput:
        b, c, s = input_ids.shape
        # Every choice is an independent sequence: (B, C, S) -> (B*C, S).
        mask = attention_mask.reshape(b * c, s) if attention_mask is not None else None
        scores = self.scores(input_ids.reshape(b * c, s), mask, None, None)   # (B*C, 1)
        return ClassifierOutput(logits=scores.view(b, c))


class _TokenHead(_Classifier):
    """A classifier at every token; logits padded once at the end, (B, S, outputs) (zeros at
    padding after an unpadded pass)."""

    def token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     position_ids: torch.Tensor | None,
                     layout: TokenLayout | None) -> torch.Tensor:
        out = self.model(input_ids, attention_mask, position_ids, layout)
        return out.layout.exit(self.classifier(self.drop(self.head(out.states))))


class ModernBertForTokenClassification(_TokenHead):
    """Per-token logits (B, S, num_labels)."""

    def __init__(self, config: ModernBertConfig, num_labels: int | None = None) -> None:
        config = _with_labels(config, num_labels)
        super().__init__(config, config.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> ClassifierOutput:
        return ClassifierOutput(logits=self.token_scores(input_ids, attention_mask,
                                                         position_ids, layout))


class ModernBertForQuestionAnswering(_TokenHead):
    """Span scores: ``classifier`` (H -> 2: start, end). transformers sizes that layer by
    ``num_labels``, so the config is saved with ``num_labels=2``."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__(_with_labels(config, 2), 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> QuestionAnsweringOutput:
        logits = self.token_scores(input_ids, attention_mask, position_ids, layout)
        start, end = logits.unbind(dim=-1)                             # (B, S, 2) -> 2 x (B, S)
        return QuestionAnsweringOutput(start_logits=start, end_logits=end)


MODERNBERT_CLASSES: dict[str, type[ModernBertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
                ModernBertForTokenClassification, ModernBertForQuestionAnswering,
                ModernBertForMultipleChoice)
}
"""Class name (config.json ``architectures``) -> bertforge class."""

__all__ = ["MODERNBERT_CLASSES", "ModernBertForMaskedLM", "ModernBertForMultipleChoice",
           "ModernBertForQuestionAnswering", "ModernBertForSequenceClassification",
           "ModernBertForTokenClassification", "ModernBertPredictionHead", "pool"]
