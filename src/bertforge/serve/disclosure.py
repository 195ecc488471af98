"""What the server tells clients about the machine it runs on: the model directory's name, not
its path, unless the operator asks (``--expose-paths``).

``/health`` and ``/info`` are open without the API key (load balancers and TEI clients probe
them), and an error message can quote a path from deep inside the loading code (a generation
setting that does not fit "the 64 positions of /home/me/runs/bart"). A path tells a stranger
user names, directory layouts and mount points; the name alone says which model answers. So the
descriptions those routes show carry the name (:func:`model_name`, the one way a model is
named to clients), and every body those routes and ``/metrics`` answer, and every JSON error,
passes through the :class:`PathFilter` before it leaves: text from other processes and deep
layers (a replica's load error quoting config.json) is filtered where it leaves, not where it is
written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping


def model_name(model: Any) -> str:
    """What a client is told of a model given by path (or Hub name): its last part (the
    directory's own name for ``.`` and the like); ``""`` stays empty."""
    text = str(model)
    if not text:
        return text
    path = Path(text)
    return path.name or path.resolve().name or text


class PathFilter:
    """Replaces the model directories' paths (as given, absolute and with links resolved) by
    their names, and the home directory by ``~``, in text meant for clients; with ``expose``
    it changes nothing."""

    def __init__(self, model_dirs: Iterable[str], expose: bool = False) -> None:
        self.expose = expose
        forms: dict[str, str] = {}
        for given in model_dirs:
            if not given:
                continue
            path = Path(given)
            for form in (given, str(path), os.path.abspath(path), str(path.resolve())):
                if form not in (".", os.sep):
                    forms[form.rstrip(os.sep) or form] = model_name(given)
        home = str(Path.home())
        if home not in ("", os.sep):  # what is left of a path outside the model, e.g. a Hub
            forms.setdefault(home, "~")  # cache's blobs/, says no user name either
        # Longest first: a resolved path may contain the given one, or the reverse.
        self._forms = sorted(forms.items(), key=lambda kv: -len(kv[0]))

    def hide(self, text: str) -> str:
        if self.expose:
            return text
        for form, name in self._forms:
            # A whole path only: "/root" in "/rootfs" is another directory.
            text = re.sub(re.escape(form) + r"(?![\w-])", lambda _: name, text)
        return text

    def public(self, value: Any) -> Any:
        """A JSON-able ``value`` (a route's whole body) with every string value in it passed
        through :meth:`hide` (keys are the server's own names: routes, fields)."""
        if self.expose:
            return value
        if isinstance(value, str):
            return self.hide(value)
        if isinstance(value, Mapping):
            return {k: self.public(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.public(v) for v in value]
        return value

    def describe(self, described: Mapping[str, Any]) -> dict[str, Any]:
        """A pipeline's ``describe()`` for clients: its ``model`` by name unless exposed."""
        public = dict(described)
        if not self.expose and "model" in public:
            public["model"] = model_name(public["model"])
        return self.public(public)


__all__ = ["PathFilter", "model_name"]
