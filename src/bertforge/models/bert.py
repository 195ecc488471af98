"""BERT: embeddings, layers, encoder, pooler, task heads and initialisation, in one file.

Plain ``nn.Linear``/``nn.Dropout``/``nn.LayerNorm`` and one call into the shared attention
function (``bertforge.ops.attention.attend``: SDPA over padded rows, a variable-length kernel
over unpadded tokens). Speed is applied from outside (``bertforge.speed``): unpadding flags,
CPU kernels and the partial last layer; this file knows nothing of them.

Module and parameter names are Hugging Face's, so ``state_dict()`` *is* the transformers
checkpoint of the class of the same name (embedding rows are padded to
``config.padded_vocab_size``; ``save_pretrained`` trims them). Models return logits only;
losses live with the training code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertforge.errors import DataError
from bertforge.models.config import BertConfig
from bertforge.models.hub import PreTrainedModel
from bertforge.models.outputs import (
    BertModelOutput,
    BertPreTrainingOutput,
    ClassifierOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
)
from bertforge.ops.attention import Attend, attend
from bertforge.ops.unpad import TokenLayout, batch_layout

ACT2FN = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}
"""``config.hidden_act`` -> the function (the names ``BertConfig`` accepts)."""


class BertPreTrainedModel(PreTrainedModel):
    """Base of all BERT classes: BERT's names for the generic loading code, and its weight
    initialisation."""

    config: BertConfig
    config_class = BertConfig
    checkpoint_prefix = "bert"
    base_model_prefix = "bert"
    body_prefixes = ("embeddings.", "encoder.", "pooler.")
    head_prefixes = ("bert.pooler.", "pooler.", "cls.predictions.", "cls.seq_relationship.",
                     "qa_outputs.", "classifier.")
    tied_keys = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
    vocab_row_suffixes = ("embeddings.word_embeddings.weight", "cls.predictions.bias")
    # A fill-mask or QA model never uses the pooler, and transformers omits it from such files.
    optional_prefixes = ("bert.pooler.", "pooler.")

    def init_weights(self, skip_prefix: str | None = None) -> None:
        """Weights ~ N(0, initializer_range), biases 0, LayerNorm 1/0; embedding rows past
        ``vocab_size`` and the [PAD] row zeroed. ``skip_prefix`` names a submodule already
        initialised by its own constructor (the encoder inside task models)."""
        self.normal_init_(self.config.initializer_range, skip_prefix)
        with torch.no_grad():
            # A tied decoder re-draws the embedding matrix above, so the zero rows are set last.
            emb = self.word_embeddings()
            emb.weight[self.config.vocab_size :].zero_()
            if emb.padding_idx is not None:
                emb.weight[emb.padding_idx].zero_()

    def word_embeddings(self) -> nn.Embedding:
        """The (padded_vocab_size, H) input embedding table."""
        base = getattr(self, self.base_model_prefix) if self.base_model_prefix else self
        return base.embeddings.word_embeddings

    def rename_legacy(self, name: str) -> str:
        # TensorFlow checkpoints name LayerNorm's parameters gamma and beta.
        if name.endswith("LayerNorm.gamma"):
            return name[: -len("gamma")] + "weight"
        if name.endswith("LayerNorm.beta"):
            return name[: -len("beta")] + "bias"
        return name

    def normalize_legacy(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Older checkpoints store the MLM bias only as the decoder's bias.
        if "cls.predictions.decoder.bias" in tensors and "cls.predictions.bias" not in tensors:
            tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]
        return tensors

    def mismatch_hints(self, names: list[str]) -> list[str]:
        if any("final_layer_norm" in k for k in names):
            return ["The checkpoint and config.json disagree on pre_layernorm."]
        return []


# ---------------------------------------------------------------------------- the encoder
class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Not saved (persistent=False) so the state dict matches transformers' current layout.
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings)[None],
                             persistent=False)

    def check_length(self, seq_len: int) -> None:
        """DataError when rows of ``seq_len`` tokens do not fit the position table."""
        max_len = self.position_embeddings.num_embeddings
        if seq_len > max_len:
            raise DataError(
                f"input has {seq_len} tokens per sequence but the model's max_position_embeddings is "
                f"{max_len}: truncate inputs to at most {max_len} tokens (e.g. lower --max-seq-length)")

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, S) int64 ids, or (T,) unpadded tokens with their ``position_ids`` -> (..., H).
        Positions default to the columns."""
        if position_ids is None:
            position_ids = self.position_ids[:, : input_ids.shape[-1]]
        emb = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if token_type_ids is None:
            emb = emb + self.token_type_embeddings.weight[0]  # all segment 0; skip the gather
        else:
            emb = emb + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(emb))


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention (the output projection is ``BertSelfOutput``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.dropout_p = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.varlen_backend = "auto"
        """Kernel for unpadded tokens (``ops.attention.BACKENDS``), set by ``bertforge.speed``."""

    def heads(self, proj: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., heads, head_dim)."""
        return proj(hidden).unflatten(-1, (self.num_heads, self.head_dim))

    def forward(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        """(B, S, H) with a (B, 1, 1 or S, S) bool keep mask or None, or unpadded (T, H) with
        its ``TokenLayout`` -> the context, shaped as ``hidden``."""
        q, k, v = (self.heads(p, hidden) for p in (self.query, self.key, self.value))
        p = self.dropout_p if self.training else 0.0
        return attend(q, k, v, where, p, self.varlen_backend).flatten(-2)


class BertResidualOutput(nn.Module):
    """Projection + dropout + residual, with the LayerNorm placed for post-LN or pre-LN.

    Post-LN (original BERT): ``LayerNorm(residual + dropout(dense(x)))``. Pre-LN: the caller
    normalises the branch input (``normalize_input``) and this returns
    ``residual + dropout(dense(x))``; one LayerNorm per block either way keeps the names.
    """

    def __init__(self, in_features: int, config: BertConfig) -> None:
        super().__init__()
        self.pre_layernorm = config.pre_layernorm
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def normalize_input(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(hidden) if self.pre_layernorm else hidden

    def forward(self, branch: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out = residual + self.dropout(self.dense(branch))
        return out if self.pre_layernorm else self.LayerNorm(out)


class BertSelfOutput(BertResidualOutput):
    """Output projection of the attention block (``attention.output``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config.hidden_size, config)


class BertAttention(nn.Module):
    """``attention.self`` + ``attention.output``: the attention half of a layer, residual included."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        return self.output(self.self(self.output.normalize_input(hidden), where), hidden)


class BertIntermediate(nn.Module):
    """First half of the feed-forward block: dense H -> intermediate, then the activation."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden))


class BertOutput(BertResidualOutput):
    """Second half of the feed-forward block (``output.dense``/``output.LayerNorm``), residual included."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config.intermediate_size, config)


class BertLayer(nn.Module):
    """One transformer layer: attention block then feed-forward block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        """(B, S, H) with a keep mask, or (T, H) with a ``TokenLayout`` -> the same shape."""
        hidden = self.attention(hidden, where)
        return self.output(self.intermediate(self.output.normalize_input(hidden)), hidden)


class BertEncoder(nn.Module):
    """The stack of layers; pre-LN models end with ``final_layer_norm`` (absent in post-LN models)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        if config.pre_layernorm:  # a pre-LN residual stream is never normalised inside the layers
            self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        """Recompute each layer's activations in backward instead of storing them (training)."""

    def forward(self, hidden: torch.Tensor, where: Attend) -> torch.Tensor:
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layer:
            hidden = (checkpoint(layer, hidden, where, use_reentrant=False) if recompute
                      else layer(hidden, where))
        if hasattr(self, "final_layer_norm"):
            hidden = self.final_layer_norm(hidden)
        return hidden


class BertPooler(nn.Module):
    """tanh(dense(hidden state of the first token)), the sentence vector NSP and classifiers use."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """(N, H) hidden states of each sequence's first token -> (N, H)."""
        return torch.tanh(self.dense(first))


class BertModel(BertPreTrainedModel):
    """The bare encoder: ``forward`` -> ``BertModelOutput(last_hidden_state, pooler_output)``.

    ``add_pooling_layer=False`` omits the pooler (task models that never use it, as
    transformers). ``unpad`` (off by default; ``bertforge.speed`` sets it) runs the layers on the
    real tokens only (``bertforge.ops.unpad``): the same outputs at real tokens, no work on padding.
    """

    base_model_prefix = ""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.unpad = False
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> BertModelOutput:
        """input_ids, attention_mask (1 = real token), token_type_ids: (B, S) -> BertModelOutput.

        ``position_ids`` (B, S) mark packed rows: several sequences per row, each starting at
        position 0 and attending only to itself. ``layout`` is the batch's ``TokenLayout`` when
        the loader computed it (it saves finding it, and the device syncs that costs).
        """
        # Padded rows or the real tokens only: the same code, the layout moves the states.
        where = batch_layout(input_ids, attention_mask, position_ids, layout, unpad=self.unpad)
        self.embeddings.check_length(input_ids.shape[-1])
        hidden = self.embeddings(where.enter(input_ids), where.enter(token_type_ids),
                                 where.positions)                 # (B, S, H) or (T, H)
        hidden = self.encoder(hidden, where.attend)
        pooled = self.pooler(where.first_tokens(hidden)) if self.pooler is not None else None
        return BertModelOutput(pooler_output=pooled, states=hidden, layout=where)


# ---------------------------------------------------------------------------- the heads
class BertPredictionHeadTransform(nn.Module):
    """dense -> activation -> LayerNorm applied before the vocabulary projection."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    """Vocabulary scores: transform, then the decoder whose weight is the word-embedding matrix.
    ``decoder.weight``/``decoder.bias`` alias the word embeddings (tied by the owning model) and
    ``bias``; the checkpoint stores only ``cls.predictions.bias``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.padded_vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., vocab_size): the matmul over the padded rows (tensor-core friendly),
        the padding columns sliced off (a view)."""
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


def _with_labels(config: BertConfig, num_labels: int | None) -> BertConfig:
    return config if num_labels is None or num_labels == config.num_labels else config.replace(num_labels=num_labels)


class BertForPreTraining(BertPreTrainedModel):
    """Encoder + MLM and NSP heads (``cls.predictions``, ``cls.seq_relationship``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.init_weights(skip_prefix="bert")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> BertPreTrainingOutput:
        """(B, S) inputs; ``masked_positions`` ((B, S) bool, or flat int64 positions) limits the
        MLM logits to those positions. ``position_ids``/``layout``: as ``BertModel``; NSP logits
        are per sequence, (N, 2), for packed rows."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, layout)
        mlm = self.cls.predictions(out.select(masked_positions))
        return BertPreTrainingOutput(mlm_logits=mlm, nsp_logits=self.cls.seq_relationship(out.pooler_output))


class BertForMaskedLM(BertPreTrainedModel):
    """Encoder (no pooler) + MLM head (``cls.predictions``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.init_weights(skip_prefix="bert")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                layout: TokenLayout | None = None) -> MaskedLMOutput:
        """As ``BertForPreTraining.forward``, without the NSP head."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, layout)
        return MaskedLMOutput(logits=self.cls.predictions(out.select(masked_positions)))


class BertForQuestionAnswering(BertPreTrainedModel):
    """Encoder (no pooler) + span head ``qa_outputs`` (H -> 2: start, end)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights(skip_prefix="bert")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> QuestionAnsweringOutput:
        logits = self.qa_outputs(self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state)
        start, end = logits.unbind(dim=-1)  # (B, S, 2) -> 2 x (B, S)
        return QuestionAnsweringOutput(start_logits=start, end_logits=end)


class BertForSequenceClassification(BertPreTrainedModel):
    """Encoder + dropout + ``classifier`` on the pooled [CLS] vector. ``num_labels`` (default:
    ``config.num_labels``) is stored in ``self.config`` and saved as id2label."""

    def __init__(self, config: BertConfig, num_labels: int | None = None) -> None:
        super().__init__()
        self.config = config = _with_labels(config, num_labels)
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights(skip_prefix="bert")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> ClassifierOutput:
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output
        return ClassifierOutput(logits=self.classifier(self.dropout(pooled)))  # (B, num_labels)


class BertForMultipleChoice(BertPreTrainedModel):
    """Scores C candidate sequences per example: inputs (B, C, S) -> logits (B, C)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights(skip_prefix="bert")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> ClassifierOutput:
        b, c, s = input_ids.shape
        # Every choice is an independent sequence: (B, C, S) -> (B*C, S).
        flat = [t.reshape(b * c, s) if t is not None else None
                for t in (input_ids, attention_mask, token_type_ids)]
        pooled = self.bert(*flat).pooler_output  # (B*C, H)
        return ClassifierOutput(logits=self.classifier(self.dropout(pooled)).view(b, c))


class BertForTokenClassification(BertPreTrainedModel):
    """Encoder (no pooler) + dropout + per-token ``classifier``: logits (B, S, num_labels)."""

    def __init__(self, config: BertConfig, num_labels: int | None = None) -> None:
        super().__init__()
        self.config = config = _with_labels(config, num_labels)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights(skip_prefix="bert")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> ClassifierOutput:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return ClassifierOutput(logits=self.classifier(self.dropout(hidden)))


MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (BertModel, BertForPreTraining, BertForMaskedLM, BertForQuestionAnswering,
                BertForSequenceClassification, BertForMultipleChoice, BertForTokenClassification)
}
"""Class name (as written in config.json ``architectures``) -> bertforge class."""
