"""``load_tokenizer``: WordPiece (BERT), byte-level BPE with BART's specials, or byte-level BPE with
BERT's specials (ModernBERT), by what a path holds."""

from __future__ import annotations

from pathlib import Path


from bertforge.core.arguments import checked
from bertforge.core.paths import check_path_text
from bertforge.errors import DataError
from bertforge.tokenization.base import read_json_object
from bertforge.tokenization.bpe import BpeTokenizer, read_bpe_directory
from bertforge.tokenization.modern import ModernBpeTokenizer, is_modern_tokenizer_json
from bertforge.tokenization.wordpiece import BertTokenizer, _directory_tokens

# What ``_directory_kind`` and ``_tokenizer_json_kind`` call each kind, and its class.
_CLASSES = {"WordPiece": BertTokenizer, "BPE": BpeTokenizer, "ModernBPE": ModernBpeTokenizer}

def read_vocab_tokens(directory: str | Path) -> list[str] | None:
    """Tokens (in id order) of the tokenizer saved in a model directory, WordPiece or byte-level
    BPE (BART's or ModernBERT's); None if it has none."""
    directory = Path(directory)
    kind = _directory_kind(directory)
    if kind is None:
        return None
    if kind == "WordPiece":
        return _directory_tokens(directory)[0]
    if kind == "ModernBPE":
        return list(ModernBpeTokenizer.from_pretrained(directory).vocab)
    return read_bpe_directory(directory)[0]

@checked
def load_tokenizer(path: str | Path) -> BertTokenizer | BpeTokenizer | ModernBpeTokenizer:
    """The tokenizer ``path`` holds: a vocab.txt is WordPiece (``BertTokenizer``); a
    tokenizer.json is WordPiece or byte-level BPE by its model type, the BPE being ModernBERT's
    (``ModernBpeTokenizer``) when its added tokens include [CLS] [SEP] [MASK], else BART's
    (``BpeTokenizer``); a directory is read through its tokenizer.json, else its vocab.txt, else
    its vocab.json + merges.txt. A Hugging Face Hub name that is no local path (``"google-bert/bert-base-uncased"``)
    is read from its cached snapshot, else downloaded (``bertforge.models.hub_names``;
    ``ConfigError`` when offline without it). ``DataError`` when the path holds none of these."""
    check_path_text(path, "tokenizer path")
    path = _hub_directory(path)
    if path.is_dir():
        kind = _directory_kind(path)
        if kind is None:
            raise DataError(f"{path} holds no tokenizer: expected tokenizer.json, vocab.txt (BERT) "
                            "or vocab.json + merges.txt (BART)")
        return _CLASSES[kind].from_pretrained(path)
    if not path.exists():
        raise DataError(f"tokenizer {path} does not exist; give a vocab.txt, a tokenizer.json or "
                        "a model directory")
    if path.name in ("vocab.json", "merges.txt"):
        raise DataError(f"{path} is one half of a BPE tokenizer; give the directory that holds "
                        "both vocab.json and merges.txt")
    if path.suffix == ".json":
        return _CLASSES[_tokenizer_json_kind(path)].from_file(path)
    return BertTokenizer.from_file(path)

def _hub_directory(path: str | Path) -> Path:
    """``path``, or the snapshot directory of the Hub name it spells when no such path exists."""
    path = Path(path)
    if path.exists():
        return path
    from bertforge.models.hub_names import hub_snapshot, parse_hub_name  # torch-free callers

    name = parse_hub_name(str(path))
    return path if name is None else hub_snapshot(name, f"tokenizer {path}", weights=False)

def _directory_kind(directory: Path) -> str | None:
    """"WordPiece", "BPE" or "ModernBPE": the kind of tokenizer a directory holds (its tokenizer.json, else
    its vocab.txt, else its vocab.json + merges.txt); None when it holds none."""
    if (directory / "tokenizer.json").exists():
        return _tokenizer_json_kind(directory / "tokenizer.json")
    if (directory / "vocab.txt").exists():
        return "WordPiece"
    if (directory / "vocab.json").exists() and (directory / "merges.txt").exists():
        return "BPE"
    return None

def _tokenizer_json_kind(path: Path) -> str:
    """The kind of a tokenizer.json: "WordPiece", "BPE" (BART's specials) or "ModernBPE"
    (BERT's); ``DataError`` for any other model type."""
    data = read_json_object(path)
    model = data.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind == "BPE" and is_modern_tokenizer_json(data):
        return "ModernBPE"
    if kind not in ("WordPiece", "BPE"):
        raise DataError(f"{path}: model type is {kind!r}; bertforge loads WordPiece (BERT) and "
                        "byte-level BPE (BART, ModernBERT) tokenizers only")
    return kind
