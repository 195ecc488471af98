"""``BartConfig``: the shape of a BART model, readable and writable as a Hugging Face config.json.

Field names and meanings are those of ``transformers.BartConfig``. One field is bertforge's own:
``normalize_before`` builds Pre-LN layers (LayerNorm at the input of every residual branch) with
a final LayerNorm after each stack. That is exactly mBART's layout, so a Pre-LN model is saved
with ``model_type: mbart`` and loads in transformers as an mBART model; an mBART config.json
loads here as a Pre-LN BART.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from bertforge.errors import ConfigError
from bertforge.models.config_base import ModelConfig, head_split
from bertforge.models.shapes import ModelShape, Stack

ACTIVATIONS = ("gelu", "gelu_new", "relu", "tanh")


def _shape(layers: int, d_model: int, heads: int, ffn: int) -> dict[str, Any]:
    return {"encoder_layers": layers, "decoder_layers": layers, "d_model": d_model,
            "encoder_attention_heads": heads, "decoder_attention_heads": heads,
            "encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn}


BART_PRESETS: dict[str, dict[str, Any]] = {
    # facebook/bart-base and facebook/bart-large: GPT-2 byte-level BPE, 50265 tokens, 1024 positions.
    "bart-base": _shape(6, 768, 12, 3072),
    "bart-large": _shape(12, 1024, 16, 4096),
    # NVIDIA's BART recipes train the Pre-LN layout (LayerNorm at each branch input).
    "bart-base-preln": {**_shape(6, 768, 12, 3072), "normalize_before": True},
    "bart-large-preln": {**_shape(12, 1024, 16, 4096), "normalize_before": True},
    # A CPU-sized model for the demo and debug recipes: Pre-LN and no dropout, which left the
    # unigram plateau within 100 steps of the debug recipe where post-LN variants stayed on it
    # for the 170 to 240 steps they ran (docs/bart.md).
    "bart-tiny": {**_shape(2, 128, 2, 512), "max_position_embeddings": 512,
                  "normalize_before": True, "dropout": 0.0},
}


@dataclass
class BartConfig(ModelConfig):
    """Hyper-parameters of a BART encoder-decoder and its heads (transformers compatible)."""

    model_type: ClassVar[str] = "bart"
    presets: ClassVar[dict[str, dict[str, Any]]] = BART_PRESETS
    hf_default_num_labels: ClassVar[int] = 3

    vocab_size: int = 50265
    """Tokens of the vocabulary (rows of the shared embedding)."""
    max_position_embeddings: int = 1024
    """Longest source or target sequence (the position tables hold 2 more rows: BART's offset)."""
    d_model: int = 1024
    """Width of every hidden state."""
    encoder_layers: int = 12
    """Encoder layers."""
    decoder_layers: int = 12
    """Decoder layers."""
    encoder_attention_heads: int = 16
    """Attention heads per encoder layer; must divide d_model."""
    decoder_attention_heads: int = 16
    """Attention heads per decoder layer (self- and cross-attention); must divide d_model."""
    encoder_ffn_dim: int = 4096
    """Width of the encoder's feed-forward layers."""
    decoder_ffn_dim: int = 4096
    """Width of the decoder's feed-forward layers."""
    activation_function: str = "gelu"
    """Feed-forward activation: gelu (exact), gelu_new (tanh form), relu, tanh."""
    dropout: float = 0.1
    """Dropout after embeddings and on every residual branch."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    activation_dropout: float = 0.0
    """Dropout after the feed-forward activation."""
    classifier_dropout: float = 0.0
    """Dropout inside the sequence-classification head."""
    init_std: float = 0.02
    """Standard deviation of the normal weight initialisation."""
    scale_embedding: bool = False
    """Multiply token embeddings by sqrt(d_model) (False in bart-base/large)."""
    normalize_before: bool = False
    """Pre-LN layers with a final LayerNorm per stack (mBART's layout); bertforge's field."""
    pad_token_id: int = 1
    """Id of <pad>; its embedding row starts at zero and receives no gradient."""
    bos_token_id: int = 0
    """Id of <s>."""
    eos_token_id: int = 2
    """Id of </s>."""
    decoder_start_token_id: int = 2
    """First decoder input (BART starts the decoder with </s>)."""
    forced_bos_token_id: int | None = 0
    """Token forced as the first generated one (BART generates <s> first), or None."""
    forced_eos_token_id: int | None = 2
    """Token forced when generation reaches its maximum length, or None."""
    num_labels: int = 3
    """Outputs of the sequence-classification head."""
    id2label: dict[int, str] | None = None
    """Optional label names, index -> name."""
    architectures: list[str] | None = None
    """Class names the checkpoint was saved from (written by ``save_pretrained``)."""
    finetuning_task: str | None = None
    """The task a fine-tuned model was trained for (e.g. "summarization"); None otherwise."""
    problem_type: str | None = None
    """transformers' name for a classifier's loss ("regression", "single_label_classification")."""

    layer_norm_eps: ClassVar[float] = 1e-5  # transformers' BART uses LayerNorm's default

    def __post_init__(self) -> None:
        self._validate()
        self._normalize_labels()

    def _validate(self) -> None:
        for name in ("vocab_size", "max_position_embeddings", "d_model", "encoder_layers",
                     "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                     "encoder_ffn_dim", "decoder_ffn_dim", "num_labels"):
            self.check_int(name, 1)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            self.check_int(name, 0)  # required; forced_* may be None
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                     "forced_bos_token_id", "forced_eos_token_id"):
            self.check_token_id(name)
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if self.d_model % heads:
                raise ConfigError(f"BartConfig.d_model={self.d_model} is not divisible by "
                                  f"{side}_attention_heads={heads}: choose a head count that "
                                  f"divides it (e.g. {head_split(self.d_model)})")
        if self.activation_function not in ACTIVATIONS:
            raise ConfigError(f"BartConfig.activation_function={self.activation_function!r} is not "
                              f"supported; use one of {', '.join(ACTIVATIONS)}")
        for name in ("dropout", "attention_dropout", "activation_dropout", "classifier_dropout"):
            self.check_probability(name)
        self.check_positive("init_std")
        for name in ("scale_embedding", "normalize_before"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"BartConfig.{name} must be true or false, got "
                                  f"{getattr(self, name)!r}")

    # ------------------------------------------------------------------ derived values
    @property
    def hidden_size(self) -> int:
        """``d_model`` under the name the family-independent code uses."""
        return self.d_model

    @property
    def embed_scale(self) -> float:
        """Factor on token embeddings: sqrt(d_model) when ``scale_embedding``, else 1."""
        return math.sqrt(self.d_model) if self.scale_embedding else 1.0

    def num_parameters(self) -> int:
        """Trainable parameters of ``BartForConditionalGeneration`` (the LM head is tied to the
        shared embedding; ``final_logits_bias`` is a buffer)."""
        d, v, p = self.d_model, self.vocab_size, self.max_position_embeddings + 2
        attention = 4 * (d * d + d)
        enc = attention + 2 * d * self.encoder_ffn_dim + self.encoder_ffn_dim + d + 4 * d
        dec = 2 * attention + 2 * d * self.decoder_ffn_dim + self.decoder_ffn_dim + d + 6 * d
        final_norms = 4 * d if self.normalize_before else 0
        embeddings = v * d + 2 * (p * d + 2 * d)  # shared tokens; positions + LN per stack
        return embeddings + self.encoder_layers * enc + self.decoder_layers * dec + final_norms

    def shape_summary(self) -> str:
        """The fields that decide the model's size, for messages."""
        return (f"d_model={self.d_model}, encoder_layers={self.encoder_layers}, "
                f"decoder_layers={self.decoder_layers}, encoder_ffn_dim={self.encoder_ffn_dim}, "
                f"vocab_size={self.vocab_size}")

    # ------------------------------------------------------------------ transformers interop
    def json_model_type(self) -> str:
        return "mbart" if self.normalize_before else "bart"

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.normalize_before and out.get("architectures"):
            # transformers' classes of this layout are mBART's.
            out["architectures"] = ["M" + a if a.startswith("Bart") else a
                                    for a in out["architectures"]]
        out["is_encoder_decoder"] = True
        return out

    @classmethod
    def check_hf_semantics(cls, data: dict[str, Any]) -> dict[str, Any]:
        model_type = data.get("model_type", "bart")
        if model_type not in ("bart", "mbart"):
            raise ConfigError(f"model_type is '{model_type}', not 'bart' or 'mbart': this is not "
                              "a BART checkpoint")
        if model_type == "mbart":
            if data.get("normalize_before") is False:
                raise ConfigError("model_type 'mbart' is a Pre-LN layout but normalize_before is "
                                  "false")
            data = {**data, "normalize_before": True}
            if data.get("architectures"):
                data["architectures"] = [a[1:] if a.startswith("MBart") else a
                                         for a in data["architectures"]]
            data.setdefault("decoder_start_token_id", data.get("eos_token_id", 2))
        for key in ("encoder_layerdrop", "decoder_layerdrop"):
            if data.get(key, 0.0):
                raise ConfigError(f"{key}={data[key]} is not supported (bertforge runs every layer); "
                                  f"set it to 0")
        if data.get("tie_word_embeddings", True) is False:
            raise ConfigError("tie_word_embeddings=false is not supported: bertforge ties the LM "
                              "head to the shared embedding")
        for key in ("eos_token_id", "forced_eos_token_id"):
            if isinstance(data.get(key), list):
                raise ConfigError(f"{key} is a list; bertforge supports one end-of-sequence token")
        if data.get("decoder_start_token_id") is None and "decoder_start_token_id" in data:
            data = {**data, "decoder_start_token_id": data.get("eos_token_id", 2)}
        if "forced_bos_token_id" not in data and ("model_type" in data):
            # transformers' default: nothing forced (only summarization checkpoints force <s>).
            data = {**data, "forced_bos_token_id": None}
        return data


def bart_shape(config: Any) -> ModelShape:
    """BART: encoder and decoder of width ``d_model``, an LM head (tied, no transform) over
    every target token."""
    return ModelShape(
        hidden=config.d_model, vocab=config.vocab_size,
        encoder=Stack(config.encoder_layers, config.encoder_ffn_dim),
        decoder=Stack(config.decoder_layers, config.decoder_ffn_dim),
        parameters=config.num_parameters(), positions=config.max_position_embeddings,
        lm_transform=False)


__all__ = ["ACTIVATIONS", "BART_PRESETS", "BartConfig", "bart_shape"]
