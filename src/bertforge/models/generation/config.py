"""``GenerationConfig``: how encoder-decoder generation decodes, with the field names and meanings
of Hugging Face transformers' ``GenerationConfig``, validated, and read from / written to
``generation_config.json`` so the files move between the two libraries. The search itself is
``bertforge.models.generation.search``."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from bertforge.core.io import write_json_atomic
from bertforge.core.jsonfile import read_json
from bertforge.errors import ConfigError

GENERATION_CONFIG_NAME = "generation_config.json"

# A generation_config.json written by transformers without any length limit means this many new
# tokens to transformers.
_HF_DEFAULT_NEW_TOKENS = 20

# Token-id settings that from_model_config copies from a model config.
TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                 "forced_bos_token_id", "forced_eos_token_id")

# Settings of transformers' generation_config.json that bertforge does not implement and that
# change the generated tokens, with the values that leave the output as bertforge computes it.
# A file setting one of them to anything else is refused rather than half followed. Sampling-only
# settings (temperature, top_k, ...) are absent: without do_sample they have no effect.
_UNSUPPORTED_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "bad_words_ids": (None, []),
    "begin_suppress_tokens": (None, []),
    "constraints": (None, []),
    "diversity_penalty": (None, 0, 0.0),
    "dola_layers": (None,),
    "encoder_no_repeat_ngram_size": (None, 0),
    "encoder_repetition_penalty": (None, 1, 1.0),
    "exponential_decay_length_penalty": (None,),
    "force_words_ids": (None, []),
    "guidance_scale": (None, 1, 1.0),
    "max_time": (None,),
    "num_beam_groups": (None, 1),
    "penalty_alpha": (None,),
    "remove_invalid_values": (None, False),
    "renormalize_logits": (None, False),
    "sequence_bias": (None, {}),
    "stop_strings": (None, []),
    "suppress_tokens": (None, []),
    "token_healing": (None, False),
    "watermarking_config": (None,),
}

def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

def bad_setting(name: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"generation setting {name}={value!r} is invalid: {expected}")

def named_as(exc: ConfigError, name: Callable[[str], str]) -> ConfigError:
    """``exc`` (of :func:`bad_setting`) with the setting named as the caller's config calls it:
    ``name("num_beams")`` is ``eval.num_beams`` or ``--num-beams``."""
    return ConfigError(re.sub(r"generation setting (\w+)=",
                              lambda m: f"generation setting {name(m.group(1))}=", str(exc),
                              count=1))

@dataclass(frozen=True)
class GenerationConfig:
    """How :func:`generate` decodes; field names and meanings are transformers'.

    Build one from a model's config with :meth:`from_model_config` (it copies the special token
    ids), change settings with :meth:`replace`, and store it next to the model with :meth:`save`
    as ``generation_config.json``. Every instance is validated: a bad value raises
    ``ConfigError`` naming the setting.
    """

    max_length: int | None = 20
    """Longest decoder sequence, decoder start token included (None: use ``max_new_tokens``)."""
    max_new_tokens: int | None = None
    """Most generated tokens; when set, it decides the length limit instead of ``max_length``."""
    min_length: int = 0
    """EOS is banned while the decoder sequence (start token included) is shorter than this."""
    min_new_tokens: int | None = None
    """EOS is banned before this many tokens are generated; overrides ``min_length`` when set."""
    num_beams: int = 1
    """1: greedy search; more: beam search with that many beams per input."""
    length_penalty: float = 1.0
    """Beam search: a finished hypothesis scores sum(log p) / generated_length ** length_penalty."""
    early_stopping: bool | str = False
    """Beam search stopping rule: True, False or "never" (see the module notes)."""
    no_repeat_ngram_size: int = 0
    """Ban any token that would repeat an n-gram of this size already in the sequence (0: off)."""
    repetition_penalty: float = 1.0
    """Scores of tokens already in the sequence: divided by this when positive, multiplied when
    negative (1.0: off)."""
    num_return_sequences: int = 1
    """Best hypotheses returned per input (at most ``num_beams``), best first."""
    do_sample: bool = False
    """Sampling is not implemented; must stay False."""
    bos_token_id: int | None = None
    """Beginning-of-sequence id; the decoder start token if ``decoder_start_token_id`` is unset."""
    eos_token_id: int | None = None
    """End-of-sequence id; a sequence ends when it emits it (None: only the length limit ends)."""
    pad_token_id: int | None = None
    """Fills sequences that ended before the longest of their batch (None: ``eos_token_id``)."""
    decoder_start_token_id: int | None = None
    """First token of every decoder sequence (BART: EOS, id 2)."""
    forced_bos_token_id: int | None = None
    """If set, forced as the first generated token (BART: BOS, id 0)."""
    forced_eos_token_id: int | None = None
    """If set, forced as the token that reaches the length limit."""

    def __post_init__(self) -> None:
        for name in ("max_length", "max_new_tokens", "min_new_tokens", *TOKEN_FIELDS):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise bad_setting(name, value, "expected an integer or null")
        for name in ("min_length", "num_beams", "no_repeat_ngram_size", "num_return_sequences"):
            if not is_int(getattr(self, name)):
                raise bad_setting(name, getattr(self, name), "expected an integer")
        for name in ("length_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if not _is_real(value):
                raise bad_setting(name, value, "expected a finite number")
            object.__setattr__(self, name, float(value))
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise bad_setting("early_stopping", self.early_stopping, 'expected true, false or "never"')
        if not isinstance(self.do_sample, bool):
            raise bad_setting("do_sample", self.do_sample, "expected true or false")
        if self.do_sample:
            raise bad_setting("do_sample", True, "bertforge generates by greedy or beam search only; "
                       "set do_sample to false")
        for name in TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise bad_setting(name, value, "token ids are >= 0; use null for no token")
        self._check_lengths()
        if self.num_beams < 1:
            raise bad_setting("num_beams", self.num_beams,
                              "must be >= 1 (1: greedy search, more: beam search)")
        if not 1 <= self.num_return_sequences <= self.num_beams:
            raise bad_setting("num_return_sequences", self.num_return_sequences,
                       f"must be between 1 and num_beams={self.num_beams}; raise num_beams to "
                       "return more hypotheses")
        if self.no_repeat_ngram_size < 0:
            raise bad_setting("no_repeat_ngram_size", self.no_repeat_ngram_size, "use 0 to turn it off")
        if self.repetition_penalty <= 0:
            raise bad_setting("repetition_penalty", self.repetition_penalty,
                       "must be > 0 (1.0 turns it off)")

    def _check_lengths(self) -> None:
        if self.max_length is None and self.max_new_tokens is None:
            raise ConfigError("generation settings max_length and max_new_tokens are both null: "
                              "set one of them so that generation has a length limit")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise bad_setting("max_new_tokens", self.max_new_tokens, "must be >= 1")
        if self.max_length is not None and self.max_length < 2:
            raise bad_setting("max_length", self.max_length,
                       "must be >= 2 (it counts the decoder start token)")
        if self.min_length < 0:
            raise bad_setting("min_length", self.min_length, "must be >= 0")
        if self.min_new_tokens is not None and self.min_new_tokens < 0:
            raise bad_setting("min_new_tokens", self.min_new_tokens, "must be >= 0")
        shortest, longest = self.length_limits()
        if shortest > longest:
            name = "min_new_tokens" if self.min_new_tokens is not None else "min_length"
            limit = ("max_new_tokens" if self.max_new_tokens is not None else "max_length")
            raise bad_setting(name, getattr(self, name),
                       f"it asks for longer sequences than {limit}={getattr(self, limit)} "
                       "allows; lower it or raise the limit")

    def length_limits(self) -> tuple[int, int]:
        """``(min_length, max_length)`` in force, both counting the decoder start token."""
        longest = self.max_new_tokens + 1 if self.max_new_tokens is not None else self.max_length
        shortest = self.min_new_tokens + 1 if self.min_new_tokens is not None else self.min_length
        return shortest, int(longest)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ construction
    @classmethod
    def field_names(cls) -> list[str]:
        """The settings, in declaration order (the keys of ``generation_config.json``)."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def _reject_unknown(cls, keys: Any, what: str) -> None:
        known = cls.field_names()
        for key in keys:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" Did you mean '{close[0]}'?" if close else ""
                raise ConfigError(f"unknown generation {what} '{key}'.{hint} "
                                  f"Known settings: {', '.join(known)}")

    @classmethod
    def from_model_config(cls, config: Any, **overrides: Any) -> "GenerationConfig":
        """Defaults plus the special token ids of a model config (object or dict), then
        ``overrides``.

        The ids copied are ``bos/eos/pad/decoder_start/forced_bos/forced_eos_token_id``; a config
        without one of them leaves it unset.
        """
        get = config.get if isinstance(config, Mapping) else (
            lambda name, default=None: getattr(config, name, default))
        ids = {name: get(name) for name in TOKEN_FIELDS if get(name) is not None}
        cls._reject_unknown(overrides, "override")
        return cls(**{**ids, **overrides})

    def replace(self, **overrides: Any) -> "GenerationConfig":
        """A validated copy with ``overrides`` applied (unknown names raise ``ConfigError``)."""
        self._reject_unknown(overrides, "override")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *,
                  source: str = "generation config") -> "GenerationConfig":
        """Build from the content of a ``generation_config.json``.

        A dict written by transformers (it carries ``transformers_version``) may hold settings
        bertforge does not know: they are ignored, except those that would change the generated
        tokens (``suppress_tokens``, ``bad_words_ids``, ...), which raise ``ConfigError`` unless
        they hold their neutral value. There, null stands for "the default", and a file with
        neither ``max_length`` nor ``max_new_tokens`` means 20 new tokens (max_length 21), as to
        transformers. A hand-written dict must use known settings only. ``eos_token_id`` may be
        a list of one id.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a JSON object of generation settings, got "
                              f"{type(data).__name__}")
        written_by_hf = "transformers_version" in data
        known = set(cls.field_names())
        values: dict[str, Any] = {}
        try:
            for key, value in data.items():
                if key in known:
                    if value is None and written_by_hf:
                        continue
                    values[key] = value
                elif key in _UNSUPPORTED_NEUTRAL and value not in _UNSUPPORTED_NEUTRAL[key]:
                    raise ConfigError(f"setting {key}={value!r} is not supported by bertforge's "
                                      f"generate; remove it or set it to null")
                elif not written_by_hf and key not in ("bertforge_version", *_UNSUPPORTED_NEUTRAL):
                    cls._reject_unknown([key], "setting")
            if written_by_hf and values.get("max_length") is None \
                    and values.get("max_new_tokens") is None:
                values["max_length"] = _HF_DEFAULT_NEW_TOKENS + 1  # + the decoder start token
            eos = values.get("eos_token_id")
            if isinstance(eos, list):
                if len(eos) != 1:
                    raise bad_setting("eos_token_id", eos, "bertforge generates with one EOS id; "
                               "keep the one the model was trained with")
                values["eos_token_id"] = eos[0]
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """Every setting (nulls included) plus ``bertforge_version``: the file's content."""
        from bertforge import __version__

        return {**dataclasses.asdict(self), "bertforge_version": __version__}

    # ------------------------------------------------------------------ files
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``directory/generation_config.json`` atomically (the directory is created);
        returns its path. transformers' ``GenerationConfig.from_pretrained`` reads it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return write_json_atomic(directory / GENERATION_CONFIG_NAME, self.to_dict())

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> "GenerationConfig":
        """Read ``generation_config.json`` from a model directory (or that file's own path),
        whether bertforge or transformers wrote it."""
        path = Path(directory)
        if path.is_dir():
            path = path / GENERATION_CONFIG_NAME
        if not path.exists():
            raise ConfigError(f"{path}: no such file; save one with GenerationConfig.save or "
                              "build the settings with GenerationConfig.from_model_config")
        data = read_json(path, error=ConfigError, hint="fix the file or save it again")
        return cls.from_dict(data, source=str(path))
