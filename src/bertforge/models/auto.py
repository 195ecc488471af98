"""Which model family a preset name or a model directory belongs to.

Commands take ``model: NAME_OR_PATH`` for either family; this module reads the preset table or
the ``model_type`` of config.json and returns the family's config, without importing torch.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Union

from bertforge.errors import ConfigError
from bertforge.models.bart_config import BART_PRESETS, BartConfig
from bertforge.models.config import BertConfig
from bertforge.models.presets import PRESETS

AnyConfig = Union[BertConfig, BartConfig]
_BART_TYPES = ("bart", "mbart")


def config_class(name_or_path: str | os.PathLike[str]) -> type[AnyConfig]:
    """``BertConfig`` or ``BartConfig``: by preset name, or by config.json's ``model_type``."""
    path = Path(name_or_path)
    file = path / "config.json" if path.is_dir() else path
    if file.is_file():
        try:
            model_type = json.loads(file.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            model_type = None  # the family's own loader reports what is wrong with the file
        return BartConfig if model_type in _BART_TYPES else BertConfig
    if path.is_dir():
        return BertConfig  # its loader says the directory lacks config.json
    name = str(name_or_path)
    if name in BART_PRESETS:
        return BartConfig
    if name in PRESETS:
        return BertConfig
    names = [*PRESETS, *BART_PRESETS]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(f"'{name}' is neither an existing config.json / model directory nor a "
                      f"preset.{hint} Valid presets: {', '.join(names)}")


def load_config(name_or_path: str | os.PathLike[str]) -> AnyConfig:
    """The config of a preset name, a config.json or a model directory, of either family."""
    return config_class(name_or_path).load(name_or_path)


def is_seq2seq(config: AnyConfig) -> bool:
    """True for encoder-decoder (BART) configs."""
    return isinstance(config, BartConfig)


__all__ = ["AnyConfig", "config_class", "is_seq2seq", "load_config"]
