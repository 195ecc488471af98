"""``BertConfig``: the shape of a BERT model, readable and writable as a Hugging Face config.json.

The field names and meanings are those of ``transformers.BertConfig`` so that a config.json moves
between the two libraries unchanged (reading, writing and presets: ``ModelConfig``). bertforge
adds three fields (``pad_vocab_size_multiple``,
``pre_layernorm``, ``do_lower_case``) that transformers stores as plain extra attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from bertforge.errors import ConfigError
from bertforge.models.config_base import ModelConfig, head_split
from bertforge.models.presets import PRESETS
from bertforge.models.shapes import ModelShape, Stack

ACTIVATIONS = ("gelu", "gelu_new", "relu")


@dataclass
class BertConfig(ModelConfig):
    """Hyper-parameters of a BERT encoder and its heads (Hugging Face ``BertConfig`` compatible)."""

    model_type: ClassVar[str] = "bert"
    presets: ClassVar[dict[str, dict[str, Any]]] = PRESETS
    hf_default_num_labels: ClassVar[int] = 2

    vocab_size: int = 30522
    """Number of real tokens in the vocabulary (rows of vocab.txt)."""
    hidden_size: int = 768
    """Width of every hidden state."""
    num_hidden_layers: int = 12
    """Number of transformer layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide ``hidden_size``."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer."""
    hidden_act: str = "gelu"
    """Feed-forward and MLM-transform activation: "gelu" (exact erf), "gelu_new" (tanh), "relu"."""
    hidden_dropout_prob: float = 0.1
    """Dropout after embeddings and after each residual branch."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the position table covers."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids."""
    initializer_range: float = 0.02
    """Standard deviation of the normal weight initialisation."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    pad_token_id: int | None = 0
    """Id of [PAD]; its embedding row starts at zero and receives no gradient."""
    classifier_dropout: float | None = None
    """Dropout before classification heads; None means ``hidden_dropout_prob``."""
    num_labels: int = 2
    """Outputs of sequence/token classification heads (stored as id2label in config.json)."""
    id2label: dict[int, str] | None = None
    """Optional label names, index -> name; its length must equal ``num_labels``."""
    architectures: list[str] | None = None
    """Class names the checkpoint was saved from (written by ``save_pretrained``)."""
    pad_vocab_size_multiple: int = 8
    """Embedding/decoder rows are rounded up to this multiple (tensor-core friendly); 1 = none."""
    pre_layernorm: bool = False
    """Pre-LN layers plus a final LayerNorm (bertforge only: transformers has no pre-LN BERT)."""
    do_lower_case: bool | None = None
    """Whether the matching tokenizer lowercases; None = unknown. Lets tokenizers check casing."""
    finetuning_task: str | None = None
    """The task a fine-tuned model was trained for (e.g. "glue/mrpc", "squad"); None otherwise."""
    problem_type: str | None = None
    """transformers' name for a classifier's loss: "regression" (one output, MSE),
    "single_label_classification", or None (unknown / not a classifier)."""

    def __post_init__(self) -> None:
        self._validate()
        self._normalize_labels()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size",
                     "num_labels", "pad_vocab_size_multiple"):
            self.check_int(name, 1)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}: choose a head count that divides it "
                f"(e.g. {head_split(self.hidden_size)})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"BertConfig.hidden_act={self.hidden_act!r} is not supported; use one of {', '.join(ACTIVATIONS)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            if not (name == "classifier_dropout" and self.classifier_dropout is None):
                self.check_probability(name)
        for name in ("initializer_range", "layer_norm_eps"):
            self.check_positive(name)
        self.check_token_id("pad_token_id")
        if not isinstance(self.pre_layernorm, bool):
            raise ConfigError(f"BertConfig.pre_layernorm must be true or false, got {self.pre_layernorm!r}")
        if self.do_lower_case is not None and not isinstance(self.do_lower_case, bool):
            raise ConfigError(f"BertConfig.do_lower_case must be true, false or null, got {self.do_lower_case!r}")

    # ------------------------------------------------------------------ derived values
    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and decoder matrices: ``vocab_size`` rounded up to the multiple."""
        m = self.pad_vocab_size_multiple
        return (self.vocab_size + m - 1) // m * m

    def num_parameters(self) -> int:
        """Trainable parameters of ``BertForPreTraining`` with this shape (the decoder is tied to
        the padded word embeddings); other heads differ by a few thousand at most."""
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        embeddings = (self.padded_vocab_size + self.max_position_embeddings
                      + self.type_vocab_size) * h + 2 * h
        layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h  # attention, FFN, 2 LNs
        heads = (h * h + h) + (h * h + 3 * h + self.padded_vocab_size) + (2 * h + 2)
        return embeddings + layers * layer + heads  # heads: pooler, MLM transform + bias, NSP

    def shape_summary(self) -> str:
        """The fields that decide the model's size, for messages."""
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_hidden_layers={self.num_hidden_layers}, vocab_size={self.vocab_size}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    # ------------------------------------------------------------------ serialisation
    def extra_json(self) -> dict[str, Any]:
        if not self.pre_layernorm:
            return {}
        return {"bertforge_only": (
            "pre_layernorm=true: transformers has no pre-LayerNorm BERT and would silently build a "
            "post-LN model from this file; load it with bertforge")}

    @classmethod
    def check_hf_semantics(cls, data: dict[str, Any]) -> dict[str, Any]:
        _check_hf_semantics(data)
        return data


def _check_hf_semantics(data: dict[str, Any]) -> None:
    """Refuse transformers settings that would change the computation in ways bertforge lacks."""
    model_type = data.get("model_type", "bert")
    if model_type != "bert":
        raise ConfigError(f"model_type is '{model_type}', not 'bert': this is not a BERT checkpoint")
    if data.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(
            f"position_embedding_type='{data['position_embedding_type']}' is not supported "
            "(bertforge implements absolute position embeddings only)"
        )
    if data.get("is_decoder") or data.get("add_cross_attention"):
        raise ConfigError("is_decoder/add_cross_attention are set: bertforge BERT is an encoder only")
    if data.get("tie_word_embeddings", True) is False:
        raise ConfigError(
            "tie_word_embeddings=false is not supported: bertforge ties the MLM decoder to the word embeddings"
        )


def bert_shape(config: Any) -> ModelShape:
    """BERT: post- or pre-LN encoder, GELU feed-forward, vocabulary padded for the MLM head,
    pooler and NSP head, a last layer that can run at the read tokens only."""
    return ModelShape(
        hidden=config.hidden_size, vocab=config.padded_vocab_size,
        encoder=Stack(config.num_hidden_layers, config.intermediate_size),
        parameters=config.num_parameters(), positions=config.max_position_embeddings,
        nsp_head=True, partial_last_layer=True)


__all__ = ["ACTIVATIONS", "BertConfig", "bert_shape"]
