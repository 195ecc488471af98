"""The one way commands load a model: a preset name, a model directory or a Hugging Face Hub
name -> its family and config (config.json read once) -> the model class of the head the task
needs -> the directory's weights, verified (every body weight present with its shape,
floating-point, finite).

What a name means, in this order: an existing local path (model directory or config.json);
then, only where a fresh model is wanted (``weights=False``: pretraining's ``model``), a
bertforge preset; then a Hub repo id (``bert-base-uncased``, ``org/name``, ``org/name@rev``),
from the cache or downloaded (``bertforge.models.hub_names``). Presets have no weights, so
wherever weights are needed (finetune, predict, serve, export, generate, ``init_from``) a name
that is no local path is a Hub name.

Two steps, so that a run reads config.json once and can look at the config before it pays for
the weights (sequence lengths, label names, memory checks)::

    source = open_model(cfg.model)                 # family + config
    model = load_model(source, "question-answering", device=device, new_heads=True)

``new_heads`` is for fine-tuning: a head the files lack (or hold in another shape) starts fresh.
Without it, as in predict, serve, generate and export, a missing head is an error: a model
answering with random weights is worse than no answer.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.core.numbers import ascii_int
from bertforge.core.paths import check_path_text
from bertforge.errors import ConfigError
from bertforge.models.checks import check_memory
from bertforge.models.config_base import unknown_model
from bertforge.models.hub_names import hub_snapshot, parse_hub_name
from bertforge.models.registry import FamilySpec, preset_family, preset_names, resolve_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSource:
    """A model named by a preset, a directory or a Hub name, with its config read (once)."""

    name: str
    """What the user gave (a preset name, a path or a Hugging Face Hub name)."""
    directory: Path | None
    """The model directory (a Hub name's cached snapshot), or None for a preset or a bare
    config.json (a fresh model)."""
    family: FamilySpec
    config: Any

    @property
    def head(self) -> str | None:
        """The head kind config.json's ``architectures`` names, if it names one we know."""
        classes = self.family.architectures()
        for name in getattr(self.config, "architectures", None) or ():
            if classes.get(name):
                return classes[name][0]
        return None

    @property
    def config_name(self) -> str:
        """Where the config was read, for messages: the directory's config.json, else the name
        (a config.json or a preset)."""
        return str(self.directory / "config.json") if self.directory is not None else self.name

    def replace(self, **overrides: Any) -> ModelSource:
        """The same source with config fields replaced (labels, dropout, vocab size...)."""
        if not overrides:
            return self
        return ModelSource(self.name, self.directory, self.family,
                           self.config.replace(**overrides))


def model_directory(path: str | os.PathLike[str], key: str = "--model") -> Path:
    """``path`` when it is a model directory (it holds config.json); a Hub name that is no local
    path: its snapshot directory (cached or downloaded); otherwise a ``ConfigError`` naming
    ``key`` that says what ``path`` is instead: missing, a file, the folder of a training run
    (with the newest complete checkpoint to give instead), or some other folder."""
    check_path_text(path, key)
    path = Path(path)
    if (path / "config.json").is_file():
        return path
    if not path.exists():
        name = parse_hub_name(str(path))
        if name is not None:
            return hub_snapshot(name, f"{key} {path}")
        raise ConfigError(f"{key} {path} does not exist; give a model directory")
    if not path.is_dir():
        raise ConfigError(f"{key} {path} is a file, not a model directory (a folder with "
                          "config.json and model.safetensors)")
    steps = sorted((step, p) for p in path.glob("checkpoint-*")
                   if (step := ascii_int(p.name.split("-", 1)[1])) is not None
                   and (p / "config.json").is_file())
    if steps:
        raise ConfigError(f"{key} {path} is a training run's folder, not a model directory; "
                          f"give one of its checkpoints, e.g. the newest: {steps[-1][1]}")
    raise ConfigError(f"{key} {path} is not a model directory (no config.json); give the "
                      "directory `bertforge finetune` or `pretrain` wrote, or a Hugging Face "
                      "model directory")


def open_model(name_or_path: str | os.PathLike[str], key: str = "model", *,
               weights: bool = False) -> ModelSource:
    """The family and config of a model directory or config.json, a preset name or a Hub name
    (precedence in the module docstring). ``weights``: the caller needs trained weights, so
    presets (shapes only) are not considered. ``key`` names the setting in messages
    (``--model``, ``model``, ``init_from``)."""
    check_path_text(name_or_path, key)
    text = str(name_or_path)
    path = Path(text)
    if path.exists():
        family, config = resolve_config(path)
        return ModelSource(text, path if path.is_dir() else None, family, config)
    if not weights and preset_family(text) is not None:
        family, config = resolve_config(text)
        return ModelSource(text, None, family, config)
    name = parse_hub_name(text)
    if name is None:
        if os.sep in text or text.startswith(".") or path.suffix == ".json":
            raise ConfigError(f"{key}={text} does not exist; give a model directory, a "
                              "config.json, a preset name or a Hugging Face Hub name")
        raise unknown_model(text, preset_names())
    try:
        directory = hub_snapshot(name, f"{key}={text}")
    except ConfigError as exc:
        raise ConfigError(f"{exc}{_preset_note(text, weights)}") from None
    family, config = resolve_config(directory)
    return ModelSource(text, directory, family, config)


def _preset_note(text: str, weights: bool) -> str:
    """What to add to a failed Hub lookup of ``text`` about bertforge's presets."""
    if weights and preset_family(text) is not None:
        return (f" ({text} is also a bertforge preset, but a preset is a shape without weights, "
                "not a model directory: presets start fresh models in `bertforge pretrain`)")
    close = difflib.get_close_matches(text, preset_names(), n=1, cutoff=0.8)
    return f"; or did you mean the preset '{close[0]}'?" if close and not weights else ""


def load_model(source: ModelSource, head: str, *, device: str | torch.device = "cpu",
               new_heads: bool = False, seed: int | None = None,
               nonfinite_remedy: str | None = None, missing_head: str | None = None) -> Any:
    """The ``head`` model of ``source`` with its weights on ``device``, in eval mode.

    A preset (no directory) gives a freshly initialised model. ``seed`` fixes the initial
    weights of whatever starts fresh. ``nonfinite_remedy`` replaces the advice given when the
    weights hold NaN or inf (a training run points at its previous checkpoint);
    ``missing_head`` the advice when the files lack the head's weights. The model's memory is
    checked against the machine's before it is built (``models.checks.check_memory``)."""
    cls = source.family.model_class(head)
    check_memory(source.config, device, source.config_name)
    if seed is not None:
        torch.manual_seed(seed)
    model = cls(source.config)
    if source.directory is None:
        origin = ("the bertforge preset" if preset_family(source.name)
                  and not Path(source.name).exists() else "its config")
        log.info("model %s: a fresh %s model from %s (no weights loaded)", source.name,
                 source.family.name, origin)
    else:
        report = model.restore(source.directory, new_heads=new_heads,
                               nonfinite_remedy=nonfinite_remedy)
        head_weights = [k for k in report.initialized if not k.startswith(cls.optional_prefixes)]
        if head_weights and not new_heads:
            raise ConfigError(
                f"{source.directory} has no weights for the {head} head ({head_weights[0]}, "
                f"...); {missing_head or 'give a model fine-tuned (or pretrained) for it'}")
    return model.to(device).eval()


__all__ = ["ModelSource", "load_model", "model_directory", "open_model"]
