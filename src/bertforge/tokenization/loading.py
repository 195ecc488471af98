"""``load_tokenizer``: the tokenizer a path holds, of one of the kinds the model families' records
name (``FamilySpec.tokenizers``): "wordpiece" (BERT), "bpe" (byte-level BPE with BART's
specials) or "modernbert" (byte-level BPE with BERT's specials).

The files tell the kind: a vocab.txt is WordPiece, a vocab.json + merges.txt BART's BPE, a
tokenizer.json says its model type, and a byte-level BPE one is ModernBERT's when its added
tokens are BERT's [CLS] [SEP] [MASK], else BART's. Where a model's config.json sits beside the
files, its family's record says which kinds the model reads, and a tokenizer of another kind is
refused with one line instead of feeding the model ids it was not trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertforge.core.arguments import checked
from bertforge.core.paths import check_path_text
from bertforge.errors import ConfigError, DataError
from bertforge.tokenization.base import read_json_object
from bertforge.tokenization.bpe import BpeTokenizer, read_bpe_directory
from bertforge.tokenization.modern import ModernBpeTokenizer, is_modern_tokenizer_json
from bertforge.tokenization.wordpiece import BertTokenizer, _directory_tokens

KINDS = {"wordpiece": BertTokenizer, "bpe": BpeTokenizer, "modernbert": ModernBpeTokenizer}
"""Tokenizer kind (as ``FamilySpec.tokenizers`` names it) -> its class."""
_LABELS = {"wordpiece": "WordPiece (BERT's)", "bpe": "byte-level BPE (BART's)",
           "modernbert": "byte-level BPE with BERT's special tokens (ModernBERT's)"}


def read_vocab_tokens(directory: str | Path) -> list[str] | None:
    """Tokens (in id order) of the tokenizer saved in a model directory, WordPiece or byte-level
    BPE (BART's or ModernBERT's); None if it has none."""
    directory = Path(directory)
    kind = _directory_kind(directory)
    if kind is None:
        return None
    if kind == "wordpiece":
        return _directory_tokens(directory)[0]
    if kind == "modernbert":
        return list(ModernBpeTokenizer.from_pretrained(directory).vocab)
    return read_bpe_directory(directory)[0]


@checked
def load_tokenizer(path: str | Path, family: Any = None
                   ) -> BertTokenizer | BpeTokenizer | ModernBpeTokenizer:
    """The tokenizer ``path`` holds (see the module docstring): a vocab.txt is WordPiece
    (``BertTokenizer``); a tokenizer.json is WordPiece or byte-level BPE by its model type, the
    BPE being ModernBERT's (``ModernBpeTokenizer``) or BART's (``BpeTokenizer``) as the
    family of the model beside it reads, else by its special tokens; a directory is read through
    its tokenizer.json, else its vocab.txt, else its vocab.json + merges.txt. A Hugging Face Hub
    name that is no local path (``"google-bert/bert-base-uncased"``) is read from its cached
    snapshot, else downloaded (``bertforge.models.hub_names``; ``ConfigError`` when offline
    without it). ``DataError`` when the path holds none of these, or a kind the model beside
    it does not read. ``family``: the ``FamilySpec`` of that model when the caller has opened it
    already (config.json is then not read again)."""
    check_path_text(path, "tokenizer path")
    path = _hub_directory(path)
    if path.is_dir():
        kind = _directory_kind(path, family)
        if kind is None:
            raise DataError(f"{path} holds no tokenizer: expected tokenizer.json, vocab.txt (BERT) "
                            "or vocab.json + merges.txt (BART)")
        return KINDS[kind].from_pretrained(path)
    if not path.exists():
        raise DataError(f"tokenizer {path} does not exist; give a vocab.txt, a tokenizer.json or "
                        "a model directory")
    if path.name in ("vocab.json", "merges.txt"):
        raise DataError(f"{path} is one half of a BPE tokenizer; give the directory that holds "
                        "both vocab.json and merges.txt")
    kind = _json_kind(path) if path.suffix == ".json" else "wordpiece"
    return KINDS[_readable(kind, path.parent, family)].from_file(path)


def _hub_directory(path: str | Path) -> Path:
    """``path``, or the snapshot directory of the Hub name it spells when no such path exists."""
    path = Path(path)
    if path.exists():
        return path
    from bertforge.models.hub_names import hub_snapshot, parse_hub_name  # torch-free callers

    name = parse_hub_name(str(path))
    return path if name is None else hub_snapshot(name, f"tokenizer {path}", weights=False)


def _directory_kind(directory: Path, family: Any = None) -> str | None:
    """The kind of tokenizer a directory holds (its tokenizer.json, else its vocab.txt, else its
    vocab.json + merges.txt), checked against the model beside it (:func:`_readable`); None
    when it holds none."""
    if (directory / "tokenizer.json").exists():
        kind = _json_kind(directory / "tokenizer.json")
    elif (directory / "vocab.txt").exists():
        kind = "wordpiece"
    elif (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
        kind = "bpe"
    else:
        return None
    return _readable(kind, directory, family)


def _json_kind(path: Path) -> str:
    """The kind of a tokenizer.json; ``DataError`` for a model type bertforge does not load."""
    data = read_json_object(path)
    model = data.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind == "WordPiece":
        return "wordpiece"
    if kind == "BPE":
        return "modernbert" if is_modern_tokenizer_json(data) else "bpe"
    raise DataError(f"{path}: model type is {kind!r}; bertforge loads WordPiece (BERT) and "
                    "byte-level BPE (BART, ModernBERT) tokenizers only")


def _readable(kind: str, directory: Path, family: Any = None) -> str:
    """``kind``, when the model in ``directory`` (``family``, else read from its config.json: if
    any, of a family bertforge knows) reads it (its record's ``tokenizers``); ``DataError``
    when it does not."""
    family = _family_in(directory) if family is None else family
    if family is None or kind in family.tokenizers:
        return kind
    reads = " or ".join(_LABELS[k] for k in family.tokenizers)
    raise DataError(f"{directory} holds a {_LABELS[kind]} tokenizer, but its config.json is a "
                    f"{family.name} model, which reads {reads} tokenizers; save the model with "
                    "the tokenizer it was trained with")


def _family_in(directory: Path) -> Any:
    """The ``FamilySpec`` of the config.json in ``directory`` (no ``model_type``: BERT, as
    Google's and NVIDIA's configs); None without one, or when it names no family bertforge
    knows or cannot be read (the tokenizer is then judged by its files alone)."""
    file = directory / "config.json"
    if not file.is_file():
        return None
    try:
        data = read_json_object(file)
    except DataError:
        return None
    # the registry imports the model package: only a model directory pays for it
    from bertforge.models.registry import family_of_type

    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        return None
    try:
        return family_of_type(model_type)
    except ConfigError:
        return None
