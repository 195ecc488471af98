"""Text generation with a BART model: the settings in force, batched decoding, ``bertforge generate``.

Generation settings come from the model's ``generation_config.json`` (saved by ``bertforge
finetune``) with the caller's overrides on top. A model without one and a call
without a length limit is an error rather than transformers' silent limit of 20 tokens, the
usual reason for truncated summaries.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch

from bertforge.core.limits import setting_changed
from bertforge.data.collate.seq2seq import pad_rows
from bertforge.errors import ConfigError, DataError
from bertforge.models.generation import GenerationConfig, generate
from bertforge.models.generation.config import bad_setting, named_as


def generation_settings(model: Any, overrides: dict[str, Any], *, source: str,
                        default_max_length: int | None = None) -> GenerationConfig:
    """The settings ``model`` generates with (see :func:`settings_for`)."""
    return settings_for(model.config, getattr(model, "generation_config", None), overrides,
                        source=source, default_max_length=default_max_length)


def settings_for(config: Any, saved: GenerationConfig | None, overrides: dict[str, Any], *,
                 source: str, default_max_length: int | None = None) -> GenerationConfig:
    """The settings a model of ``config`` generates with: ``saved`` (its generation_config.json),
    else settings built from ``config`` with ``default_max_length``; then ``overrides``; then
    fitted to the model's positions (:func:`fit_positions`). ConfigError when no length limit
    is known or a given one does not fit. Needs no weights, so commands check their settings
    before any work."""
    base = saved
    if base is None:
        limit = overrides.get("max_length", default_max_length)
        if limit is None and overrides.get("max_new_tokens") is None:
            raise ConfigError(
                f"{source} has no generation_config.json and no maximum length was given: pass "
                "one (e.g. --max-length 142); bertforge does not fall back to a silent limit")
        base = GenerationConfig.from_model_config(config, max_length=limit)
    settings = base.replace(**overrides) if overrides else base
    return fit_positions(settings, config.max_position_embeddings, overrides, source)


def fit_positions(settings: GenerationConfig, positions: int, given: dict[str, Any],
                  source: str) -> GenerationConfig:
    """``settings`` whose outputs fit the decoder's ``positions``: a length limit that does not
    fit is an error when it was ``given`` (a setting of this call), and is lowered to the
    positions when it came from the model's file or a default (BART's positions are a hard
    limit: a longer output cannot be decoded)."""
    longest = settings.length_limits()[1]
    if longest <= positions:
        return settings
    name = "max_new_tokens" if settings.max_new_tokens is not None else "max_length"
    if name in given:
        raise bad_setting(name, getattr(settings, name),
                          f"outputs of {longest} tokens (decoder start included) exceed the "
                          f"{positions} positions of {source}; at most "
                          f"{positions - (name == 'max_new_tokens')}")
    setting_changed(f"{source}: generation max_length", longest, positions,
                    f"outputs of {longest} tokens would exceed the model's {positions} positions")
    return settings.replace(max_length=positions, max_new_tokens=None)


@torch.no_grad()
def generate_texts(model: Any, tokenizer: Any, sources: Sequence[np.ndarray],
                   config: GenerationConfig, *, batch_size: int, device: torch.device,
                   autocast: Callable[[], ContextManager] = nullcontext,
                   progress: bool = False) -> list[str]:
    """Decoded outputs (special tokens removed) of encoded ``sources``, in their order.

    Sources are batched by length (longest first, so memory peaks at once and padding stays
    small); the model is put in eval mode and restored afterwards. Decoding runs eagerly even
    when the model's layers were compiled for training: every decoding step has another length
    (a new shape for each cached key/value), which would recompile the training graphs until
    torch gives up on them.
    """
    from bertforge.core.progress import progress_bar

    was_training = model.training
    model.eval()
    order = np.argsort([-len(s) for s in sources], kind="stable")
    outputs: list[str] = [""] * len(sources)
    bar = progress_bar(total=len(sources), desc="generate", unit="text", disable=not progress)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        pad_id = (config.pad_token_id if config.pad_token_id is not None
                  else model.config.pad_token_id)
        ids, mask = map(torch.from_numpy, pad_rows([sources[i] for i in chunk], pad_id))
        with torch.compiler.set_stance("force_eager"), autocast():
            sequences = generate(model, ids.to(device), mask.to(device), config)
        texts = tokenizer.decode_batch(sequences.tolist(), skip_special_tokens=True)
        for i, text in zip(chunk, texts):
            outputs[int(i)] = text.strip()
        bar.update(len(chunk))
    bar.close()
    model.train(was_training)
    return outputs


def generate_file(model_dir: Path, input_path: Path, output: Path, *,
                  overrides: dict[str, Any], batch_size: int = 8, device: str = "auto",
                  text_field: str | None = None, max_source_length: int | None = None) -> Path:
    """``bertforge generate``: summaries (or any outputs) of the texts in ``input_path`` written
    atomically as JSON Lines ``{"id", "summary"}`` to ``output``.

    ``input_path``: JSON Lines / CSV / TSV with a text column (detected, or ``text_field``), a
    CNN/DailyMail story directory, or a plain .txt file with one text per line.
    """
    from bertforge.core.io import write_text_atomic
    from bertforge.models.loading import load_model
    from bertforge.tokenization import load_tokenizer
    from bertforge.train.precision import build_precision

    from bertforge.models.loading import model_directory

    model_dir = model_directory(model_dir)  # a Hub name: its snapshot
    # Everything that can be wrong with the settings fails here, before any input is read.
    source, config, limit = _check_generate(model_dir, output, overrides, max_source_length)
    if not input_path.exists():
        raise ConfigError(f"--input {input_path} does not exist")
    tokenizer = load_tokenizer(model_dir)
    ids, texts = _read_texts(input_path, text_field)
    target = torch.device(device if device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_model(source, "seq2seq-lm", device=target)  # verified: every weight, finite
    sources = [np.asarray(s, dtype=np.int64) for s in tokenizer.encode_truncated(texts, limit)]
    precision = build_precision("auto", target)
    summaries = generate_texts(model, tokenizer, sources, config, batch_size=batch_size,
                               device=target, autocast=precision.autocast, progress=True)
    rows = [json.dumps({"id": i, "summary": s}, ensure_ascii=False) for i, s in zip(ids, summaries)]
    write_text_atomic(output, "".join(r + "\n" for r in rows))
    return output


def _check_generate(model_dir: Path, output: Path, overrides: dict[str, Any],
                    max_source_length: int | None) -> tuple[Any, GenerationConfig, int]:
    """The model's source, the generation settings and the source length of ``bertforge
    generate``, all checked against the model's config (no weights read), and the output path
    proven writable."""
    from bertforge.core.io import check_output_file
    from bertforge.core.limits import length_within
    from bertforge.core.schema import flag
    from bertforge.models.generation import GENERATION_CONFIG_NAME
    from bertforge.models.loading import open_model

    source = open_model(model_dir, "--model")
    if not source.family.seq2seq:
        raise ConfigError(f"--model {model_dir} is a {source.family.name} model; generate needs "
                          "an encoder-decoder (BART) model")
    saved = (GenerationConfig.load(model_dir)
             if (model_dir / GENERATION_CONFIG_NAME).is_file() else None)
    try:
        settings = settings_for(source.config, saved, overrides, source=str(model_dir))
    except ConfigError as exc:
        raise named_as(exc, flag) from None
    positions = source.config.max_position_embeddings
    limit = length_within(max_source_length, "--max-source-length", positions, positions,
                          ConfigError)
    check_output_file(output, "--output")
    return source, settings, limit


def _read_texts(path: Path, text_field: str | None) -> tuple[list[str], list[str]]:
    """Ids and texts of ``bertforge generate``'s input: lines of a .txt file (ids 0, 1, ...),
    else the summarization reader's articles."""
    from bertforge.data.finetuning.summarization import read_summarization

    if path.suffix == ".txt":
        try:
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[:exc.start].count(b"\n") + 1
            raise DataError(f"--input {path}:{line} is not UTF-8 text ({exc.reason}); convert "
                            "it to UTF-8") from None
        if not any(t.strip() for t in lines):
            raise DataError(f"--input {path} has no text")
        return [str(i) for i in range(len(lines))], lines
    examples = read_summarization(path, article_field=text_field, require_summaries=False)
    return [e.id for e in examples], [e.article for e in examples]


__all__ = ["generate_file", "generate_texts", "generation_settings"]
