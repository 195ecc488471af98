"""Typed configuration for every command: dataclass fields with help, YAML files, dotted
overrides, did-you-mean errors, and the ``--help`` listing.

A config is a dataclass whose fields are made with :func:`opt`: the help text, and what the
command line needs to know (choices, a lower bound, a positional argument, old names), live next
to the type and default. :func:`load_config` merges defaults < a YAML file < the command line
(typed values from the generated flags, then ``--section.key=value`` overrides) with OmegaConf's
structured configs, which reject unknown keys and coerce types; this module only turns its
errors into one-line messages that name the key and suggest the closest valid one. Each config
validates itself in ``__post_init__`` (``check_fields`` does the declared choices and bounds).
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException,
                              ValidationError)

from bertforge.core.arguments import checked
from bertforge.core.io import write_text_atomic
from bertforge.core.limits import check_choice
from bertforge.core.paths import check_path_text
from bertforge.core.numbers import ascii_int
from bertforge.errors import ConfigError

T = TypeVar("T")
REQUIRED: Any = MISSING  # the default of a setting without one ("???" in a saved file)


def opt(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None,
        run_defining: bool = False, choices: Sequence[str] | None = None,
        minimum: float | None = None, positional: bool | str = False,
        aliases: Sequence[str] = (), metavar: str | None = None, repeat: bool = False,
        parse: Any = None, cli: bool = True) -> Any:
    """A dataclass field with its help text (``factory`` for mutable defaults and sections).

    ``run_defining``: the key shapes a run's trajectory (a resume with another value would
    silently train something else), so a resume must match the checkpoint's value; on a section
    it covers every key inside. For the generated command line: ``choices`` and ``minimum``
    (also checked by :func:`check_fields`), ``positional`` (True, or "?" when it may be left
    out), ``aliases`` (old names, accepted with a deprecation note), ``metavar``, ``repeat``
    (a list option given once per value), ``parse`` (a text -> value function for the flag) and
    ``cli=False`` (no flag: set in the YAML file or as ``--key=value`` only).
    """
    meta = {"help": help, "run_defining": run_defining, "choices": tuple(choices or ()),
            "minimum": minimum, "positional": positional, "aliases": tuple(aliases),
            "metavar": metavar, "repeat": repeat, "parse": parse, "cli": cli}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def section_type(f: dataclasses.Field) -> type | None:
    """The dataclass of a nested section field (sections are built by their default factory)."""
    sub = f.default_factory
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


def default_of(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def check_fields(cfg: Any, prefix: str = "") -> None:
    """The declared rules of ``cfg``'s own fields: set when required, not blank text, one of
    ``choices``, at least ``minimum``. Raises ConfigError naming the key."""
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), prefix + f.name
        if isinstance(value, str) and value == REQUIRED:
            raise ConfigError(f"config key '{key}' must be set")
        if value is None:
            continue
        refuse_blank(value, key, f.metadata.get("positional", False))
        if f.metadata.get("choices") and isinstance(value, str):  # (true/false read as bools)
            check_choice(value, key, f.metadata["choices"], ConfigError)
        low = f.metadata.get("minimum")
        if low is not None and not (isinstance(value, (int, float)) and value >= low):
            raise ConfigError(f"{key} must be >= {low:g}, got {value!r}")


def refuse_blank(value: Any, key: str, positional: bool | str = False) -> None:
    """ConfigError naming the option when text given for ``key`` (or an item of a list of
    texts) is empty or only white space: read as a path it would be the current directory, as
    a name or a field nothing, and neither is what anybody means by it."""
    option = (f"the {key.upper()} argument" if positional else
              f"--{key}" if "." in key else flag(key))
    for item in value if isinstance(value, list) else [value]:
        check_path_text(item, option, "a value (see --help)")


def refuse_blank_fields(cfg: Any, prefix: str = "") -> None:
    """:func:`refuse_blank` over every field of ``cfg`` and of its sections."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            refuse_blank_fields(value, f"{prefix}{f.name}.")
        elif value is not None:
            refuse_blank(value, prefix + f.name)


def run_defining_keys(cls: type, prefix: str = "") -> list[str]:
    """Dotted keys (or section prefixes ending in ".") marked ``run_defining`` in ``cls``."""
    out = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if f.metadata.get("run_defining"):
            out.append(key + "." if section_type(f) is not None else key)
        elif section_type(f) is not None:
            out += run_defining_keys(section_type(f), key + ".")
    return out


def config_keys(cls: type, prefix: str = "") -> list[str]:
    """All dotted keys of a config dataclass, sections included."""
    out = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        out.append(key)
        if section_type(f) is not None:
            out += config_keys(section_type(f), key + ".")
    return out


def closest_key(cls: type, key: str) -> str | None:
    """The valid key meant by an unknown ``key``: the same last name in another section
    (``train.lr`` -> ``optim.lr``), else the closest whole key, else the closest last name."""
    valid = config_keys(cls)
    leaf = key.rsplit(".", 1)[-1]
    same = [k for k in valid if k.rsplit(".", 1)[-1] == leaf and k != key]
    if same:
        return same[0]
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        return close[0]
    leaves: dict[str, str] = {}
    for k in valid:
        leaves.setdefault(k.rsplit(".", 1)[-1], k)
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)
    return leaves[close[0]] if close else None


def unknown_key_error(cls: type, key: str, where: str) -> ConfigError:
    close = closest_key(cls, key)
    hint = f" Did you mean '{close}'?" if close else ""
    return ConfigError(f"unknown config key '{key}' in {where}.{hint} "
                       f"Run with --help to list the valid keys.")


def deprecation_note(old: str, new: str) -> None:
    """The one line that tells a user an old name still works but is going away."""
    print(f"note: {old} is deprecated and will be removed; use {new}", file=sys.stderr)


def _rename_aliases(cls: type, data: Any, where: str, prefix: str = "") -> Any:
    """``data`` (a plain nested dict) with old key names replaced by the current ones."""
    if not isinstance(data, dict):
        return data
    fields = {f.name: f for f in dataclasses.fields(cls)}
    renamed = {}
    for f in fields.values():
        for old in f.metadata.get("aliases", ()):
            renamed[old] = f.name
    out = {}
    for key, value in data.items():
        if key in renamed and key not in fields:
            deprecation_note(f"'{prefix}{key}' (in {where})", f"'{prefix}{renamed[key]}'")
            key = renamed[key]
        sub = section_type(fields[key]) if key in fields else None
        out[key] = _rename_aliases(sub, value, where, f"{prefix}{key}.") if sub else value
    return out


def _parse_overrides(overrides: Sequence[str]) -> list[str]:
    dotlist = []
    for raw in overrides:
        item = raw[2:] if raw.startswith("--") else raw
        if "=" not in item:
            raise ConfigError(f"override '{raw}' must look like --section.key=value")
        key, _, value = item.partition("=")
        if not value.strip():
            raise ConfigError(f"--{key} is given no value ({raw!r}); give one, or null to "
                              "unset an optional setting")
        dotlist.append(item)
    return dotlist


def _escape(value: Any) -> Any:
    """Command-line text taken literally: OmegaConf would read ``${...}`` as a reference."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value


def _read_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        layer = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError and friends: show where the file is broken
        raise ConfigError(f"cannot parse config file {path}: {exc}") from None
    if not isinstance(layer, DictConfig):
        kind = "a list" if isinstance(layer, ListConfig) else "not a mapping"
        raise ConfigError(f"config file {path}: the top level is {kind}; it must be a mapping "
                          "of keys to values (e.g. `train:` then indented `max_steps: 100`)")
    return layer


def _layers(cls: type, path: str | Path | None, overrides: Sequence[str],
            values: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    """(where, plain nested dict) per source, lowest precedence first, old names renamed."""
    layers: list[tuple[str, Any]] = []
    if path is not None:
        layers.append((str(path), OmegaConf.to_container(_read_yaml(path))))
    if values:
        layers.append(("the command line", _escape(dict(values))))
    dotlist = _parse_overrides(overrides)
    dotted = OmegaConf.to_container(OmegaConf.from_dotlist(dotlist))
    _keep_text(cls, dotted, dotlist)
    layers.append(("the command line", dotted))
    renamed = [(where, _rename_aliases(cls, data, where)) for where, data in layers]
    for where, data in renamed:
        _check_whole_numbers(cls, data, where)
    return renamed


def _is_text(cls: type, key: str) -> bool:
    """Whether dotted ``key`` names a ``str`` (or ``Optional[str]``) field of ``cls``."""
    *sections, name = key.split(".")
    for part in sections:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        cls = section_type(fields[part]) if part in fields else None
        if cls is None:
            return False
    hint = typing.get_type_hints(cls).get(name)
    return hint is str or (typing.get_origin(hint) is typing.Union
                           and [a for a in typing.get_args(hint) if a is not type(None)] == [str])


def _keep_text(cls: type, dotted: dict, dotlist: Sequence[str]) -> None:
    """A text key's ``--key=value`` is the text as typed: OmegaConf would read YAML in it
    (``--embedding.query_prompt=query: `` as a mapping). Quoted text and ``null`` keep their
    YAML meaning."""
    for item in dotlist:
        key, _, raw = item.partition("=")
        parts = key.split(".")
        holder = dotted
        for part in parts[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if (isinstance(holder, dict) and parts[-1] in holder
                and not isinstance(holder[parts[-1]], str) and holder[parts[-1]] is not None
                and _is_text(cls, key)):
            holder[parts[-1]] = _escape(raw)


def _is_int(hint: Any) -> bool:
    """``int``, ``Optional[int]`` or a list of them."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (list, typing.Union) and len(args) == 1:
        return _is_int(args[0])
    return hint is int


def _check_whole_numbers(cls: type, data: Any, where: str, prefix: str = "") -> None:
    """Text given for an integer key must be ASCII digits: OmegaConf would convert it with
    ``int``, which reads "３" as 3 and fails on "²" with a message that names no digits."""
    if not isinstance(data, dict):
        return
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, sub = data[f.name], section_type(f)
        if sub is not None:
            _check_whole_numbers(sub, value, where, f"{prefix}{f.name}.")
        elif _is_int(hints[f.name]):
            for item in value if isinstance(value, list) else [value]:
                if (isinstance(item, str) and item != REQUIRED and "${" not in item
                        and ascii_int(item, negative=True) is None):
                    raise ConfigError(f"bad value for '{prefix}{f.name}' in {where}: {item!r} "
                                      "is not a whole number written with the digits 0-9")


def _merge(cls: type, schema: Any, layer: Any, where: str) -> Any:
    try:
        return OmegaConf.merge(schema, layer)
    except ConfigKeyError as exc:
        raise unknown_key_error(cls, exc.full_key or str(exc.key), where) from None
    except ValidationError as exc:
        msg = str(exc.msg or exc).splitlines()[0]
        if not exc.full_key:
            # OmegaConf names no key when a whole section is given a plain value.
            sections = [f.name for f in dataclasses.fields(cls) if section_type(f) is not None]
            raise ConfigError(
                f"bad value in {where}: {msg}. {', '.join(sections)} are sections: set "
                f"their keys (--section.key=value), not the section itself") from None
        raise ConfigError(f"bad value for '{exc.full_key}' in {where}: {msg}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config in {where}: {exc}") from None


@checked
def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (),
                *, values: Mapping[str, Any] | None = None) -> T:
    """Build ``cls`` from its defaults, then a YAML file, then the command line: ``values``
    (a nested dict of typed values, e.g. from the generated flags) and ``--key=value``
    overrides, in that order; the later of two settings of a key wins."""
    schema = OmegaConf.structured(cls)
    layers = _layers(cls, path, overrides, values)
    _check_left_to_user(layers)
    for where, layer in layers:
        schema = _merge(cls, schema, layer, where)
    try:
        return OmegaConf.to_object(schema)  # runs every __post_init__
    except OmegaConfBaseException as exc:
        if isinstance(exc.__cause__, ConfigError):
            raise exc.__cause__ from None
        if isinstance(exc, MissingMandatoryValue):
            raise ConfigError(f"config key '{exc.full_key}' must be set"
                              f"{_how_to_set(str(exc.full_key))}") from None
        raise ConfigError(f"invalid config: {exc}") from None


def _dotted(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix.rstrip("."): data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_dotted(value, f"{prefix}{key}."))
    return out


def _check_left_to_user(layers: list[tuple[str, Any]]) -> None:
    """A key a recipe sets to ``???`` is the user's to give (OmegaConf's "missing" marker; a
    merge would otherwise keep the default under it): ConfigError unless a later layer sets it."""
    flat = [(where, _dotted(layer)) for where, layer in layers]
    for i, (where, values) in enumerate(flat):
        for key, value in values.items():
            if value == "???" and not any(key in later for _, later in flat[i + 1:]):
                raise ConfigError(f"config key '{key}' must be set: {where} leaves it to you; "
                                  f"give --{key}=VALUE")


def flag(key: str) -> str:
    """The command-line flag of a top-level config key: ``max_seq_length`` ->
    ``--max-seq-length``."""
    return "--" + key.replace("_", "-")


def _how_to_set(key: str) -> str:
    given = f"--{key}=VALUE" if "." in key else flag(key)
    return f": give {given}, or `{key}:` in the --config file"


def to_dict(cfg: Any) -> dict:
    """Plain nested dict of a config instance (for saving and JSON reports)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path, *, unset: Sequence[str] = ()) -> Path:
    """Write the resolved config as YAML (atomically), loadable again with ``load_config``;
    the keys in ``unset`` are written as ``???`` (must be given again when the file is used)."""
    data = OmegaConf.structured(cfg)
    for key in unset:
        OmegaConf.update(data, key, MISSING)
    return write_text_atomic(Path(path), OmegaConf.to_yaml(data))


def describe(cls: type, prefix: str = "", helps: Mapping[str, str] | None = None) -> list[str]:
    """One help entry per key: ``--key=DEFAULT  (type)`` and its help text, the field's own
    unless ``helps`` has one for the dotted key (text a lower layer cannot write, e.g. the task
    registry's list of tasks); a help of several lines is indented as one."""
    lines = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if section_type(f) is not None:
            lines += describe(section_type(f), key + ".", helps)
            continue
        typ = getattr(f.type, "__name__", str(f.type)).replace("typing.", "")
        mark = "  [run-defining: a resume must match]" if f.metadata.get("run_defining") else ""
        text = (helps or {}).get(key, f.metadata.get("help", "")).replace("\n", "\n      ")
        lines.append(f"  --{key}={default_of(f)!r}  ({typ}){mark}\n      {text}")
    return lines


__all__ = ["REQUIRED", "check_fields", "closest_key", "config_keys", "default_of", "describe",
           "deprecation_note", "flag", "load_config", "opt", "refuse_blank",
           "refuse_blank_fields", "run_defining_keys", "save_config", "section_type", "to_dict",
           "unknown_key_error"]
