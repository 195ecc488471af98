"""``ModernBertConfig``: the shape of a ModernBERT model, readable and writable as a Hugging Face
config.json.

Field names and meanings are those of ``transformers.ModernBertConfig``. Two config.json dialects
exist and both are read:

* the published checkpoints' (answerdotai/ModernBERT-base, transformers 4.x): the layer pattern
  as ``global_attn_every_n_layers`` and the RoPE bases as ``global_rope_theta`` /
  ``local_rope_theta``;
* transformers 5.x's: an explicit ``layer_types`` list ("full_attention" / "sliding_attention"
  per layer) and ``rope_parameters`` per layer type.

The fields are the published names (plus ``layer_types`` for a pattern that is not "every n-th
layer global"); config.json gets both dialects written, so either transformers generation
builds the same model from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from bertforge.errors import ConfigError
from bertforge.models.config_base import ModelConfig, head_split
from bertforge.models.shapes import ModelShape, Stack

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")
GLOBAL, LOCAL = "full_attention", "sliding_attention"
POOLINGS = ("cls", "mean")


def _modernbert(layers: int, hidden: int, heads: int, ffn: int) -> dict[str, Any]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": ffn}


MODERNBERT_PRESETS: dict[str, dict[str, Any]] = {
    # answerdotai/ModernBERT-base and -large: 50368-token BPE vocabulary, 8192 positions, a
    # 128-token window, every third layer global, RoPE bases 160000 (global) / 10000 (local):
    # the ModernBertConfig defaults, which the fields not listed here keep.
    "modernbert-base": _modernbert(22, 768, 12, 1152),
    "modernbert-large": _modernbert(28, 1024, 16, 2624),
    # CPU-sized, for tests and debug runs: a 16-token window (8 each side) so that short
    # sequences already exercise the sliding-window layers.
    "modernbert-tiny": {**_modernbert(3, 64, 4, 96), "local_attention": 16,
                        "max_position_embeddings": 512},
}
"""Named ModernBERT shapes (``ModernBertConfig`` fields); ``bertforge.models.presets`` lists BERT's."""


@dataclass
class ModernBertConfig(ModelConfig):
    """Hyper-parameters of a ModernBERT encoder and its heads (transformers compatible)."""

    model_type: ClassVar[str] = "modernbert"
    presets: ClassVar[dict[str, dict[str, Any]]] = MODERNBERT_PRESETS
    hf_default_num_labels: ClassVar[int] = 2

    vocab_size: int = 50368
    """Rows of the token embedding (and of the MLM decoder tied to it)."""
    hidden_size: int = 768
    """Width of every hidden state."""
    intermediate_size: int = 1152
    """Width of the GeGLU feed-forward layer (``mlp.Wi`` projects to twice this: input, gate)."""
    num_hidden_layers: int = 22
    """Number of transformer layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide ``hidden_size``."""
    hidden_activation: str = "gelu"
    """Activation of the GLU's input half: gelu (exact), gelu_new / gelu_pytorch_tanh (tanh
    form), relu, silu."""
    max_position_embeddings: int = 8192
    """Longest sequence the model was trained for (RoPE has no table: a limit, not a shape)."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated-normal initialisation of input projections."""
    initializer_cutoff_factor: float = 2.0
    """Initial weights are truncated at this many standard deviations."""
    norm_eps: float = 1e-5
    """Epsilon of every LayerNorm."""
    norm_bias: bool = False
    """LayerNorms have a bias."""
    pad_token_id: int | None = 50283
    """Id of the padding token (its embedding row gets no gradient)."""
    eos_token_id: int | None = 50282
    """End-of-sequence id ([SEP] in ModernBERT's tokenizer)."""
    bos_token_id: int | None = 50281
    """Beginning-of-sequence id ([CLS])."""
    cls_token_id: int | None = 50281
    """Id of [CLS]."""
    sep_token_id: int | None = 50282
    """Id of [SEP]."""
    global_rope_theta: float = 160000.0
    """RoPE base of the global (full attention) layers."""
    local_rope_theta: float = 10000.0
    """RoPE base of the sliding-window layers."""
    global_attn_every_n_layers: int = 3
    """Layer i attends globally when ``i % n == 0``, within the window otherwise."""
    layer_types: list[str] | None = None
    """Explicit pattern, "full_attention" or "sliding_attention" per layer; None: the one
    ``global_attn_every_n_layers`` gives (what presets and published checkpoints use)."""
    local_attention: int = 128
    """Sliding window width: a token sees the tokens at most ``local_attention // 2`` away."""
    attention_bias: bool = False
    """The attention projections (``Wqkv``, ``Wo``) have biases."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities and on the attention output."""
    embedding_dropout: float = 0.0
    """Dropout after the embedding LayerNorm."""
    mlp_bias: bool = False
    """The feed-forward projections (``Wi``, ``Wo``) have biases."""
    mlp_dropout: float = 0.0
    """Dropout inside the feed-forward block."""
    decoder_bias: bool = True
    """The MLM decoder has a bias."""
    classifier_pooling: str = "cls"
    """Sequence vector of classifiers: "cls" (first token) or "mean" (mean of the real tokens)."""
    classifier_dropout: float = 0.0
    """Dropout before the classifier."""
    classifier_bias: bool = False
    """The prediction head's dense layer (``head.dense``) has a bias."""
    classifier_activation: str = "gelu"
    """Activation of the prediction head (MLM and classifiers)."""
    num_labels: int = 2
    """Outputs of sequence/token classification heads (stored as id2label in config.json)."""
    id2label: dict[int, str] | None = None
    """Optional label names, index -> name; its length must equal ``num_labels``."""
    architectures: list[str] | None = None
    """Class names the checkpoint was saved from (written by ``save_pretrained``)."""
    finetuning_task: str | None = None
    """The task a fine-tuned model was trained for; None otherwise."""
    problem_type: str | None = None
    """transformers' name for a classifier's loss ("regression", "single_label_classification")."""

    def __post_init__(self) -> None:
        self._validate()
        self._normalize_labels()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        name = type(self).__name__
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings", "num_labels",
                    "global_attn_every_n_layers", "local_attention"):
            self.check_int(key, 1)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{name}.hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}: choose a head count that divides it (e.g. "
                f"{head_split(self.hidden_size)})")
        if self.head_dim % 2:
            raise ConfigError(f"{name}: heads of {self.head_dim} dimensions; rotary position "
                              "embeddings need an even head width")
        for key in ("hidden_activation", "classifier_activation"):
            if getattr(self, key) not in ACTIVATIONS:
                raise ConfigError(f"{name}.{key}={getattr(self, key)!r} is not supported; use "
                                  f"one of {', '.join(ACTIVATIONS)}")
        if self.classifier_pooling not in POOLINGS:
            raise ConfigError(f"{name}.classifier_pooling={self.classifier_pooling!r}: use "
                              "'cls' or 'mean'")
        for key in ("attention_dropout", "embedding_dropout", "mlp_dropout",
                    "classifier_dropout"):
            self.check_probability(key)
        for key in ("initializer_range", "initializer_cutoff_factor", "norm_eps",
                    "global_rope_theta", "local_rope_theta"):
            self.check_positive(key)
        for key in ("pad_token_id", "eos_token_id", "bos_token_id", "cls_token_id",
                    "sep_token_id"):
            self.check_token_id(key)
        self._validate_layer_types()

    def _validate_layer_types(self) -> None:
        if self.layer_types is None:
            return
        kinds = self.layer_types
        if (not isinstance(kinds, list) or len(kinds) != self.num_hidden_layers
                or any(k not in (GLOBAL, LOCAL) for k in kinds)):
            raise ConfigError(
                f"{type(self).__name__}.layer_types must list '{GLOBAL}' or '{LOCAL}' for each "
                f"of the {self.num_hidden_layers} layers, got {kinds!r}")

    # ------------------------------------------------------------------ derived values
    @property
    def head_dim(self) -> int:
        """Width of one attention head (the rotary dimension too)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def window(self) -> int:
        """Half width of the sliding window: |i - j| <= window within a local layer."""
        return self.local_attention // 2

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding matrix: ``vocab_size`` (ModernBERT's vocabulary is padded to a
        multiple of 64 in the tokenizer already; nothing is added here)."""
        return self.vocab_size

    def resolved_layer_types(self) -> list[str]:
        """"full_attention" or "sliding_attention" for each layer."""
        if self.layer_types is not None:
            return list(self.layer_types)
        n = self.global_attn_every_n_layers
        return [GLOBAL if i % n == 0 else LOCAL for i in range(self.num_hidden_layers)]

    def num_parameters(self) -> int:
        """Trainable parameters of ``ModernBertForMaskedLM`` (decoder tied to the embedding)."""
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        norm = h * (2 if self.norm_bias else 1)
        attn = 4 * h * h + (4 * h if self.attention_bias else 0)
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        # embedding + its norm, layers with 2 norms (layer 0: 1, no attn_norm), final norm
        body = self.vocab_size * h + layers * (attn + mlp + 2 * norm) + norm
        head = h * h + (h if self.classifier_bias else 0) + norm
        return body + head + (self.vocab_size if self.decoder_bias else 0)

    def shape_summary(self) -> str:
        """The fields that decide the model's size, for messages."""
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"num_hidden_layers={self.num_hidden_layers}, vocab_size={self.vocab_size}")

    # ------------------------------------------------------------------ serialisation
    def extra_json(self) -> dict[str, Any]:
        """transformers 5.x's spelling of the layer pattern and RoPE bases, next to the
        published one, so that both generations read the same model."""
        return {
            "layer_types": self.resolved_layer_types(),
            "rope_parameters": {GLOBAL: {"rope_type": "default",
                                         "rope_theta": self.global_rope_theta},
                                LOCAL: {"rope_type": "default",
                                        "rope_theta": self.local_rope_theta}},
        }

    @classmethod
    def check_hf_semantics(cls, data: dict[str, Any]) -> dict[str, Any]:
        return translate_hf_keys(data)


def translate_hf_keys(data: dict[str, Any]) -> dict[str, Any]:
    """transformers 5.x keys -> the published ones; ConfigError for settings that would change
    the computation in ways bertforge lacks (other RoPE types, untied decoder, another head
    width)."""
    data = dict(data)
    if data.get("model_type", "modernbert") != "modernbert":
        raise ConfigError(f"model_type is '{data['model_type']}', not 'modernbert': this is not "
                          "a ModernBERT checkpoint")
    if data.get("tie_word_embeddings", True) is False:
        raise ConfigError("tie_word_embeddings=false is not supported: bertforge ties the MLM "
                          "decoder to the token embeddings")
    if data.get("rope_scaling"):
        raise ConfigError(f"rope_scaling={data['rope_scaling']!r} is not supported (bertforge "
                          "implements default RoPE only)")
    heads, hidden = data.get("num_attention_heads", 12), data.get("hidden_size", 768)
    if data.get("head_dim") not in (None, hidden // max(heads, 1)):
        raise ConfigError(f"head_dim={data['head_dim']} differs from hidden_size / "
                          "num_attention_heads: not supported")
    rope = data.pop("rope_parameters", None) or {}
    for kind, key in ((GLOBAL, "global_rope_theta"), (LOCAL, "local_rope_theta")):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"rope_parameters[{kind!r}] has rope_type "
                              f"{params['rope_type']!r}; bertforge implements 'default' only")
        if "rope_theta" in params:
            data[key] = params["rope_theta"]
    kinds = data.get("layer_types")
    if isinstance(kinds, list):
        every, layers = data.get("global_attn_every_n_layers", 3), data.get("num_hidden_layers", 22)
        if kinds == [GLOBAL if i % every == 0 else LOCAL for i in range(layers)]:
            data["layer_types"] = None  # the plain pattern: keep the config editable
    return data


def modernbert_shape(config: Any) -> ModelShape:
    """ModernBERT: GeGLU feed-forward, global and sliding-window layers (``layer_types``), an
    MLM head with its dense transform, no pooler or NSP head."""
    windows = tuple(None if kind == "full_attention" else config.window
                    for kind in config.resolved_layer_types())
    return ModelShape(
        hidden=config.hidden_size, vocab=config.vocab_size,
        encoder=Stack(config.num_hidden_layers, config.intermediate_size, glu=True,
                      windows=windows),
        parameters=config.num_parameters(), positions=config.max_position_embeddings)


__all__ = [
    "ACTIVATIONS",
    "GLOBAL",
    "LOCAL",
    "POOLINGS",
    "ModernBertConfig",
    "translate_hf_keys",
    "modernbert_shape",
]
