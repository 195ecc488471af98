"""What the server says once at start-up about settings that will refuse requests.

A summarization model's generation_config.json gives every request that does not set a field
its value: a model saved with ``num_beams=10`` under a server started with ``--max-num-beams
8`` answers every such request 413 (:func:`bertforge.serve.limits.check_generation`). The
operator learns it here, one line per setting, instead of from the clients.
"""

from __future__ import annotations

from typing import Any

from bertforge.errors import ConfigError
from bertforge.serve.settings import ServeSettings, option


def generation_warnings(pipeline: Any, settings: ServeSettings) -> list[str]:
    """One line per saved generation setting of ``pipeline``'s model over a limit of
    ``settings``: the key, the saved value (and the value requests get, where fitting the
    model's positions changed it), the limit, and what a request without the field gets.
    Empty for pipelines that do not generate."""
    if not getattr(pipeline, "decodes", False):
        return []
    from bertforge.models.generation.texts import generation_settings

    model = pipeline.model
    saved = getattr(model, "generation_config", None)
    try:
        used = generation_settings(model, {}, source=str(pipeline.model_dir))
    except ConfigError:  # every request must then give a length: nothing applies by default
        return []
    length_key = "max_new_tokens" if used.max_new_tokens is not None else "max_length"
    length = getattr(used, length_key)
    lines = []
    for key, value, limit in (("num_beams", used.num_beams, "max_num_beams"),
                              (length_key, length, "max_generation_length")):
        allowed = getattr(settings, limit)
        if value is not None and value > allowed:
            lines.append(f"the model's generation_config.json sets {_saved(saved, key, value)}, "
                         f"over this server's {option(limit)} {allowed}: requests without "
                         f"{key} will be refused (413); give {option(limit)} {value} to serve "
                         "them")
    work = used.num_beams * (length or 0)
    if work > settings.max_generation_tokens:
        lines.append(f"the model's generation_config.json asks for num_beams x {length_key} = "
                     f"{used.num_beams} x {length} = {work} decoded tokens per item, over this "
                     f"server's --max-generation-tokens {settings.max_generation_tokens}: "
                     f"requests without num_beams and {length_key} will be refused (413); give "
                     f"--max-generation-tokens {work} or more (a request's items add up) to "
                     "serve them")
    return lines


def _saved(saved: Any, key: str, used: Any) -> str:
    """``key=value`` as saved, with the value requests get when it differs."""
    value = getattr(saved, key, used) if saved is not None else used
    return f"{key}={value}" if value == used else f"{key}={value} (used as {used})"


__all__ = ["generation_warnings"]
