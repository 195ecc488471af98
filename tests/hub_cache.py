"""A Hugging Face Hub cache laid out as huggingface_hub writes it, for tests that resolve model
names without the network (tests/unit/test_hub_names.py, tests/integration/test_hub_names_cli.py;
importable because tests/conftest.py puts this folder on ``sys.path``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache: Path, repo_id: str, source: Path, *, commit: str = COMMIT,
               refs: tuple[str, ...] = ("main",), skip: tuple[str, ...] = ()) -> Path:
    """Put the files of ``source`` into ``cache`` as a snapshot of ``repo_id`` at ``commit``,
    the way huggingface_hub stores a download; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.name in skip:
            continue
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def fill_datasets_cache(cache: Path, repo_id: str, columns: dict[str, list]) -> None:
    """Put a dataset of ``columns`` into the datasets cache ``cache`` (HF_DATASETS_CACHE) as
    ``load_dataset(repo_id)`` leaves it after an online run: prepared by datasets' own Parquet
    builder, in its layout ``ORG___NAME/default/0.0.0/HASH``, where ``load_dataset`` finds it
    offline."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    source = cache.parent / f"download-{repo_id.replace('/', '--')}" / "train.parquet"
    source.parent.mkdir(parents=True)
    pq.write_table(pa.table(columns), source)
    builder = Parquet(cache_dir=str(cache / "staging"), dataset_name=repo_id.split("/")[-1],
                      data_files={"train": str(source)}, hash=COMMIT[:8])
    builder.download_and_prepare()
    target = cache / repo_id.replace("/", "___") / "default" / "0.0.0"
    target.mkdir(parents=True)
    Path(builder.cache_dir).rename(target / COMMIT[:8])
