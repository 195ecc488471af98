"""Which models can be exported, and the ONNX signature of each, as the registries say.

A model family lists the head kinds it exports (``bertforge.models.registry.FamilySpec.
exportable``) and the task of each head kind records its signature
(``bertforge.tasks.registry.Export``): every exported encoder graph takes its family's inputs
(``FamilySpec.inputs``, each (batch, sequence) int64: ``input_ids``, ``attention_mask`` and,
for BERT, ``token_type_ids``; ModernBERT has no token types) and returns the fields of the
head's output dataclass, in field order and under the field names (``start_logits``/
``end_logits``, ``logits``, ``last_hidden_state``/``pooler_output``), less those its class
always leaves None (``FamilySpec.export_omits``). Naming outputs after the
dataclass fields lets ``OnnxModel`` rebuild the very object the PyTorch head returns, so code
written against a PyTorch model runs unchanged on onnxruntime.

Exported families: BERT and ModernBERT (base, masked LM, question answering, sequence and token
classification). Not exported: pretraining heads (training-only), multiple choice (its (batch,
choices, sequence) inputs need another signature) and BART (generation would need a decoder
with a key/value cache as a second graph).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bertforge.errors import ConfigError
from bertforge.models.loading import ModelSource, model_directory, open_model
from bertforge.models.registry import BERT, FAMILIES, FamilySpec, family_of_architecture
from bertforge.tasks.registry import ENCODER_INPUTS, TASKS, TaskSpec

INPUT_NAMES = ENCODER_INPUTS
"""BERT's graph inputs, all (batch, sequence) int64 (another family's: ``HeadSpec.inputs``)."""

SEQUENCE = -1
"""The sequence axis in ``HeadSpec.output_dims`` (Triton's notation for a variable dimension)."""


@dataclass(frozen=True)
class HeadSpec:
    """The ONNX signature of one model class: its head kind and the task that records it."""

    architecture: str
    """Class name as in config.json ``architectures``."""
    head: str
    """Head kind (``bertforge.models.registry.HEAD_KINDS``)."""
    task: TaskSpec
    inputs: tuple[str, ...] = INPUT_NAMES
    """Graph inputs, in order, each (batch, sequence) int64: the family's ``FamilySpec.inputs``."""
    family: str = "BERT"
    """``FamilySpec.name`` of the model class (for messages: nothing is decided by it)."""
    omitted: tuple[str, ...] = ()
    """Fields of ``output_type`` this class always leaves None (ModernBERT has no pooler): not
    graph outputs, and None in the object ``OnnxModel`` rebuilds."""

    @property
    def output_type(self) -> type:
        """Dataclass the PyTorch model returns (and ``OnnxModel`` rebuilds)."""
        return self.task.export.output_type.load()

    @property
    def outputs(self) -> tuple[str, ...]:
        """Field names of ``output_type``: the graph's output names, in order."""
        return tuple(n for n in self.task.export.output_names if n not in self.omitted)

    def output_dims(self, config: Any) -> dict[str, tuple[int, ...]]:
        """``{output name: shape without the batch axis}`` for a model of ``config``;
        ``SEQUENCE`` marks the sequence axis."""
        return {k: v for k, v in self.task.export.output_dims(config).items()
                if k not in self.omitted}


def family_heads(family: FamilySpec) -> dict[str, HeadSpec]:
    """Architecture -> signature of each model class ``family``'s record lists as exportable
    (``FamilySpec.exportable``, with its ``inputs`` and ``export_omits``)."""
    out = {}
    for head in family.exportable:
        task = next(t for t in TASKS if t.head == head and t.export is not None)
        name = family.heads[head].name
        out[name] = HeadSpec(name, head, task, family.inputs, family.name,
                             tuple(family.export_omits.get(head, ())))
    return out


EXPORTABLE: dict[str, HeadSpec] = {k: v for f in FAMILIES for k, v in family_heads(f).items()}
"""Architecture -> signature of every exportable model class, of every family."""
HEADS: dict[str, HeadSpec] = family_heads(BERT)
"""The BERT family's part of ``EXPORTABLE`` (BERT's classes, as this name has always held)."""


def resolve_head(model_dir: str | os.PathLike[str],
                 key: str = "--model") -> tuple[HeadSpec, ModelSource]:
    """The head spec and source (family and config, config.json read once) of the model
    directory ``model_dir``; ``ConfigError`` naming ``key`` when it is no model directory or
    holds a model that cannot be exported."""
    path = model_directory(model_dir, key)  # a Hub name: its snapshot
    source = open_model(path, key.lstrip("-"))
    if not source.family.exportable:
        raise ConfigError(f"{key} {path} is a {source.family.name} model; ONNX export covers "
                          f"the heads {', '.join(EXPORTABLE)} only")
    names = source.config.architectures or []
    if not names:
        raise ConfigError(f"{path}/config.json has no 'architectures' entry, so the head to "
                          f"export is unknown; add e.g. \"architectures\": "
                          f"[\"BertForQuestionAnswering\"] (one of {', '.join(EXPORTABLE)})")
    found = family_of_architecture(names[0])
    if names[0] not in EXPORTABLE or found is None or found[0] is not source.family:
        raise ConfigError(f"{path}/config.json architecture {names[0]} cannot be exported to "
                          f"ONNX; supported: {', '.join(EXPORTABLE)}")
    return EXPORTABLE[names[0]], source


__all__ = ["EXPORTABLE", "HEADS", "INPUT_NAMES", "SEQUENCE", "HeadSpec", "family_heads",
           "resolve_head"]
