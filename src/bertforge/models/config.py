"""``BertConfig``: the shape of a BERT model, readable and writable as a Hugging Face config.json.

The field names and meanings are those of ``transformers.BertConfig`` so that a config.json moves
between the two libraries unchanged. bertforge adds three fields (``pad_vocab_size_multiple``,
``pre_layernorm``, ``do_lower_case``) that transformers stores as plain extra attributes.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.errors import ConfigError
from bertforge.io import write_json_atomic
from bertforge.models.presets import PRESETS, get_preset

ACTIVATIONS = ("gelu", "gelu_new", "relu")

# Keys transformers writes into every BERT config.json that carry no meaning for an encoder-only
# BERT (or whose only meaningful value is checked in `_check_hf_semantics`). Any other unknown key
# is tolerated too when the file was written by transformers, because its configs carry many
# generic PreTrainedConfig attributes; hand-written dicts get strict checking instead.
_HF_MARKERS = ("model_type", "transformers_version", "architectures", "_name_or_path")
_BERTFORGE_DERIVED = ("bertforge_version", "bertforge_only", "label2id", "dtype", "torch_dtype")


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder and its heads (Hugging Face ``BertConfig`` compatible)."""

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
        if isinstance(self.id2label, dict):
            try:
                self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"BertConfig.id2label keys must be integers, got {self.id2label!r}") from exc
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        def need_int(name: str, minimum: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"BertConfig.{name} must be an integer >= {minimum}, got {value!r}")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size",
                     "num_labels", "pad_vocab_size_multiple"):
            need_int(name, 1)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}: choose a head count that divides it "
                f"(e.g. {self.hidden_size // 64 or 1} heads of 64)"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(
                f"BertConfig.hidden_act={self.hidden_act!r} is not supported; use one of {', '.join(ACTIVATIONS)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"BertConfig.{name} must be a probability in [0, 1), got {value!r}")
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ConfigError(f"BertConfig.{name} must be a positive finite number, got {value!r}")
        if self.pad_token_id is not None:
            need_int("pad_token_id", 0)
            if self.pad_token_id >= self.vocab_size:
                raise ConfigError(
                    f"BertConfig.pad_token_id={self.pad_token_id} is outside the vocabulary "
                    f"(vocab_size={self.vocab_size})"
                )
        if self.id2label is not None and sorted(self.id2label) != list(range(self.num_labels)):
            raise ConfigError(
                f"BertConfig.id2label has keys {sorted(self.id2label)} but num_labels={self.num_labels}: "
                f"give one name per label index 0..{self.num_labels - 1}"
            )
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

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    # ------------------------------------------------------------------ construction
    @classmethod
    def field_names(cls) -> list[str]:
        """Names of all dataclass fields (the keys ``from_dict`` understands)."""
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **overrides: Any) -> BertConfig:
        """A validated copy with ``overrides`` applied.

        Changing ``num_labels`` without new ``id2label`` drops label names that no longer fit.
        """
        _reject_unknown(overrides, "override")
        if "num_labels" in overrides and "id2label" not in overrides:
            if self.id2label is not None and len(self.id2label) != overrides["num_labels"]:
                overrides["id2label"] = None
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> BertConfig:
        """Build from a config.json-style dict.

        Dicts written by transformers (they carry ``model_type``/``transformers_version``/...) may hold
        extra keys, which are ignored; hand-written dicts must use known keys only.
        """
        data = dict(data)
        written_by_hf = any(key in data for key in _HF_MARKERS)
        try:
            _check_hf_semantics(data)
            id2label = data.get("id2label")
            if id2label is not None:
                if "num_labels" in data and data["num_labels"] != len(id2label):
                    raise ConfigError(
                        f"num_labels={data['num_labels']} but id2label has {len(id2label)} entries"
                    )
                data["num_labels"] = len(id2label)
            known = set(cls.field_names())
            unknown = {k: v for k, v in data.items() if k not in known}
            if unknown and not written_by_hf:
                extra = {k: v for k, v in unknown.items() if k not in _BERTFORGE_DERIVED}
                _reject_unknown(extra, "key")
            return cls(**{k: v for k, v in data.items() if k in known})
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except TypeError as exc:  # e.g. a field given as a list where a number is expected
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> BertConfig:
        """Read a config.json (ours, transformers', or NVIDIA's bert_config.json)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read model config {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object of config fields, got {type(data).__name__}")
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        """Config of a named preset (see ``bertforge.models.presets``) with ``overrides`` applied."""
        fields = get_preset(name)
        _reject_unknown(overrides, "override")
        fields.update(overrides)
        try:
            return cls(**fields)
        except ConfigError as exc:
            raise ConfigError(f"preset '{name}': {exc}") from None

    @classmethod
    def load(cls, name_or_path: str | os.PathLike[str]) -> BertConfig:
        """Load from a preset name, a config.json file, or a directory holding config.json."""
        path = Path(name_or_path)
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ConfigError(f"{path} is a directory without config.json: not a model directory")
            return cls.from_json_file(path / "config.json")
        if path.is_file():
            return cls.from_json_file(path)
        name = str(name_or_path)
        if name in PRESETS:
            return cls.from_preset(name)
        close = difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.5)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"'{name}' is neither an existing config.json / model directory nor a preset.{hint} "
            f"Valid presets: {', '.join(PRESETS)}"
        )

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """config.json content that both bertforge and transformers read."""
        from bertforge import __version__

        out: dict[str, Any] = {"model_type": "bert"}
        if self.architectures:
            out["architectures"] = list(self.architectures)
        for f in dataclasses.fields(self):
            if f.name in ("architectures", "num_labels", "id2label"):
                continue
            out[f.name] = getattr(self, f.name)
        # transformers derives num_labels from id2label (default 2), so only write labels when needed.
        if self.id2label is not None or self.num_labels != 2:
            names = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
            out["id2label"] = {str(i): names[i] for i in range(self.num_labels)}
            out["label2id"] = {names[i]: i for i in range(self.num_labels)}
        out["tie_word_embeddings"] = True
        out["bertforge_version"] = __version__
        if self.pre_layernorm:
            out["bertforge_only"] = (
                "pre_layernorm=true: transformers has no pre-LayerNorm BERT and would silently build a "
                "post-LN model from this file; load it with bertforge"
            )
        return out

    def to_json_file(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as indented, key-sorted JSON, atomically (temp file + rename)."""
        write_json_atomic(path, self.to_dict())


def _reject_unknown(values: dict[str, Any], what: str) -> None:
    known = BertConfig.field_names()
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown BertConfig {what} '{key}'.{hint} Known fields: {', '.join(known)}")


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


__all__ = ["ACTIVATIONS", "BertConfig"]
