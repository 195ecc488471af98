"""Named BERT shapes.

Each preset is a dict of ``BertConfig`` fields; everything not listed keeps the dataclass default
(post-LN, gelu, 512 positions, vocabulary padded to a multiple of 8). The four Google sizes keep
their original vocabularies (30522 uncased, 28996 cased); the compact models are the ones Google
released alongside them ("Well-Read Students Learn Better"), all uncased with 30522 tokens.
"""

from __future__ import annotations

import difflib
from typing import Any

from bertforge.errors import ConfigError

_UNCASED_VOCAB = 30522
_CASED_VOCAB = 28996


def _shape(layers: int, hidden: int, heads: int, ffn: int, *, cased: bool = False) -> dict[str, Any]:
    return {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": ffn,
        "max_position_embeddings": 512,
        "vocab_size": _CASED_VOCAB if cased else _UNCASED_VOCAB,
        "do_lower_case": not cased,
    }


PRESETS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": _shape(12, 768, 12, 3072),
    "bert-base-cased": _shape(12, 768, 12, 3072, cased=True),
    "bert-large-uncased": _shape(24, 1024, 16, 4096),
    "bert-large-cased": _shape(24, 1024, 16, 4096, cased=True),
    "bert-tiny": _shape(2, 128, 2, 512),
    "bert-mini": _shape(4, 256, 4, 1024),
    "bert-small": _shape(4, 512, 8, 2048),
    "bert-medium": _shape(8, 512, 8, 2048),
    # Short-budget pretraining (recipes/pretrain/budget-cpu.yaml): Pre-LN trains stably at higher
    # learning rates, and dropout only slows a run that never sees its data often enough to overfit.
    "bert-mini-preln": {**_shape(4, 256, 4, 1024), "pre_layernorm": True,
                        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
}


def preset_names() -> list[str]:
    """All preset names, in a stable order (largest families first, as listed above)."""
    return list(PRESETS)


def get_preset(name: str) -> dict[str, Any]:
    """Return a fresh copy of the fields of preset ``name``.

    Raises:
        ConfigError: ``name`` is not a preset; the message lists the valid names and the closest one.
    """
    if name in PRESETS:
        return dict(PRESETS[name])
    close = difflib.get_close_matches(name, PRESETS, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ConfigError(
        f"unknown model preset '{name}'.{hint} Valid presets: {', '.join(PRESETS)}; "
        "or give a path to a config.json / model directory."
    )
