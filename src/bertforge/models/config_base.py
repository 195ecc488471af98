"""What every model config shares: reading and writing Hugging Face config.json, presets, overrides.

A family's config (``BertConfig``, ``BartConfig``) is a dataclass whose field names are those of
the transformers config of the same family, so a config.json moves between the two libraries
unchanged. It subclasses ``ModelConfig`` and declares its ``model_type``, its presets and the
transformers settings it cannot honour (``check_hf_semantics``); loading, overriding, label
handling and saving are here, once.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bertforge.core.arguments import checked
from bertforge.errors import ConfigError
from bertforge.core.io import write_json_atomic
from bertforge.core.jsonfile import read_json_object

# Keys transformers writes into every config.json. A dict holding one of them was written by
# transformers, whose configs carry many generic attributes: unknown keys are then tolerated.
# Hand-written dicts get strict checking instead.
HF_MARKERS = ("model_type", "transformers_version", "architectures", "_name_or_path")
# Keys our own to_dict writes that are derived from fields, not fields themselves.
DERIVED_KEYS = ("bertforge_version", "bertforge_only", "label2id", "dtype", "torch_dtype",
                "tie_word_embeddings", "model_type")

C = TypeVar("C", bound="ModelConfig")


def read_config_file(path: Path) -> dict[str, Any]:
    """The parsed config.json at ``path``; ConfigError naming the file (and the line and column
    of invalid JSON, both places of a key given twice) when it cannot be read or is not a JSON
    object. A byte-order mark is accepted."""
    return read_json_object(path, error=ConfigError, what="model config",
                            hint="fix the file, or save the model again")


def config_file(path: Path) -> Path | None:
    """The config.json that ``path`` names (the file itself, or the one in a model directory);
    None when ``path`` is neither (a preset name); ConfigError for a directory without one."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} is a directory without config.json: not a model "
                              "directory")
        return path / "config.json"
    return path if path.is_file() else None


def unknown_model(name: str, presets: list[str]) -> ConfigError:
    """The error for a model name that is neither a config.json, a model directory nor one of
    ``presets`` (with the closest preset)."""
    close = difflib.get_close_matches(name, presets, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"'{name}' is neither an existing config.json / model directory nor a "
                       f"preset.{hint} Valid presets: {', '.join(presets)}")


def head_split(width: int) -> str:
    """A head count that divides ``width``, for messages: the one whose heads are nearest 64
    wide (BERT's and BART's size), e.g. ``12 heads of 64``, ``4 heads of 25``, ``1 head of 7``."""
    count = min((n for n in range(1, width + 1) if width % n == 0),
                key=lambda n: (abs(width // n - 64), n))
    return f"{count} head{'s' * (count > 1)} of {width // count}"


def check_label_maps(data: dict[str, Any]) -> None:
    """ConfigError when config.json's label maps name one label twice: two ids with one name
    in ``id2label``, two names with one id in ``label2id``, or a ``label2id`` over the same
    names that contradicts ``id2label`` (a prediction's label would depend on which map a
    reader takes). A ``label2id`` left at transformers' ``LABEL_N`` defaults is not compared."""
    id2label, label2id = data.get("id2label"), data.get("label2id")
    if isinstance(id2label, dict):
        first: dict[Any, Any] = {}
        for key, name in id2label.items():
            if name in first:
                raise ConfigError(f"id2label gives the name {name!r} to ids {first[name]} and "
                                  f"{key}; give each label its own name")
            first[name] = key
    if not isinstance(label2id, dict):
        return
    names: dict[Any, Any] = {}
    for name, key in label2id.items():
        if key in names:
            raise ConfigError(f"label2id gives id {key!r} to both {names[key]!r} and {name!r}; "
                              "give each label its own id")
        names[key] = name
    if isinstance(id2label, dict) and set(label2id) == set(id2label.values()):
        for key, name in id2label.items():
            if str(label2id[name]) != str(key):
                raise ConfigError(f"id2label gives id {key} the name {name!r} but label2id "
                                  f"gives {name!r} id {label2id[name]!r}; make the two maps "
                                  "agree (or drop label2id)")


class ModelConfig:
    """Mixin of the family config dataclasses (see the module docstring)."""

    model_type: ClassVar[str]
    """transformers' ``model_type`` of the family ("bert", "bart")."""
    presets: ClassVar[dict[str, dict[str, Any]]]
    """Named shapes: preset name -> field values (everything else keeps its default)."""
    hf_default_num_labels: ClassVar[int]
    """The label count transformers assumes when config.json names no labels."""

    num_labels: int
    id2label: dict[int, str] | None
    architectures: list[str] | None

    # ------------------------------------------------------------------ family hooks
    @classmethod
    def check_hf_semantics(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Refuse transformers settings that would change the computation in ways bertforge
        lacks; may translate keys (returns the dict to build from)."""
        return data

    def extra_json(self) -> dict[str, Any]:
        """Keys ``to_dict`` adds after the fields (e.g. notes for transformers users)."""
        return {}

    def json_model_type(self) -> str:
        """The ``model_type`` written to config.json."""
        return self.model_type

    # ------------------------------------------------------------------ validation helpers
    def check_int(self, name: str, minimum: int) -> None:
        """ConfigError unless field ``name`` is an integer >= ``minimum``."""
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{type(self).__name__}.{name} must be an integer >= {minimum}, "
                              f"got {value!r}")

    def check_probability(self, name: str) -> None:
        """ConfigError unless field ``name`` is a number in [0, 1) (a dropout rate)."""
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ConfigError(f"{type(self).__name__}.{name} must be a probability in [0, 1), "
                              f"got {value!r}")

    def check_positive(self, name: str) -> None:
        """ConfigError unless field ``name`` is a positive finite number."""
        value = getattr(self, name)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"{type(self).__name__}.{name} must be a positive finite number, "
                              f"got {value!r}")

    def check_token_id(self, name: str) -> None:
        """ConfigError unless field ``name`` is None or an id inside the vocabulary."""
        value = getattr(self, name)
        if value is None:
            return
        self.check_int(name, 0)
        if value >= self.vocab_size:  # type: ignore[attr-defined]
            raise ConfigError(f"{type(self).__name__}.{name}={value} is outside the vocabulary "
                              f"(vocab_size={self.vocab_size})")  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ labels
    def _normalize_labels(self) -> None:
        """Called by ``__post_init__``: id2label keys as ints, checked against num_labels."""
        if isinstance(self.id2label, dict):
            try:
                self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{type(self).__name__}.id2label keys must be integers, "
                                  f"got {self.id2label!r}") from exc
        if self.id2label is not None and sorted(self.id2label) != list(range(self.num_labels)):
            raise ConfigError(
                f"{type(self).__name__}.id2label has keys {sorted(self.id2label)} but "
                f"num_labels={self.num_labels}: give one name per label index 0..{self.num_labels - 1}")

    # ------------------------------------------------------------------ construction
    @classmethod
    def field_names(cls) -> list[str]:
        """Names of all dataclass fields (the keys ``from_dict`` understands)."""
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def reject_unknown(cls, values: dict[str, Any], what: str) -> None:
        """ConfigError for the first key of ``values`` that is not a field, with a close match."""
        known = cls.field_names()
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" Did you mean '{close[0]}'?" if close else ""
                raise ConfigError(f"unknown {cls.__name__} {what} '{key}'.{hint} "
                                  f"Known fields: {', '.join(known)}")

    def replace(self: C, **overrides: Any) -> C:
        """A validated copy with ``overrides`` applied.

        Changing ``num_labels`` without new ``id2label`` drops label names that no longer fit.
        """
        self.reject_unknown(overrides, "override")
        if "num_labels" in overrides and "id2label" not in overrides:
            if self.id2label is not None and len(self.id2label) != overrides["num_labels"]:
                overrides["id2label"] = None
        return dataclasses.replace(self, **overrides)  # type: ignore[type-var]

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any], *, source: str = "config") -> C:
        """Build from a config.json-style dict.

        Dicts written by transformers (they carry ``model_type``/``transformers_version``/...) may
        hold extra keys, which are ignored; hand-written dicts must use known keys only.
        """
        data = dict(data)
        written_by_hf = any(key in data for key in HF_MARKERS)
        try:
            data = cls.check_hf_semantics(data)
            check_label_maps(data)
            id2label = data.get("id2label")
            if id2label is not None:
                if "num_labels" in data and data["num_labels"] != len(id2label):
                    raise ConfigError(
                        f"num_labels={data['num_labels']} but id2label has {len(id2label)} entries")
                data["num_labels"] = len(id2label)
            known = set(cls.field_names())
            unknown = {k: v for k, v in data.items() if k not in known}
            if unknown and not written_by_hf:
                cls.reject_unknown({k: v for k, v in unknown.items() if k not in DERIVED_KEYS},
                                   "key")
            return cls(**{k: v for k, v in data.items() if k in known})
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except TypeError as exc:  # e.g. a field given as a list where a number is expected
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def from_json_file(cls: type[C], path: str | os.PathLike[str]) -> C:
        """Read a config.json (ours or transformers')."""
        return cls.from_dict(read_config_file(Path(path)), source=str(path))

    @classmethod
    @checked
    def from_preset(cls: type[C], name: str, **overrides: Any) -> C:
        """Config of the named preset with ``overrides`` applied."""
        if name not in cls.presets:
            close = difflib.get_close_matches(name, cls.presets, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(
                f"unknown {cls.model_type} preset '{name}'.{hint} Valid presets: "
                f"{', '.join(cls.presets)}; or give a path to a config.json / model directory.")
        cls.reject_unknown(overrides, "override")
        fields = {**cls.presets[name], **overrides}
        try:
            return cls(**fields)
        except ConfigError as exc:
            raise ConfigError(f"preset '{name}': {exc}") from None

    @classmethod
    def load(cls: type[C], name_or_path: str | os.PathLike[str]) -> C:
        """Load from a preset name, a config.json file, or a directory holding config.json."""
        file = config_file(Path(name_or_path))
        if file is not None:
            return cls.from_json_file(file)
        name = str(name_or_path)
        if name in cls.presets:
            return cls.from_preset(name)
        raise unknown_model(name, list(cls.presets))

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """config.json content that both bertforge and transformers read."""
        from bertforge import __version__

        out: dict[str, Any] = {"model_type": self.json_model_type()}
        if self.architectures:
            out["architectures"] = list(self.architectures)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name in ("architectures", "num_labels", "id2label"):
                continue
            out[f.name] = getattr(self, f.name)
        # transformers derives num_labels from id2label, so labels are written when they differ
        # from its default.
        if self.id2label is not None or self.num_labels != self.hf_default_num_labels:
            names = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
            out["id2label"] = {str(i): names[i] for i in range(self.num_labels)}
            out["label2id"] = {names[i]: i for i in range(self.num_labels)}
        out["tie_word_embeddings"] = True
        out["bertforge_version"] = __version__
        out.update(self.extra_json())
        return out

    def to_json_file(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as indented, key-sorted JSON, atomically (temp file + rename)."""
        write_json_atomic(path, self.to_dict())
