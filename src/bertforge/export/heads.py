"""Which BERT models can be exported, and the ONNX signature of each.

Every exported graph takes the same three inputs (``input_ids``, ``attention_mask``,
``token_type_ids``: (batch, sequence) int64) and returns the fields of the head's output
dataclass, in field order and under the field names (``start_logits``/``end_logits``,
``logits``, ``last_hidden_state``/``pooler_output``). Naming outputs after the dataclass fields
lets ``OnnxModel`` rebuild the very object the PyTorch head returns, so code written against a
PyTorch model runs unchanged on onnxruntime.

Not exported: ``BertForPreTraining`` (a training-only model), ``BertForMultipleChoice`` (its
(batch, choices, sequence) inputs need another signature) and BART (encoder-decoder generation
would need a decoder with a key/value cache as a second graph).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bertforge.errors import ConfigError
from bertforge.models.auto import config_class
from bertforge.models.bart_config import BartConfig
from bertforge.models.bert import BertModelOutput
from bertforge.models.config import BertConfig
from bertforge.models.heads import ClassifierOutput, MaskedLMOutput, QuestionAnsweringOutput

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
"""Graph inputs, all (batch, sequence) int64."""

SEQUENCE = -1
"""The sequence axis in ``HeadSpec.output_dims`` (Triton's notation for a variable dimension)."""


@dataclass(frozen=True)
class HeadSpec:
    """The ONNX signature of one model class."""

    architecture: str
    """Class name as in config.json ``architectures``."""
    output_type: type
    """Dataclass the PyTorch model returns (and ``OnnxModel`` rebuilds)."""
    outputs: tuple[str, ...]
    """Field names of ``output_type``: the graph's output names, in order."""
    dims: Callable[[BertConfig], tuple[tuple[int, ...], ...]]
    """Per output, its shape without the batch axis; ``SEQUENCE`` marks the sequence axis."""

    def output_dims(self, config: BertConfig) -> dict[str, tuple[int, ...]]:
        """``{output name: shape without the batch axis}`` for a model of ``config``."""
        return dict(zip(self.outputs, self.dims(config)))


HEADS: dict[str, HeadSpec] = {spec.architecture: spec for spec in (
    HeadSpec("BertModel", BertModelOutput, ("last_hidden_state", "pooler_output"),
             lambda c: ((SEQUENCE, c.hidden_size), (c.hidden_size,))),
    HeadSpec("BertForMaskedLM", MaskedLMOutput, ("logits",),
             lambda c: ((SEQUENCE, c.vocab_size),)),
    HeadSpec("BertForQuestionAnswering", QuestionAnsweringOutput, ("start_logits", "end_logits"),
             lambda c: ((SEQUENCE,), (SEQUENCE,))),
    HeadSpec("BertForSequenceClassification", ClassifierOutput, ("logits",),
             lambda c: ((c.num_labels,),)),
    HeadSpec("BertForTokenClassification", ClassifierOutput, ("logits",),
             lambda c: ((SEQUENCE, c.num_labels),)),
)}
"""The exportable model classes (see the module docstring for those left out)."""


def resolve_head(model_dir: str | os.PathLike[str], key: str = "--model") -> tuple[HeadSpec, BertConfig]:
    """The head spec and config of the model directory ``model_dir``; ``ConfigError`` naming
    ``key`` when it is no model directory or holds a model that cannot be exported."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{key} {path} is not a model directory (no config.json); give the "
                          "directory `bertforge finetune` or `pretrain` wrote")
    if config_class(path) is BartConfig:
        raise ConfigError(f"{key} {path} is a BART model; ONNX export covers the BERT heads "
                          f"({', '.join(HEADS)}) only")
    config = BertConfig.load(path)
    names = config.architectures or []
    if not names:
        raise ConfigError(f"{path}/config.json has no 'architectures' entry, so the head to "
                          f"export is unknown; add e.g. \"architectures\": "
                          f"[\"BertForQuestionAnswering\"] (one of {', '.join(HEADS)})")
    if names[0] not in HEADS:
        raise ConfigError(f"{path}/config.json architecture {names[0]} cannot be exported to "
                          f"ONNX; supported: {', '.join(HEADS)}")
    return HEADS[names[0]], config


__all__ = ["HEADS", "INPUT_NAMES", "SEQUENCE", "HeadSpec", "resolve_head"]
