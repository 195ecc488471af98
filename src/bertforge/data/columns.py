"""Texts from column stores: Parquet files and Hugging Face datasets (a ``save_to_disk`` folder
or a Hub name).

Each reader yields ``(place, value, done)`` for every row: where the row is (for sources and
messages), the value of the text column (``MISSING`` when a row of a schemaless stream lacks
it), and the fraction of the input read so far (None when the size is unknown, as for a
streamed Hub dataset). Only the text column is read: other columns (images, metadata) are never
decoded. Memory stays bounded by one record batch of that column.

A whole input that cannot be read (not Parquet, truncated before its footer, no such column,
a column of numbers) raises :class:`SkipInput` with the reason, which the corpus reader reports
and counts like any skipped file. A row group that breaks part-way ends its file with a note
that keeps the rows before it. A Hub dataset that cannot be opened (offline and not cached, an
unknown config or split) is a ``DataError``: the name is wrong or the machine cannot reach it.

pyarrow and datasets are imported only when such an input is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bertforge.errors import ConfigError, DataError

HUB_PREFIX = "hf://"
HUB_SYNTAX = "hf://ORG/NAME[:CONFIG][@SPLIT]"
PARQUET_HINT = "install it with `pip install bertforge[parquet]` (or `pip install pyarrow`)"
DATASETS_HINT = "install it with `pip install bertforge[datasets]` (or `pip install datasets`)"
BATCH_ROWS = 1024  # rows per record batch read
MISSING = object()  # a row without the text field (schemaless streams only)

Row = tuple[str, Any, "float | None"]  # (place, value, fraction of the input read)


class SkipInput(Exception):
    """The whole input cannot be read; the message is the reason."""


@dataclass(frozen=True)
class DatasetInput:
    """A Hugging Face dataset given as an input: a ``save_to_disk`` folder or a Hub name."""

    location: str  # the folder, or ORG/NAME
    hub: bool
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        if not self.hub:
            return self.location + (f"@{self.split}" if self.split else "")
        return (f"{HUB_PREFIX}{self.location}" + (f":{self.config}" if self.config else "")
                + (f"@{self.split}" if self.split else ""))

    def size(self) -> int:
        """Bytes on disk (a folder's files; 0 for a Hub name, whose size is not known)."""
        if self.hub:
            return 0
        return sum(p.stat().st_size for p in Path(self.location).rglob("*") if p.is_file())


def hub_input(text: str) -> DatasetInput:
    """``hf://ORG/NAME[:CONFIG][@SPLIT]`` -> its input; ``ConfigError`` naming the syntax."""
    rest = text[len(HUB_PREFIX):]
    rest, _, split = rest.partition("@")
    name, _, config = rest.partition(":")
    parts = name.split("/")
    if not all(parts) or len(parts) > 2 or ("@" in text and not split) or (":" in rest
                                                                           and not config):
        raise ConfigError(f"--input {text}: not a Hub dataset name; write {HUB_SYNTAX}, e.g. "
                          "hf://HuggingFaceFW/fineweb-edu:sample-10BT@train")
    return DatasetInput(name, hub=True, config=config or None, split=split or None)


def saved_dataset(text: str) -> DatasetInput | None:
    """``DIR`` or ``DIR@SPLIT`` when DIR is a ``save_to_disk`` folder, else None."""
    path, split = Path(text), None
    if not path.exists() and "@" in text:
        head, _, split = text.rpartition("@")
        path = Path(head)
    if path.is_dir() and ((path / "dataset_dict.json").is_file()
                          or (path / "state.json").is_file()
                          and (path / "dataset_info.json").is_file()):
        return DatasetInput(str(path), hub=False, split=split or None)
    return None


# --- Parquet -----------------------------------------------------------------------------------


def parquet_rows(path: Path, field: str, notes: Callable[..., None]) -> Iterator[Row]:
    """The ``field`` column of a Parquet file, row group by row group."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow; {PARQUET_HINT}") from None
    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise SkipInput(f"not a readable Parquet file ({_first_line(exc)}); truncated, or not "
                        "Parquet") from None
    _check_column(table.schema_arrow.names, field,
                  lambda: table.schema_arrow.field(field).type, _arrow_text)
    groups, total, row = table.num_row_groups, max(1, table.metadata.num_rows), 0
    for group in range(groups):
        try:
            for batch in table.iter_batches(batch_size=BATCH_ROWS, row_groups=[group],
                                             columns=[field], use_threads=False):
                for value in batch.column(0).to_pylist():
                    row += 1
                    yield f"{path} row {row}", value, row / total
        except (pa.ArrowException, OSError) as exc:
            notes(f"{path}: row group {group + 1} of {groups} cannot be read "
                  f"({_first_line(exc)}); the file is damaged. Keeping the {row} row(s) read "
                  "before it.")
            return


def _arrow_text(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or getattr(pa.types, "is_string_view", lambda _: False)(kind))


def _check_column(names: list[str], field: str, kind: Callable[[], Any],
                  is_text: Callable[[Any], bool]) -> None:
    """``SkipInput`` when ``field`` is not a column, or not a text one."""
    if field not in names:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise SkipInput(f"no column {field!r} (columns: {shown}); name the text column with "
                        "--text-field")
    if not is_text(kind()):
        raise SkipInput(f"column {field!r} holds {kind()}, not text; name the text column with "
                        "--text-field")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# --- Hugging Face datasets ---------------------------------------------------------------------


def dataset_rows(source: DatasetInput, field: str) -> Iterator[Row]:
    """The ``field`` column of a saved or Hub dataset (the Hub's streamed)."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source}: reading Hugging Face datasets needs the datasets library; "
                        f"{DATASETS_HINT}") from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    data = _open_hub(datasets, source) if source.hub else _open_saved(datasets, source)
    features = data.features
    if features is not None:
        _check_column(list(features), field, lambda: features[field], _feature_text)
        data = data.select_columns([field])
    total = None if source.hub else max(1, len(data))
    for row, record in enumerate(data, start=1):
        yield (f"{source} row {row}", record.get(field, MISSING),
               None if total is None else row / total)


def _feature_text(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _open_saved(datasets: Any, source: DatasetInput) -> Any:
    try:
        data = datasets.load_from_disk(source.location)
    except (OSError, ValueError) as exc:
        raise SkipInput(f"a damaged save_to_disk folder ({_first_line(exc)})") from None
    if not isinstance(data, datasets.DatasetDict):
        if source.split:
            raise DataError(f"--input {source}: the folder holds one dataset, not splits; give "
                            f"it without @{source.split}")
        return data
    return data[_pick_split(source, list(data))]


def _pick_split(source: DatasetInput, splits: list[str]) -> str:
    """The split asked for, else ``train``, else the only one."""
    if source.split in splits or (source.split is None and "train" in splits):
        return source.split or "train"
    if source.split is None and len(splits) == 1:
        return splits[0]
    asked = f"no split {source.split!r}" if source.split else "no train split"
    raise DataError(f"--input {source}: {asked} (splits: {', '.join(splits)}); give "
                    f"{source.location}@SPLIT")


def _open_hub(datasets: Any, source: DatasetInput) -> Any:
    """The Hub dataset in streaming mode; from the local cache when offline."""
    try:
        return datasets.load_dataset(source.location, source.config,
                                     split=source.split or "train", streaming=True)
    except ConnectionError:
        raise DataError(_unreachable(datasets, source)) from None
    except (ValueError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as exc:
        raise DataError(f"--input {source}: {_first_line(exc)} (form: {HUB_SYNTAX})") from None


def _unreachable(datasets: Any, source: DatasetInput) -> str:
    offline = datasets.config.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
    return (f"--input {source}: {source.location} is not in the local datasets cache "
            f"({datasets.config.HF_DATASETS_CACHE}) and {why}; load it once with network access "
            "(or copy that cache from a machine that has it), or download its files (`hf "
            f"download --repo-type dataset {source.location}`) or save_to_disk and give the "
            "folder")


__all__ = ["DATASETS_HINT", "DatasetInput", "HUB_PREFIX", "MISSING", "PARQUET_HINT",
           "SkipInput", "dataset_rows", "hub_input", "parquet_rows", "saved_dataset"]
