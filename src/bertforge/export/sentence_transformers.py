"""Embedding models in the sentence-transformers layout: ``bertforge export sentence-transformers``.

sentence-transformers loads a directory as a chain of modules listed in ``modules.json``; for a
BERT text embedder that is the transformer (config.json, model.safetensors and the tokenizer at
the directory's root, with ``sentence_bert_config.json`` saying its max_seq_length), a pooling
module (``1_Pooling/config.json``: mean over the real tokens, the first token's vector or the
last real token's) and, when vectors are scaled to unit length, a normalize module
(``2_Normalize``); ``config_sentence_transformers.json`` holds the named prompts (text put
before a query or a document) and, under bertforge's own key, the Matryoshka sizes. So
``SentenceTransformer(DIR)`` gives the vectors bertforge's feature-extraction pipeline and
``/v1/embeddings`` give for the same text.

Both directions live here: :func:`read_pooling` tells the feature-extraction pipeline which
pooling and normalization a directory was saved with (its defaults), :func:`read_prompts` and
:func:`read_matryoshka_dims` its prompts and sizes, :func:`saved_max_seq_length`
the input limit every reader of the directory keeps to (the pipelines, the server, both exports),
and :func:`write_sentence_transformers_files` / :func:`export_sentence_transformers` write them.
The files use the keys every sentence-transformers release reads (``pooling_mode_mean_tokens``
and the other booleans, ``word_embedding_dimension``); newer releases convert them on load.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.core.io import (fsync_dir, output_lock, temp_name, write_bytes_atomic,
                               write_json_atomic)
from bertforge.core.jsonfile import read_json
from bertforge.core.paths import named_file
from bertforge.errors import ConfigError
from bertforge.ops.pooling import POOLINGS  # what bertforge computes and writes: mean, cls, last

MODULES_FILE = "modules.json"
SENTENCE_BERT_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
MATRYOSHKA_KEY = "matryoshka_dims"
"""bertforge's key in ``config_sentence_transformers.json``: the sizes a Matryoshka model was
trained to be cut to. sentence-transformers reads only the keys it knows from that file
(prompts, default_prompt_name, similarity_fn_name, truncate_dim, ...) and ignores this one."""
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
_TYPES = {"transformer": "sentence_transformers.models.Transformer",
          "pooling": "sentence_transformers.models.Pooling",
          "normalize": "sentence_transformers.models.Normalize"}
# sentence-transformers' boolean pooling keys (every release reads them) -> our mode names.
_LEGACY_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean",
                "pooling_mode_lasttoken": "last"}
# sentence-transformers' pooling_mode names that bertforge calls otherwise.
_MODE_NAMES = {"lasttoken": "last"}


@dataclass(frozen=True)
class SavedPooling:
    """What a sentence-transformers directory says about its vectors."""

    pooling: str      # "mean", "cls", or a mode bertforge does not compute ("max", ...)
    normalize: bool   # modules.json lists a Normalize module
    source: str       # the pooling config file, for messages


def _read_json(path: Path) -> Any:
    return read_json(path, error=ConfigError, hint="write it again with `bertforge export "
                     "sentence-transformers`")


def _pooling_mode(config: Any, path: Path) -> str:
    """The pooling mode of a ``1_Pooling/config.json``, from the new ``pooling_mode`` key or
    the booleans; several modes (concatenated vectors) are joined with "+"."""
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    mode = config.get("pooling_mode")
    modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else [
        name for key, name in _LEGACY_KEYS.items() if config.get(key) is True]
    modes = [_MODE_NAMES.get(m, m) if isinstance(m, str) else m for m in modes]
    return "+".join(map(str, modes)) or "mean"  # none set: sentence-transformers' default


def read_pooling(directory: str | os.PathLike[str]) -> SavedPooling | None:
    """The pooling and normalization saved with a sentence-transformers model directory, or
    None when it has no ``modules.json`` (or lists no pooling module)."""
    directory = Path(directory)
    modules_path = directory / MODULES_FILE
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConfigError(f"{modules_path} must be a JSON list of module objects")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    if "Pooling" not in kinds:
        return None
    folder = kinds["Pooling"].get("path", POOLING_DIR)
    # The module's folder is a name from the file: it must stay inside the model directory.
    pooling_path = named_file(directory, f"{folder}/config.json" if isinstance(folder, str)
                              and folder.strip("/") else folder,
                              named_by=f"{modules_path} (the pooling module's path)",
                              fix="export the model again")
    if not pooling_path.is_file():
        raise ConfigError(f"{modules_path} lists a pooling module but {pooling_path} is "
                          "missing; export the model again")
    mode = _pooling_mode(_read_json(pooling_path), pooling_path)
    return SavedPooling(pooling=mode, normalize="Normalize" in kinds, source=str(pooling_path))


def saved_max_seq_length(directory: str | os.PathLike[str]) -> int | None:
    """The ``max_seq_length`` of a sentence-transformers directory's
    ``sentence_bert_config.json``: the tokens its transformer was trained on, where
    sentence-transformers cuts every input (all-MiniLM-L6-v2: 256 of its 512 positions). None
    without the file or the key (sentence-transformers then takes the tokenizer's limit);
    ``ConfigError`` for a value that is not a whole number of tokens >= 1."""
    path = Path(directory) / SENTENCE_BERT_CONFIG
    if not path.is_file():
        return None
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object with max_seq_length; write it again "
                          "with `bertforge export sentence-transformers`")
    value = config.get("max_seq_length")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{path}: max_seq_length must be a whole number of tokens >= 1, got "
                          f"{value!r}; set it to the length the model was trained on")
    return value


def _st_config(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], Path] | None:
    """``config_sentence_transformers.json`` of ``directory`` and its path; None without it."""
    path = Path(directory) / ST_CONFIG
    if not path.is_file():
        return None
    config = _read_json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object (prompts, similarity_fn_name, ...); "
                          "write it again with `bertforge export sentence-transformers`")
    return config, path


def read_prompts(directory: str | os.PathLike[str]) -> dict[str, str]:
    """The named prompts saved with a model directory (``config_sentence_transformers.json``'s
    "prompts", e.g. ``{"query": "query: ", "document": "passage: "}``): text put before an
    input of that kind, as the model was trained. {} without the file or the key."""
    found = _st_config(directory)
    prompts = found[0].get("prompts") if found else None
    if prompts is None:
        return {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ConfigError(f"{found[1]}: prompts must map names to texts (e.g. {{\"query\": "
                          f"\"query: \"}}), got {json.dumps(prompts)[:80]}; fix the file")
    return dict(prompts)


def read_default_prompt_name(directory: str | os.PathLike[str]) -> str | None:
    """The prompt sentence-transformers puts before inputs that name none
    (``default_prompt_name``; None: no prompt); ``ConfigError`` when it names no saved prompt."""
    found = _st_config(directory)
    name = found[0].get("default_prompt_name") if found else None
    if name is not None and name not in read_prompts(directory):
        raise ConfigError(f"{found[1]}: default_prompt_name {json.dumps(name)[:60]} is not one "
                          f"of its prompts ({', '.join(read_prompts(directory)) or 'none'}); "
                          "set it to a saved prompt's name or null")
    return name


def read_matryoshka_dims(directory: str | os.PathLike[str]) -> list[int] | None:
    """The sizes a Matryoshka embedding model was trained to be cut to (bertforge's
    ``matryoshka_dims`` in ``config_sentence_transformers.json``, e.g. [256, 128, 64]); None for
    a model trained at its full size only (no file, no key, or null)."""
    found = _st_config(directory)
    dims = found[0].get(MATRYOSHKA_KEY) if found else None
    if dims is None:
        return None
    if (not isinstance(dims, list) or not dims or len(set(map(str, dims))) != len(dims)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)):
        raise ConfigError(f"{found[1]}: {MATRYOSHKA_KEY} must list distinct sizes >= 1 (e.g. "
                          f"[256, 128, 64]) or be null, got {json.dumps(dims)[:80]}; fix the file")
    return list(dims)


def copy_sentence_transformers_files(source: str | os.PathLike[str],
                                     target: str | os.PathLike[str]) -> list[str]:
    """Copy what a sentence-transformers directory says about its vectors (``modules.json``,
    ``sentence_bert_config.json``, ``config_sentence_transformers.json`` with its prompts and
    Matryoshka sizes, the pooling module's config, the normalize module's folder) from
    ``source`` to ``target``, so a copy of its model in another format (an ONNX export) is read
    with the same pooling, normalization, prompts, sizes and input limit. Returns the paths
    written, relative to ``target``; none for a directory without them."""
    source, target = Path(source), Path(target)
    saved = read_pooling(source)  # checks modules.json and the pooling config
    # Refuse an unusable limit, prompt or size before anything is copied.
    saved_max_seq_length(source)
    read_default_prompt_name(source)
    read_matryoshka_dims(source)
    names = [name for name in (MODULES_FILE, SENTENCE_BERT_CONFIG, ST_CONFIG)
             if (source / name).is_file()]
    if saved is not None:
        names.append(str(Path(saved.source).relative_to(source)))
    written = []
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(target / name, (source / name).read_bytes())
        written.append(name)
    if saved is not None and saved.normalize:
        (target / NORMALIZE_DIR).mkdir(exist_ok=True)
        written.append(f"{NORMALIZE_DIR}/")
    return written


def write_sentence_transformers_files(directory: str | os.PathLike[str], *, pooling: str,
                                      normalize: bool, dimensions: int, max_seq_length: int,
                                      prompts: dict[str, str] | None = None,
                                      matryoshka_dims: list[int] | None = None,
                                      default_prompt_name: str | None = None) -> list[str]:
    """Add the sentence-transformers files to a model directory that already holds the
    transformer (config.json, weights, tokenizer): ``modules.json``,
    ``sentence_bert_config.json``, ``config_sentence_transformers.json`` (the named
    ``prompts``, ``default_prompt_name``, cosine similarity and bertforge's
    ``matryoshka_dims``), ``1_Pooling/config.json`` and, with ``normalize``, ``2_Normalize/``.
    The arguments are the whole truth: a prompt or size saved before and not given is gone.
    Returns the paths written, relative to ``directory``."""
    if pooling not in POOLINGS:
        raise ConfigError(f"--pooling must be one of {', '.join(POOLINGS)} (got {pooling!r})")
    st_config = _model_config(prompts, matryoshka_dims, default_prompt_name, dimensions)
    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _TYPES["transformer"]},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": _TYPES["pooling"]}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR,
                        "type": _TYPES["normalize"]})
        (directory / NORMALIZE_DIR).mkdir(exist_ok=True)
    pooling_config = {"word_embedding_dimension": dimensions,
                      **{key: name == pooling for key, name in _LEGACY_KEYS.items()},
                      "include_prompt": True}
    (directory / POOLING_DIR).mkdir(exist_ok=True)
    files = {MODULES_FILE: modules,
             SENTENCE_BERT_CONFIG: {"max_seq_length": max_seq_length,
                                           "do_lower_case": False},
             ST_CONFIG: st_config,
             f"{POOLING_DIR}/config.json": pooling_config}
    for name, payload in files.items():
        write_json_atomic(directory / name, payload, sort_keys=False)
    return [*files, *([f"{NORMALIZE_DIR}/"] if normalize else [])]


def _model_config(prompts: dict[str, str] | None, dims: list[int] | None,
                  default_prompt_name: str | None, dimensions: int) -> dict[str, Any]:
    """``config_sentence_transformers.json``'s content; ``ConfigError`` for prompts that are
    not texts and sizes outside 1..``dimensions``."""
    prompts = dict(prompts or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConfigError(f"prompts must map names to texts, got {prompts!r}")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise ConfigError(f"default_prompt_name {default_prompt_name!r} is not one of the "
                          f"prompts ({', '.join(prompts) or 'none'})")
    if dims is not None:
        dims = list(dims)
        if not dims or len(set(dims)) != len(dims) or not all(
                isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= dimensions
                for d in dims):
            raise ConfigError(f"matryoshka_dims must list distinct sizes from 1 to the hidden "
                              f"size {dimensions}, got {dims}")
    # model_type: the family sentence-transformers 5+ loads it as; older releases ignore it.
    return {"model_type": "SentenceTransformer", "prompts": prompts,
            "default_prompt_name": default_prompt_name, "similarity_fn_name": "cosine",
            MATRYOSHKA_KEY: dims}


def export_sentence_transformers(model_dir: str | os.PathLike[str],
                                 output_dir: str | os.PathLike[str], *,
                                 pooling: str | None = None,
                                 normalize: bool | None = None) -> list[str]:
    """Write the encoder of a BERT or ModernBERT model directory (any head: the head is left
    out) to a new ``output_dir`` that ``sentence_transformers.SentenceTransformer(output_dir)``
    loads as it is. ``pooling`` (mean, cls or last) and ``normalize`` default to what
    ``model_dir`` was saved with (its own sentence-transformers files), else mean and no
    normalization; its saved prompts and Matryoshka sizes are kept.

    The output is built under a hidden name and renamed when complete, so a failed export
    leaves nothing; an existing non-empty ``output_dir`` is refused. Returns the files written.
    """
    from bertforge.models.loading import model_directory

    source_dir = model_directory(model_dir)
    saved = read_pooling(source_dir)
    pooling = pooling or (saved.pooling if saved else "mean")
    normalize = normalize if normalize is not None else bool(saved and saved.normalize)
    if pooling not in POOLINGS:
        raise ConfigError(f"--pooling must be one of {', '.join(POOLINGS)} (got {pooling!r})")
    output = Path(output_dir)
    with output_lock(output, "--output", "bertforge export sentence-transformers", beside=True):
        if output.exists() and (not output.is_dir() or any(output.iterdir())):
            raise ConfigError(f"--output {output} already exists and is not empty; choose a new "
                              "directory or remove it")
        output.parent.mkdir(parents=True, exist_ok=True)
        work = temp_name(output)
        work.mkdir()
        try:
            written = _write_encoder(source_dir, work, pooling, normalize)
            os.replace(work, output)
            fsync_dir(output.parent)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return written


def _write_encoder(model_dir: Path, work: Path, pooling: str, normalize: bool) -> list[str]:
    """The encoder of ``model_dir`` as a bare encoder (``BertModel``, ``ModernBertModel``) in
    ``work`` plus the sentence-transformers files; ``ConfigError`` for what transformers cannot
    run."""
    from bertforge.models.loading import load_model, open_model
    from bertforge.tokenization import EncoderTokenizer, load_tokenizer

    source = open_model(model_dir, "--model")
    config = source.config
    if source.family.seq2seq:
        raise ConfigError(f"--model {model_dir} is a {config.model_type} encoder-decoder; "
                          "sentence-transformers would run its decoder: export BERT or "
                          "ModernBERT models")
    if getattr(config, "pre_layernorm", False):
        raise ConfigError(f"--model {model_dir} is a pre-LayerNorm BERT, which transformers "
                          "cannot load: export post-LN BERT models")
    tokenizer = load_tokenizer(model_dir)
    if not isinstance(tokenizer, EncoderTokenizer):
        raise ConfigError(f"--model {model_dir} has a {type(tokenizer).__name__}, not an "
                          "encoder's tokenizer (WordPiece, or ModernBERT's BPE)")
    # A bare encoder: no head weights for sentence-transformers to report as unexpected, and no
    # fine-tuning task left in config.json (bertforge then reads it as a feature extractor).
    bare = source.replace(finetuning_task=None)
    encoder = load_model(bare, "base")
    encoder.save_pretrained(work, tokenizer=tokenizer)
    # The length the source was made for, when it says (a sentence-transformers directory).
    saved = saved_max_seq_length(model_dir)
    length = min(tokenizer.model_max_length, config.max_position_embeddings,
                 saved if saved is not None else tokenizer.model_max_length)
    extra = write_sentence_transformers_files(
        work, pooling=pooling, normalize=normalize, dimensions=config.hidden_size,
        max_seq_length=length, prompts=read_prompts(model_dir),
        matryoshka_dims=read_matryoshka_dims(model_dir),
        default_prompt_name=read_default_prompt_name(model_dir))
    return sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()) + [
        e for e in extra if e.endswith("/")]


__all__ = ["MATRYOSHKA_KEY", "POOLINGS", "SENTENCE_BERT_CONFIG", "ST_CONFIG", "SavedPooling",
           "copy_sentence_transformers_files", "export_sentence_transformers",
           "read_default_prompt_name", "read_matryoshka_dims", "read_pooling", "read_prompts",
           "saved_max_seq_length", "write_sentence_transformers_files"]
