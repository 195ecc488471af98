"""Type checks of the public Python API's arguments, read from the functions' own annotations.

A public function given an argument of the wrong type (``bertforge.pipeline(5, DIR)``) would
otherwise fail somewhere inside its work, in difflib, pathlib or OmegaConf, with a message about
their internals, or worse, run on with it. ``@checked`` makes the function check every annotated
argument against its annotation before anything else, and refuse a wrong one with an
``ArgumentTypeError``: a ``TypeError`` (what Python callers expect), and a ``ConfigError`` (one
line on the command line), naming the function, the argument, what it takes and what it got.

What an annotation admits: ``Any``, type variables and names that cannot be resolved admit
anything; ``int`` an integer, numpy's too, but not a bool (``True`` is no length); ``float``
any real number, numpy's too, but not a bool; ``bool`` Python's or numpy's bool; ``Path``
and ``os.PathLike`` a ``str`` too (every path argument takes either); a class its instances;
``X | Y`` either; ``Literal`` its values; ``list[X]`` a list of X, ``Sequence[X]`` a list or
tuple of X (never a string, whose characters would be taken one by one); ``Mapping``/``dict`` a
mapping; ``Callable`` a callable; ``type[X]`` a class; a Protocol what has its members.

Model classes check their constructors through ``PreTrainedModel.__init_subclass__``; every
other public function and method carries ``@checked`` itself.
"""

from __future__ import annotations

import collections.abc as abc
import functools
import inspect
import numbers
import os
import sys
import types
import typing
from pathlib import PurePath
from typing import Any, Callable, TypeVar

from bertforge.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
_ANY = object()  # an annotation that admits anything
_PATHS = (PurePath, os.PathLike)


def _is_bool(value: Any) -> bool:
    """Python's bool or numpy's. numpy is looked up, not imported: a value can be one of its
    scalars only once something imported it, and importing it here would slow every command
    line's start (``bertforge --help`` imports neither numpy nor torch)."""
    np = sys.modules.get("numpy")
    return isinstance(value, bool) or (np is not None and isinstance(value, np.bool_))


def _is_numpy_number(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, (np.integer, np.floating, np.bool_))


class ArgumentTypeError(ConfigError, TypeError):
    """An argument of a public function has the wrong type."""


def checked(func: F) -> F:
    """``func`` checking the types of its annotated arguments before it runs (module notes).
    Under ``@classmethod``/``@staticmethod``, this goes below them."""
    hints: dict[str, Any] | None = None
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:  # resolved at the first call: every module is imported by then
            hints = {name: _resolve(p.annotation, func) for name, p in
                     signature.parameters.items() if p.annotation is not inspect.Parameter.empty}
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return func(*args, **kwargs)  # Python's own message names the missing argument
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            bound.arguments[name] = _checked_value(func, bound, name, kind,
                                                   hints.get(name, _ANY), value)
        return func(*bound.args, **bound.kwargs)

    return typing.cast(F, wrapper)


def _checked_value(func: Callable[..., Any], bound: inspect.BoundArguments, name: str,
                   kind: Any, hint: Any, value: Any) -> Any:
    """``value`` (each of its items for ``*args``/``**kwargs``) checked against ``hint``, with
    numpy's numbers as Python's: the function's own code (``isinstance(x, bool)``, a dict
    lookup, ``json.dumps``) then sees the plain types its annotation names."""
    if kind is inspect.Parameter.VAR_POSITIONAL:
        items = dict(enumerate(value))
    elif kind is inspect.Parameter.VAR_KEYWORD:
        items = dict(value)
    else:
        items = {None: value}
    for key, one in items.items():
        if not admits(hint, one):
            shown = name if key is None else (f"{key}" if isinstance(key, str)
                                              else f"{name}[{key}]")
            raise argument_error(_owner(func, bound), shown, hint, one)
        items[key] = _plain_number(hint, one)
    if kind is inspect.Parameter.VAR_POSITIONAL:
        return tuple(items.values())
    return items if kind is inspect.Parameter.VAR_KEYWORD else items[None]


def _plain_number(hint: Any, value: Any) -> Any:
    """``value`` as Python's number (``.item()``) where it is numpy's and ``hint`` names a type
    the plain one is; under ``Any`` it stays what the caller gave, for the function that takes
    it on to check against its own annotation and name as given."""
    if not _is_numpy_number(value) or _admits_anything(hint):
        return value
    plain = value.item()
    return plain if admits(hint, plain) else value


def check_argument(function: str, name: str, hint: Any, value: Any) -> Any:
    """``value`` (numpy's numbers as Python's, as ``@checked`` passes them), or
    ``ArgumentTypeError`` unless ``hint`` (a resolved annotation) admits it; for arguments a
    function takes through ``**options`` and checks against another annotation (a pipeline's
    options against its fields)."""
    if not admits(hint, value):
        raise argument_error(function, name, hint, value)
    return _plain_number(hint, value)


def argument_error(function: str, name: str, hint: Any, value: Any) -> ArgumentTypeError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
    return ArgumentTypeError(f"{function}(): {name} must be {describe(hint)}, got "
                             f"{type(value).__name__} {shown}")


def _owner(func: Callable[..., Any], bound: inspect.BoundArguments) -> str:
    """The name a caller knows the function by: ``BertModel.from_pretrained``, not the
    mixin class that defines it."""
    first = next(iter(bound.arguments.values()), None) if bound.arguments else None
    if func.__name__ == "__init__" and first is not None:
        return type(first).__name__  # BertModel(5): the class the caller called
    if func.__name__ == "__call__" and first is not None:
        return f"{type(first).__name__}.__call__"  # tokenizer(5): an instance, not the class
    if isinstance(first, type) and func.__name__ in dir(first):
        return f"{first.__name__}.{func.__name__}"
    return func.__qualname__


def _resolve(annotation: Any, func: Callable[..., Any]) -> Any:
    """An annotation (a string under ``from __future__ import annotations``) as an object;
    ``_ANY`` when it names something not importable at run time."""
    if not isinstance(annotation, str):
        return annotation
    namespace = {**vars(typing), **func.__globals__}
    try:
        return eval(annotation, namespace)  # noqa: S307 - the package's own annotations
    except Exception:
        return _ANY


def _admits_anything(hint: Any) -> bool:
    return hint is _ANY or hint is Any or isinstance(hint, TypeVar) or hint is object


def admits(hint: Any, value: Any) -> bool:
    """Whether the resolved annotation ``hint`` admits ``value`` (module notes)."""
    if _admits_anything(hint):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(admits(a, value) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is type:
        return isinstance(value, type)
    if origin in (list, tuple, set, frozenset, abc.Sequence, abc.Iterable, abc.Collection):
        return _admits_items(origin, args, value)
    if origin is not None:
        return _admits_class(origin, value)
    if isinstance(hint, type):
        return _admits_class(hint, value)
    return True


def _admits_items(origin: Any, args: tuple, value: Any) -> bool:
    """A container annotation: the right kind of container, never a string (whose characters
    would be taken one by one), with items of the annotated type where it says one."""
    if isinstance(value, (str, bytes, bytearray)):
        return False
    if origin in (abc.Iterable, abc.Collection):  # not iterated here: it may be a generator
        return isinstance(value, origin)
    kinds = {list: (list,), tuple: (tuple,), set: (set, frozenset), frozenset: (frozenset,),
             abc.Sequence: (list, tuple)}[origin]
    if not isinstance(value, kinds):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:
        return len(value) == len(args) and all(admits(a, v) for a, v in zip(args, value))
    return not args or all(admits(args[0], one) for one in value)


def _admits_class(cls: type, value: Any) -> bool:
    # numpy's scalars (a length read from an array) count as the numbers they are; its bool_
    # is no number, as bool is not, although Python's bool is an int
    if cls is bool:
        return _is_bool(value)
    if cls is int:
        return isinstance(value, numbers.Integral) and not _is_bool(value)
    if cls is float:
        return isinstance(value, numbers.Real) and not _is_bool(value)
    if cls in _PATHS or (isinstance(cls, type) and issubclass(cls, PurePath)):
        return isinstance(value, (str, os.PathLike))
    if cls is abc.Callable:
        return callable(value)
    if getattr(cls, "_is_protocol", False):  # by its members, as a static checker would
        return all(hasattr(value, name) for name in _protocol_members(cls))
    try:
        return isinstance(value, cls)
    except TypeError:  # a special form isinstance cannot test
        return True


def _protocol_members(cls: type) -> set[str]:
    """The public attributes and methods a Protocol class declares (its bases' too)."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base is object or not getattr(base, "_is_protocol", False) or base.__name__ in (
                "Protocol", "Generic"):
            continue
        names |= {n for n in (*vars(base), *getattr(base, "__annotations__", {}))
                  if not n.startswith("_")}
    return names


def describe(hint: Any) -> str:
    """What ``hint`` admits, in words: "a string or None", "a path (str or os.PathLike)"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        words = list(dict.fromkeys(w for a in args for w in (
            ("True", "False") if a is bool else (describe(a),))))
        if _PATH_WORDS in words and "a string" in words:
            words.remove("a string")
        return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is type:
        return "a class"
    if origin in (list, tuple, set, frozenset, abc.Sequence, abc.Iterable, abc.Collection):
        kind = {tuple: "a tuple", set: "a set", frozenset: "a set"}.get(origin, "a list")
        return f"{kind} of {_plural(args[0])}" if args and args[0] is not Ellipsis else kind
    if origin is not None:
        return describe(origin)
    if hint is None or hint is type(None):
        return "None"
    return _CLASS_WORDS.get(hint) or _class_words(hint)


_PATH_WORDS = "a path (str or os.PathLike)"
_CLASS_WORDS = {str: "a string", int: "a whole number", float: "a number",
                bool: "True or False", abc.Mapping: "a dict", dict: "a dict",
                abc.Callable: "a callable"}


def _plural(hint: Any) -> str:
    """The items of a container annotation, in words: "strings", "whole numbers"."""
    plain = {str: "strings", int: "whole numbers", float: "numbers", bool: "booleans"}
    if hint in plain:
        return plain[hint]
    if hint is _ANY or hint is Any or isinstance(hint, TypeVar):
        return "anything"
    if typing.get_origin(hint) is not None:
        return f"items that are each {describe(hint)}"
    if hint in _PATHS or (isinstance(hint, type) and issubclass(hint, PurePath)):
        return "paths (str or os.PathLike)"
    return f"{getattr(hint, '__name__', str(hint))} objects"


def _class_words(cls: Any) -> str:
    if cls in _PATHS or (isinstance(cls, type) and issubclass(cls, PurePath)):
        return _PATH_WORDS
    name = getattr(cls, "__name__", str(cls))
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


__all__ = ["ArgumentTypeError", "admits", "check_argument", "checked", "describe"]
