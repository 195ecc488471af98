"""The ``bertforge`` command: one subcommand per user journey, generated from the commands' typed
configs (``bertforge.commands``); argument handling only.

Each config field becomes an option (``vocab_size`` -> ``--vocab-size``; a bool a switch; a list
several values; choices, bounds, positional arguments and old names from the field's metadata);
every command also takes ``--config FILE.yaml`` and ``--key=value`` / ``--section.key=value``.
Defaults < YAML file < command line are merged by ``bertforge.core.schema.load_config``, which
names an unknown key's closest valid one. Commands import their back ends when they run, so
``--help`` stays instant (no torch), and a command line builds only its own command's parser
(``bertforge --help`` lists the commands from ``COMMANDS`` without building theirs).

``UserError`` becomes ``error: <message>`` and exit status 2, ``RunError`` the same with status 1,
a stop signal (SIGTERM/SIGUSR1 outside the train loop) ``stopped by SIGTERM`` and 128 + its
number; never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import platform
import sys
import textwrap
import typing
from typing import Any, Sequence

from bertforge.commands import COMMANDS, Command
from bertforge.core.numbers import ascii_int
from bertforge.core.schema import (REQUIRED, closest_key, config_keys, default_of, describe,
                                   deprecation_note, flag, load_config, section_type)
from bertforge.core.signals import Stopped, raise_on_stop
from bertforge.errors import ConfigError, RunError, UserError, os_error_text

# Namespace entries that are not config keys (config keys never contain "=").
COMMAND, PARSER, YAML, VERBOSE, OPTION = "=command", "=parser", "=yaml", "=verbose", "=option."
BY_NAME = {c.name: c for c in COMMANDS}


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the hand-written layout of epilogs (defaults are part of each option's help)."""


class _Renamed(argparse.Action):
    """An old option name: stores like the new one, after a one-line deprecation note."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kw: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        deprecation_note(str(option), self.new)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def _number(kind: type, minimum: float | None) -> Any:
    """argparse type of an int/float option with an optional lower bound. Whole numbers are
    ASCII digits (``int`` alone would read "３" or "1_000")."""
    def parse(text: str) -> Any:
        value = kind(text) if kind is not int else ascii_int(text, negative=True)
        if value is None:
            raise argparse.ArgumentTypeError("must be a whole number written with the digits "
                                             f"0-9, got {text}")
        if minimum is not None and value < minimum:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {what} >= {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


def _base(hint: Any) -> Any:
    """``Optional[X]`` -> X."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _help(f: dataclasses.Field, positional: bool, text: str | None = None) -> str:
    """argparse help of a field: ``text`` (else the field's own) and its default."""
    text = (f.metadata.get("help", "") if text is None else text).replace("%", "%%")
    default = default_of(f)
    if positional:
        return text
    if isinstance(default, str) and default == REQUIRED:
        return f"{text} (required)"
    if default is None and "default" in text.lower():  # the text says what unset means
        return text
    return f"{text} (default: {default})"


def _kwargs(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """argparse keywords of one config field (without names, dest and default)."""
    meta, base = f.metadata, _base(hint)
    kw: dict[str, Any] = {}
    if base is bool:
        return {"action": "store_true"}
    if meta.get("parse"):  # one text -> the whole value (``--seeds 1,2,3``)
        return {"type": meta["parse"], "metavar": meta.get("metavar")}
    if typing.get_origin(base) is list:
        base = typing.get_args(base)[0]
        kw.update({"action": "append"} if meta.get("repeat") else {"nargs": "+"})
    if base in (int, float):
        kw["type"] = _number(base, meta.get("minimum"))
    if meta.get("choices"):
        kw["choices"] = list(meta["choices"])
    if meta.get("metavar"):
        kw["metavar"] = meta["metavar"]
    return kw


def _add_field(p: argparse.ArgumentParser, f: dataclasses.Field, hint: Any,
               dest: str) -> argparse.Action:
    """The option (or positional argument) of ``f``, with the field's own help; returns it."""
    kw = _kwargs(f, hint)
    positional = f.metadata.get("positional")
    if positional:
        # (None, not SUPPRESS: argparse checks an absent optional positional's default against
        # the choices; _values drops it.)
        nargs = {"nargs": "?", "default": None} if positional == "?" else {}
        return p.add_argument(f.name, help=_help(f, True), **nargs, **kw)
    action = p.add_argument(flag(f.name), dest=dest, default=argparse.SUPPRESS,
                            help=_help(f, False), **kw)
    for old in f.metadata.get("aliases", ()):
        if old == "config":  # --config is the YAML file of every command; see _yaml_file
            continue
        renamed = {"nargs": 0, "const": True} if kw.get("action") == "store_true" else {
            k: v for k, v in kw.items() if k != "action"}
        p.add_argument(flag(old), dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                       action=_Renamed, new=flag(f.name), **renamed)
    return action


def _ordered(cls: type) -> list[dataclasses.Field]:
    """Flags in help order: positional arguments, required options, the class's own options,
    then those it inherits (e.g. the shared generation options)."""
    own = getattr(cls, "__annotations__", {})

    def rank(f: dataclasses.Field) -> int:
        default = default_of(f)
        if f.metadata.get("positional"):
            return 0
        return 1 if isinstance(default, str) and default == REQUIRED else 2 if f.name in own else 3

    return sorted(dataclasses.fields(cls), key=rank)


def _example(cls: type) -> str:
    """A ``--key=value`` of ``cls`` for the help text, with its default where it has one."""
    fields = [f for f in _ordered(cls) if f.metadata.get("cli", True)
              and not f.metadata.get("positional")]
    set_ = [f for f in fields if default_of(f) not in (None, REQUIRED)]
    return f"--{set_[-1].name}={default_of(set_[-1])}" if set_ else f"--{fields[-1].name}=..."


def _epilog(command: Command) -> str:
    if not command.flat:
        from bertforge.recipes import RECIPES_DIR, list_recipes, recipe_summary

        folder = (f", folder optional; copy one from {RECIPES_DIR} to edit it"
                  if "pretrain" in command.recipes else "")
        names = list_recipes(*command.recipes)
        pad = max(map(len, names), default=0) + 2
        return (f"recipes (--config NAME{folder}):\n"
                + "\n".join(f"  {name:<{pad}}{recipe_summary(name)}" for name in names)
                + "\n\nconfig keys (set in the YAML file or as --key=value):\n"
                + "\n".join(describe(command.config, helps=command.help_of_keys())))
    renamed = [f"{flag(old)} (now {flag(f.name)})" for f in dataclasses.fields(command.config)
               for old in f.metadata.get("aliases", ())]
    text = ("Every option is also a config key: give settings in a YAML file with --config "
            f"FILE.yaml, or as --key=value (e.g. {_example(command.config)}); the command line "
            "wins over the file.")
    if command.saves:
        text += f" The resolved config is saved {command.saves}."
    if renamed:
        text += f" Old names still accepted (with a note): {', '.join(renamed)}."
    return textwrap.fill(text, 88)


class _CommandParser(argparse.ArgumentParser):
    """The parser of one command. Its help reads the recipe files and the registries, so it is
    made when the help is printed, not when a command line is parsed: the epilog (recipes,
    every config key) and the options whose help ``command.key_help`` gives (``--task``'s
    tasks)."""

    def __init__(self, command: Command, prog: str) -> None:
        super().__init__(prog=prog, description=command.help, formatter_class=_Formatter)
        self.command = command
        self.fields: dict[str, tuple[argparse.Action, dataclasses.Field]] = {}
        self.help_made = False

    def format_help(self) -> str:
        if not self.help_made:
            for name, text in self.command.help_of_keys().items():
                if name in self.fields:
                    action, f = self.fields[name]
                    action.help = _help(f, bool(f.metadata.get("positional")), text)
            self.epilog = _epilog(self.command)
            self.help_made = True
        return super().format_help()


def command_parser(command: Command, prog: str) -> argparse.ArgumentParser:
    """The parser of one command (``prog``: ``bertforge NAME``), built when that command is
    parsed; its help text is made when it is printed (:class:`_CommandParser`)."""
    p = _CommandParser(command, prog)
    p.set_defaults(**{COMMAND: command, PARSER: p})
    p.add_argument("--config", dest=YAML, default=None, metavar="RECIPE_OR_YAML"
                   if command.recipes else "FILE.yaml",
                   help="A recipe name (see below) or a YAML file." if command.recipes else
                   "A YAML file of settings (keys as in --key=value); the command line "
                   "overrides it.")
    if command.options is not None:
        hints = typing.get_type_hints(command.options)
        for f in dataclasses.fields(command.options):
            _add_field(p, f, hints[f.name], OPTION + f.name)
    if command.flat:
        hints = typing.get_type_hints(command.config)
        for f in _ordered(command.config):
            if f.metadata.get("cli", True) and section_type(f) is None:
                p.fields[f.name] = (_add_field(p, f, hints[f.name], f.name), f)
    return p


class _Commands(argparse._SubParsersAction):
    """The COMMAND argument. ``bertforge --help`` lists every command with its one-line help
    (from ``COMMANDS``); a command's parser is built only when that command is parsed, so one
    command line builds one parser. An unknown name gets the closest one."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.choices = None  # checked in __call__, with a did-you-mean
        for command in COMMANDS:
            self._choices_actions.append(self._ChoicesPseudoAction(command.name, (),
                                                                   command.help))

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        name = values[0]
        if name not in BY_NAME:
            close = difflib.get_close_matches(name, list(BY_NAME), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise argparse.ArgumentError(self, f"invalid choice: {name!r} (choose from "
                                         f"{', '.join(map(repr, BY_NAME))}).{hint}")
        if name not in self._name_parser_map:
            self._name_parser_map[name] = command_parser(BY_NAME[name],
                                                         f"{self._prog_prefix} {name}")
        super().__call__(parser, namespace, values, option)


def _version() -> str:
    """``bertforge 0.1.0 (Python 3.11.7, torch 2.13.0)``, read from the installed metadata, so
    that printing it imports nothing heavy."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (f"bertforge {of('bertforge')} (Python {platform.python_version()}, torch "
            f"{of('torch')})")


def build_parser() -> argparse.ArgumentParser:
    """The ``bertforge`` parser; each command's own parser is built when it is parsed."""
    parser = argparse.ArgumentParser(
        prog="bertforge", formatter_class=_Formatter,
        description="BERT and BART pretraining and fine-tuning with Hugging Face checkpoints "
                    "natively.")
    parser.add_argument("-v", "--verbose", dest=VERBOSE, action="store_true",
                        help="Debug logging.")
    parser.add_argument("--version", action="version", version=_version(),
                        help="Print the versions of bertforge, Python and torch, and exit.")
    parser.add_subparsers(dest="command", metavar="COMMAND", required=True, action=_Commands)
    return parser


# --- from the parsed arguments to a config -----------------------------------------------------


def _switch_values(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--cased=false``: a switch given a value is a ``--key=value`` setting, which argparse
    would refuse; take those out of ``argv``."""
    names = [a for a in argv if not a.startswith("-")]
    command = BY_NAME.get(names[0]) if names else None
    if command is None or not command.flat:
        return argv, []
    hints = typing.get_type_hints(command.config)
    switches = {f.name for f in dataclasses.fields(command.config) if _base(hints[f.name]) is bool}
    kept, settings = [], []
    for arg in argv:
        name, eq, value = arg[2:].partition("=")
        if arg.startswith("--") and eq and name.replace("-", "_") in switches:
            settings.append(f"--{name.replace('-', '_')}={value}")
        else:
            kept.append(arg)
    return kept, settings


def _sort_extra(command: Command, extra: Sequence[str],
                parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """The arguments argparse left: (``--key=value`` overrides, passed-through settings)."""
    keys = set(config_keys(command.config))
    hints = typing.get_type_hints(command.config)
    # A dotted key under a plain field (``--data.task_name`` beside evaluate's ``--data``) is
    # not this config's: it is passed through too.
    top = {f.name for f in dataclasses.fields(command.config)}
    sections = {f.name for f in dataclasses.fields(command.config)
                if dataclasses.is_dataclass(_base(hints[f.name]))}
    overrides, passed, stray = [], [], []
    for item in extra:
        name, eq, _ = item[2:].partition("=")
        head = name.split(".")[0]
        if not item.startswith("--"):
            stray.append(item)
        elif command.passthrough and (head not in top or "." in name and head not in sections):
            passed.append(item)
        elif eq:
            overrides.append(item)
        elif name in keys:
            raise ConfigError(f"override '{item}' must look like --section.key=value")
        else:
            raise _unknown_option(command, item, parser)
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    return overrides, passed


def _unknown_option(command: Command, item: str, parser: argparse.ArgumentParser) -> ConfigError:
    """An unknown ``--name`` without a value: the closest flag, else the closest config key."""
    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    hint = next(iter(difflib.get_close_matches(item, flags, n=1, cutoff=0.7)), None)
    close = None if hint else closest_key(command.config, item[2:].replace("-", "_"))
    if close:
        hint = flag(close) if command.flat and "." not in close else f"--{close}=..."
    return ConfigError(f"unknown option '{item}' of `bertforge {command.name}`."
                       f"{f' Did you mean {hint!r}?' if hint else ''} Run with --help to list "
                       "the options.")


def _values(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line as a nested dict of config keys."""
    values: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if dest.startswith("=") or dest == "command" or value is None:
            continue
        *parents, leaf = dest.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


def _yaml_file(command: Command, given: str | None, values: dict[str, Any]) -> Any:
    """The YAML layer of ``--config``: a recipe name or a file. A command whose own setting was
    once called ``--config`` (convert's model config) still takes a non-YAML value for it."""
    if given is None:
        return None
    renamed = [f.name for f in dataclasses.fields(command.config)
               if "config" in f.metadata.get("aliases", ())]
    if renamed and not given.endswith((".yaml", ".yml")):
        deprecation_note(f"--config {given} (the {renamed[0].replace('_', ' ')})",
                         flag(renamed[0]))
        values.setdefault(renamed[0], given)
        return None
    if command.recipes:
        from bertforge.recipes import resolve_recipe

        return resolve_recipe(given)
    return given


def configure(command: Command, args: argparse.Namespace,
              extra: Sequence[str]) -> tuple[Any, Any]:
    """(config, run options) of a parsed command line; ConfigError for any mistake."""
    overrides, passed = _sort_extra(command, extra, getattr(args, PARSER))
    values = _values(args)
    if passed:
        values[command.passthrough] = passed
    path = _yaml_file(command, getattr(args, YAML), values)
    cfg = load_config(command.config, path, overrides, values=values)
    options = None
    if command.options is not None:
        options = command.options(**{f.name: getattr(args, OPTION + f.name)
                                     for f in dataclasses.fields(command.options)
                                     if hasattr(args, OPTION + f.name)})
    return cfg, options


def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """argparse's part: (namespace, the ``--key=value`` settings and other leftovers)."""
    argv, switches = _switch_values(list(argv))
    args, extra = build_parser().parse_known_args(argv)
    return args, [*switches, *extra]


def resolve(argv: Sequence[str]) -> tuple[Command, Any, Any]:
    """(command, config, run options) of a command line, without running it."""
    args, extra = _parse(argv)
    command = getattr(args, COMMAND)
    return (command, *configure(command, args, extra))


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = _parse(sys.argv[1:] if argv is None else argv)
    verbose = getattr(args, VERBOSE)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s" if verbose else "%(message)s")
    command: Command = getattr(args, COMMAND)
    try:
        with raise_on_stop():  # SIGTERM at any moment outside the train loop: a clean exit
            cfg, options = configure(command, args, extra)
            return (command.run(cfg, options) if command.options is not None
                    else command.run(cfg))
    except (UserError, RunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # permissions, a full disk, a vanished file: not a bug of ours
        print(f"error: {os_error_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # the train loop's says what was kept
        print(f"interrupted: {exc}" if str(exc) else "interrupted", file=sys.stderr)
        return 130
    except Stopped as exc:  # the command printed what it kept; say why it ended
        print(f"stopped by {exc.signal_name}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
