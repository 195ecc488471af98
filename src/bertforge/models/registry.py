"""Model families, one record each: what the rest of bertforge may know about a family.

Everything outside ``bertforge.models`` asks this module, never ``isinstance`` on a config or a
test of a family's name: which family a preset name, a config.json or a config object belongs
to, its config class, the model class for each head kind, its sizes (``shape``: what the FLOP
count and the batch planner read), the tokenizers a model of it reads, whether
it is an encoder-decoder, which heads export to ONNX and what they leave out, and the names
``bertforge`` exports for it. Adding a family is one ``FamilySpec`` here plus its own modules
(its config with a shape function, its model file) and its proofs in
tests/family_proofs.py (a parity test against transformers, an end-to-end fine-tuning run).

Head kinds (the keys of ``FamilySpec.heads``) name what a model computes on top of the encoder:

* ``base``: the bare encoder (feature extraction);
* ``pretraining``: MLM + NSP/SOP (BERT pretraining on sentence pairs);
* ``masked-lm``: token predictions at every position (MLM pretraining without pairs, fill-mask);
* ``question-answering``, ``sequence-classification``, ``token-classification``,
  ``multiple-choice``: the fine-tuning heads;
* ``seq2seq-lm``: an encoder-decoder language model (denoising, summarization).

The record names classes by ``Ref`` so that reading it imports no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from bertforge.core.refs import Ref
from bertforge.errors import ConfigError
from bertforge.models.config_base import config_file, read_config_file, unknown_model

HEAD_KINDS = ("base", "pretraining", "masked-lm", "question-answering", "sequence-classification",
              "token-classification", "multiple-choice", "seq2seq-lm")


@dataclass(frozen=True)
class FamilySpec:
    name: str
    """Short name used in messages and docs ("BERT")."""
    model_types: tuple[str, ...]
    """config.json ``model_type`` values of the family (the first is what it writes by default)."""
    config: Ref
    """The config dataclass (``ModelConfig`` subclass; importing it needs no torch)."""
    shape: Ref
    """Config -> ``bertforge.models.shapes.ModelShape``: the sizes its FLOPs and memory follow."""
    tokenizers: tuple[str, ...]
    """Tokenizer kinds a model of the family reads (``bertforge.tokenization.loading.KINDS``:
    "wordpiece", "bpe" with BART's specials, "modernbert": byte-level BPE with BERT's); the
    first is what ``bertforge vocab --type`` trains for it."""
    heads: Mapping[str, Ref] = field(default_factory=dict)
    """Head kind -> model class (see the module docstring); a kind not listed is not supported."""
    seq2seq: bool = False
    """Encoder-decoder (generates text) rather than encoder-only."""
    exportable: tuple[str, ...] = ()
    """Head kinds with an ONNX export."""
    export_omits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Head kind -> fields of its output dataclass that its class always leaves None (no graph
    outputs of its ONNX export; ModernBERT's bare encoder has no pooler)."""
    extras: Mapping[str, str] = field(default_factory=dict)
    """Name -> module of what else ``bertforge`` exports for the family (functions such as
    ``convert_nvidia_checkpoint``). Plain names, not ``Ref``: the registry never loads them,
    only ``bertforge/__init__`` at the top layer does (a converter uses the loader, which reads
    this registry)."""
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    """What its encoder takes (besides the decoder's inputs of a seq2seq model)."""
    contains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Head kinds whose checkpoints also hold other heads: a BERT pretraining checkpoint (MLM +
    NSP) is a masked-LM model too."""

    @property
    def tokenizer(self) -> str:
        """The tokenizer kind ``bertforge vocab --type`` trains for the family."""
        return self.tokenizers[0]

    def model_shape(self, config: Any) -> Any:
        """``config``'s ``bertforge.models.shapes.ModelShape``."""
        return self.shape.load()(config)

    def public_names(self) -> dict[str, str]:
        """Name -> module of everything ``bertforge`` exports for the family: its config class,
        each model class of ``heads`` (derived, so a class that moves file needs no other edit)
        and ``extras``."""
        refs = (self.config, *self.heads.values())
        return {**{ref.name: ref.module for ref in refs}, **self.extras}

    def heads_in(self, architecture: str) -> tuple[str, ...]:
        """The head kinds a checkpoint of ``architecture`` can be loaded as (besides ``base``,
        which every checkpoint holds)."""
        heads = self.architectures().get(architecture, ())
        return tuple(dict.fromkeys(h for head in heads
                                   for h in (head, *self.contains.get(head, ()))))

    def config_class(self) -> Any:
        return self.config.load()

    def model_class(self, head: str) -> Any:
        """The class of head kind ``head``; ConfigError naming the kinds the family has."""
        if head not in self.heads:
            raise ConfigError(f"{self.name} models have no {head} head; {self.name} does "
                              f"{', '.join(self.heads)}")
        return self.heads[head].load()

    def architectures(self) -> dict[str, tuple[str, ...]]:
        """Class name (config.json ``architectures``) -> the head kinds it is the class of
        (BART's seq2seq LM is also its masked-LM head)."""
        out: dict[str, tuple[str, ...]] = {}
        for head, ref in self.heads.items():
            out[ref.name] = (*out.get(ref.name, ()), head)
        return out


BERT = FamilySpec(
    name="BERT", model_types=("bert",),
    config=Ref("bertforge.models.config", "BertConfig"),
    heads={
        "base": Ref("bertforge.models.bert", "BertModel"),
        "pretraining": Ref("bertforge.models.bert", "BertForPreTraining"),
        "masked-lm": Ref("bertforge.models.bert", "BertForMaskedLM"),
        "question-answering": Ref("bertforge.models.bert", "BertForQuestionAnswering"),
        "sequence-classification": Ref("bertforge.models.bert", "BertForSequenceClassification"),
        "token-classification": Ref("bertforge.models.bert", "BertForTokenClassification"),
        "multiple-choice": Ref("bertforge.models.bert", "BertForMultipleChoice"),
    },
    shape=Ref("bertforge.models.config", "bert_shape"), tokenizers=("wordpiece",),
    seq2seq=False, contains={"pretraining": ("masked-lm",)},
    exportable=("base", "masked-lm", "question-answering", "sequence-classification",
                "token-classification"),
    extras={"convert_nvidia_checkpoint": "bertforge.models.convert"})

BART = FamilySpec(
    name="BART", model_types=("bart", "mbart"),
    config=Ref("bertforge.models.bart_config", "BartConfig"),
    heads={
        "base": Ref("bertforge.models.bart", "BartModel"),
        # (first: a BartForConditionalGeneration directory is a summarizer unless it says more)
        "seq2seq-lm": Ref("bertforge.models.bart", "BartForConditionalGeneration"),
        # BART fills masks with its decoder: its masked-LM head is the seq2seq LM
        "masked-lm": Ref("bertforge.models.bart", "BartForConditionalGeneration"),
        "sequence-classification": Ref("bertforge.models.bart", "BartForSequenceClassification"),
    },
    shape=Ref("bertforge.models.bart_config", "bart_shape"), tokenizers=("bpe",), seq2seq=True,
    exportable=(), inputs=("input_ids", "attention_mask"))

MODERNBERT = FamilySpec(
    name="ModernBERT", model_types=("modernbert",),
    config=Ref("bertforge.models.modernbert_config", "ModernBertConfig"),
    heads={
        "base": Ref("bertforge.models.modernbert", "ModernBertModel"),
        # MLM without sentence pairs is ModernBERT's pretraining objective
        "masked-lm": Ref("bertforge.models.modernbert", "ModernBertForMaskedLM"),
        "question-answering": Ref("bertforge.models.modernbert",
                                  "ModernBertForQuestionAnswering"),
        "sequence-classification": Ref("bertforge.models.modernbert",
                                       "ModernBertForSequenceClassification"),
        "token-classification": Ref("bertforge.models.modernbert",
                                    "ModernBertForTokenClassification"),
        "multiple-choice": Ref("bertforge.models.modernbert", "ModernBertForMultipleChoice"),
    },
    # exportable: multiple choice is not (as for BERT); the graph runs the padded band-mask
    # path (ModernBertModel.traceable), checked against PyTorch on both sides of the window
    shape=Ref("bertforge.models.modernbert_config", "modernbert_shape"), tokenizers=("modernbert",),
    seq2seq=False,
    exportable=("base", "masked-lm", "question-answering", "sequence-classification",
                "token-classification"),
    export_omits={"base": ("pooler_output",)}, inputs=("input_ids", "attention_mask"))

FAMILIES: tuple[FamilySpec, ...] = (BERT, BART, MODERNBERT)


def family_of_type(model_type: str | None, source: str = "config.json") -> FamilySpec:
    """The family whose config.json says ``model_type`` (BERT when the file names none, as
    Google's and NVIDIA's BERT configs)."""
    if model_type is None:
        return BERT
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    known = ", ".join(t for f in FAMILIES for t in f.model_types)
    raise ConfigError(f"{source}: model_type {model_type!r} is not a family bertforge knows "
                      f"({known})")


def family_of_config(config: Any) -> FamilySpec:
    """The family of a config object (its class's ``model_type``)."""
    return family_of_type(type(config).model_type)


def shape_of(config: Any) -> Any:
    """The ``bertforge.models.shapes.ModelShape`` of a config object, by its family's record."""
    return family_of_config(config).model_shape(config)


def family_of_architecture(name: str) -> tuple[FamilySpec, str] | None:
    """(family, head kind) of a config.json ``architectures`` entry (its class's first head
    kind), or None if unknown."""
    for family in FAMILIES:
        heads = family.architectures().get(name)
        if heads:
            return family, heads[0]
    return None


def preset_family(name: str) -> FamilySpec | None:
    """The family that has a preset called ``name``."""
    for family in FAMILIES:
        if name in family.config_class().presets:
            return family
    return None


def preset_names() -> list[str]:
    return [name for family in FAMILIES for name in family.config_class().presets]


def resolve_config(name_or_path: str | os.PathLike[str]) -> tuple[FamilySpec, Any]:
    """(family, config) of a preset name, a config.json or a model directory; config.json is
    read once. ConfigError for anything else, with the closest preset name."""
    file = config_file(Path(name_or_path))
    if file is not None:
        data = read_config_file(file)
        family = family_of_type(data.get("model_type"), str(file))
        return family, family.config_class().from_dict(data, source=str(file))
    name = str(name_or_path)
    family = preset_family(name)
    if family is not None:
        return family, family.config_class().from_preset(name)
    raise unknown_model(name, preset_names())


__all__ = ["BART", "BERT", "FAMILIES", "HEAD_KINDS", "MODERNBERT", "FamilySpec",
           "family_of_architecture", "family_of_config", "family_of_type", "preset_family",
           "preset_names", "resolve_config", "shape_of"]
