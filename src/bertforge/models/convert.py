"""``bertforge convert``: NVIDIA DeepLearningExamples PyTorch BERT checkpoints -> Hugging Face directories.

NVIDIA's scripts ``torch.save`` a dict ``{"model": state_dict, "optimizer": ..., ...}`` (fine-tuning
scripts save ``{"model": state_dict}``; some files are a bare state dict). Their state dict differs
from Hugging Face's in three ways, all undone here:

* fused linear+activation modules are called ``dense_act`` (``intermediate.dense_act``,
  ``bert.pooler.dense_act``, ``cls.predictions.transform.dense_act``) instead of ``dense``;
* the word embeddings, tied decoder and MLM bias have the vocabulary padded to a multiple of 8
  while bert_config.json states the real size (30522 -> 30528 rows);
* wrappers add ``module.`` (DDP) or ``_orig_mod.`` (torch.compile) in front of every name.

The task head is recognised from the weights present (pretraining, MLM, SQuAD, classification).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from bertforge.core.arguments import checked
from bertforge.errors import CheckpointError, ConfigError
from bertforge.core.io import atomic_write
from bertforge.models.config import BertConfig
from bertforge.models.bert import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.models.bert import BertModel
from bertforge.models.bert import BertPreTrainedModel
from bertforge.models.checks import nonfinite_summary
from bertforge.models.hub import load_torch_file, strip_wrapper_prefixes
from bertforge.models.loading import load_model, open_model

_TRUST_REMEDY = (
    "NVIDIA pretraining checkpoints often pickle the data loader or the run's arguments. If you trust "
    "the file's origin, rerun with --trust-pickle (convert_nvidia_checkpoint(..., trust_pickle=True)); "
    "unpickling runs code stored in the file."
)


@checked
def convert_nvidia_checkpoint(
    checkpoint: Path,
    config: str | Path,
    output: Path,
    vocab: Path | None = None,
    trust_pickle: bool = False,
) -> Path:
    """Convert an NVIDIA BERT checkpoint into a Hugging Face model directory.

    Args:
        checkpoint: the ``.pt`` file written by NVIDIA's run_pretraining.py / run_squad.py / run_glue.py.
        config: a preset name (e.g. "bert-large-uncased") or NVIDIA's bert_config.json.
        output: directory to write config.json + model.safetensors (+ vocab.txt) into.
        vocab: optional vocab.txt to copy alongside; its line count must equal ``vocab_size``.
        trust_pickle: allow arbitrary pickled objects in the checkpoint (only for trusted files).

    Returns:
        ``output``.

    Raises:
        CheckpointError: unreadable checkpoint, pickled objects without ``trust_pickle``, or
            weights that do not fit ``config`` (the message lists names and shapes).
        ConfigError: bad config, or a vocabulary whose size disagrees with it.
    """
    checkpoint, output = Path(checkpoint), Path(output)
    model_config = BertConfig.load(config)
    if vocab is not None:
        _check_vocab(Path(vocab), model_config)
    if output.exists() and not output.is_dir():
        raise CheckpointError(f"output {output} exists and is not a directory; choose a directory path")
    raw = load_torch_file(checkpoint, remedy=_TRUST_REMEDY, trust_pickle=trust_pickle)
    state = nvidia_to_hf_names(_extract_state_dict(raw, checkpoint))
    model_cls, kwargs = infer_model_class(state)
    model = model_cls(model_config, **kwargs)
    model.load_hf_state_dict(state, source=str(checkpoint))
    problem = nonfinite_summary(model.named_parameters())
    if problem:
        raise CheckpointError(f"{checkpoint} holds {problem}; nothing was written to {output}")
    model.save_pretrained(output)
    if vocab is not None:
        atomic_write(output / "vocab.txt", lambda tmp: shutil.copyfile(vocab, tmp))
    # Read back the way every command will read it: the one loader, weights verified.
    source = open_model(output, "--output")
    load_model(source, source.head or "base")
    return output


def nvidia_to_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename NVIDIA's keys to Hugging Face's (wrapper prefixes stripped, ``dense_act`` -> ``dense``).

    Vocabulary padding is left in place: ``load_hf_state_dict`` accepts padded rows and trims them.
    The wrappers are stripped here (with the loader's own rule) because :func:`infer_model_class`
    looks for plain Hugging Face names.
    """
    return {strip_wrapper_prefixes(name).replace(".dense_act.", ".dense."): tensor
            for name, tensor in state.items()}


def infer_model_class(state: dict[str, Any]) -> tuple[type[BertPreTrainedModel], dict[str, Any]]:
    """Pick the bertforge class whose heads match the (Hugging Face-named) weights present."""
    has = state.__contains__
    if has("cls.predictions.transform.dense.weight"):
        return (BertForPreTraining if has("cls.seq_relationship.weight") else BertForMaskedLM), {}
    if has("qa_outputs.weight"):
        return BertForQuestionAnswering, {}
    if has("classifier.weight"):
        rows = state["classifier.weight"].shape[0]
        if not any(k.startswith("bert.pooler.") for k in state):
            return BertForTokenClassification, {"num_labels": rows}
        if rows == 1:
            return BertForMultipleChoice, {}
        return BertForSequenceClassification, {"num_labels": rows}
    return BertModel, {}


def _extract_state_dict(raw: Any, checkpoint: Path) -> dict[str, torch.Tensor]:
    if isinstance(raw, dict) and isinstance(raw.get("model"), dict):
        raw = raw["model"]
    if not isinstance(raw, dict) or not raw or not all(isinstance(v, torch.Tensor) for v in raw.values()):
        keys = list(raw)[:8] if isinstance(raw, dict) else []
        raise CheckpointError(
            f"{checkpoint} is not an NVIDIA BERT checkpoint: expected a dict with a 'model' state dict or a "
            f"state dict itself, found {type(raw).__name__}"
            + (f" with keys {keys}" if keys else "")
        )
    return raw


def _check_vocab(vocab: Path, config: BertConfig) -> None:
    try:
        with open(vocab, encoding="utf-8") as fh:
            count = sum(1 for _ in fh)  # every line is a token, as in BERT's own vocab loader
    except OSError as exc:
        raise ConfigError(f"cannot read vocabulary {vocab}: {exc.strerror or exc}") from None
    if count != config.vocab_size:
        raise ConfigError(
            f"{vocab} has {count} tokens but the model config has vocab_size={config.vocab_size}: "
            "pass the vocab.txt the checkpoint was trained with"
        )
