"""``prepare`` on corpora as they come (Parquet, .jsonl.zst, save_to_disk, a cached Hub
dataset: the same instances as JSON Lines) and across machines (``--part I/N`` then
``--merge``: the same output, file for file, as one run; ``scripts/prepare.sbatch``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from bertforge.data import prepare_parts as parts
from bertforge.data.prepare import prepare
from bertforge.data.prepare_config import parse_part
from bertforge.errors import ConfigError, DataError
from hub_cache import fill_datasets_cache

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "scripts" / "prepare.sbatch"
SETTINGS = dict(max_seq_length=48, docs_per_shard=6, validation_fraction=0.15, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """About 60 documents of the standard library's docstrings as JSON Lines, and a vocab."""
    from bertforge.demo.corpus import build_sample_corpus
    from bertforge.tokenization.training import train_wordpiece

    root = tmp_path_factory.mktemp("parts")
    text = build_sample_corpus(root / "sample.txt", max_bytes=120_000)
    documents = [d.strip() for d in text.read_text().split("\n\n") if d.strip()]
    jsonl = root / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "n": i}) + "\n"
                             for i, d in enumerate(documents)))
    vocab = root / "vocab.txt"
    train_wordpiece([text], vocab_size=800, output=vocab, progress=False)
    return {"root": root, "documents": documents, "jsonl": jsonl, "vocab": vocab}


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def instances(out: Path) -> tuple[dict, dict]:
    """What a prepared output holds, apart from where it came from: every shard's bytes and the
    manifest's splits and counts."""
    manifest = json.loads((out / "manifest.json").read_text())
    shards = {k: v for k, v in digests(out).items() if k.startswith(("train/", "validation/"))}
    return shards, {k: manifest[k] for k in ("splits", "counts")}


# -- the same documents in every form ---------------------------------------------------------


def test_every_form_prepares_into_the_jsonl_instances(corpus: dict, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    docs = corpus["documents"]
    table = pa.table({"n": list(range(len(docs))), "text": docs})
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, start in enumerate(range(0, len(docs), 25)):  # three Parquet shards, small groups
        pq.write_table(table.slice(start, 25), shards / f"part-{i:03d}.parquet",
                       row_group_size=7)
    packed = tmp_path / "docs.jsonl.zst"
    packed.write_bytes(zstandard.ZstdCompressor().compress(corpus["jsonl"].read_bytes()))
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(saved))
    cache = tmp_path / "hf" / "datasets"
    fill_datasets_cache(cache, "acme/web", {"text": docs})
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    want = instances(prepare([corpus["jsonl"]], corpus["vocab"], tmp_path / "jsonl",
                             **SETTINGS).output)
    assert want[1]["counts"]["documents"] == len(docs) and len(want[0]) > 8
    for name, source in (("parquet", shards), ("zst", packed), ("saved", saved),
                         ("hub", "hf://acme/web")):
        report = prepare([source], corpus["vocab"], tmp_path / f"out-{name}", **SETTINGS)
        assert instances(report.output) == want, name


# -- across machines --------------------------------------------------------------------------


def test_parts_merge_into_the_single_run_file_for_file(corpus: dict, tmp_path: Path) -> None:
    single = prepare([corpus["jsonl"]], corpus["vocab"], tmp_path / "single", **SETTINGS)
    out = tmp_path / "multi"
    built = []
    for i in (2, 0, 1):  # any order, as the machines finish
        part = prepare([corpus["jsonl"]], corpus["vocab"], out, part=f"{i}/3", **SETTINGS)
        assert part.output == out / "parts" / f"{i}-of-3"
        built.append(part.chunks)
    assert sum(built) == single.chunks and min(built) >= single.chunks // 3
    merged = prepare([corpus["jsonl"]], corpus["vocab"], out, merge=True, **SETTINGS)
    assert merged.totals == single.totals and not (out / "parts").exists()
    assert digests(out) == digests(single.output)  # manifest, settings, shards, tokenizer
    with pytest.raises(DataError, match=r"--merge: .*multi is merged already \(its "
                                        r"manifest\.json is complete\); nothing to do"):
        prepare([corpus["jsonl"]], corpus["vocab"], out, merge=True, **SETTINGS)


def test_more_parts_than_chunks_and_a_resumed_merge(corpus: dict, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {**SETTINGS, "docs_per_shard": 40}  # 2 chunks, 4 parts: two parts build nothing
    single = prepare([corpus["jsonl"]], corpus["vocab"], tmp_path / "single", **settings)
    out = tmp_path / "multi"
    for i in range(4):
        report = prepare([corpus["jsonl"]], corpus["vocab"], out, part=f"{i}/4", **settings)
        assert report.chunks == (1 if i < 2 else 0)
    # A merge stopped after moving two shards: the next one finishes the moves.
    moves = []

    def stop_at_the_third(source: Path, target: Path) -> None:
        if len(moves) == 2:
            raise KeyboardInterrupt
        moves.append(target)
        real(source, target)

    real = parts.move_shard
    monkeypatch.setattr(parts, "move_shard", stop_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        prepare([corpus["jsonl"]], corpus["vocab"], out, merge=True, **settings)
    monkeypatch.setattr(parts, "move_shard", real)
    assert all(t.is_file() for t in moves) and not (out / "manifest.json").exists()
    prepare([corpus["jsonl"]], corpus["vocab"], out, merge=True, **settings)
    assert digests(out) == digests(single.output)


def test_merge_refuses_what_is_not_the_single_run(corpus: dict, tmp_path: Path) -> None:
    out = tmp_path / "multi"

    def merge(**more):
        return prepare([corpus["jsonl"]], corpus["vocab"], out, merge=True, **{**SETTINGS,
                                                                              **more})

    with pytest.raises(DataError, match=r"--merge: no parts in .*parts; run this command with "
                                        r"--part I/N \(for I = 0..N-1\) instead of --merge first"):
        merge()
    prepare([corpus["jsonl"]], corpus["vocab"], out, part="0/2", **SETTINGS)
    with pytest.raises(DataError, match=r"--merge: part 1/2 is not finished \(.*1-of-2/part\.json"
                                        r" is missing\); run this command with --part 1/2 \(it "
                                        r"resumes\) and merge again"):
        merge()
    prepare([corpus["jsonl"]], corpus["vocab"], out, part="1/2", **SETTINGS)
    with pytest.raises(DataError, match=r"part 0/2 \(.*0-of-2\) was prepared with other settings "
                                        "or inputs than this command's"):
        merge(seed=7)
    prepare([corpus["jsonl"]], corpus["vocab"], out, part="0/3", **SETTINGS)
    with pytest.raises(DataError, match=r"holds parts of 2 and 3 runs; keep the folders of one N"):
        merge()
    assert not (out / "manifest.json").exists()
    assert (out / "parts" / "1-of-2" / "part.json").is_file()


def test_part_numbers_from_the_command_line_slurm_and_torchrun() -> None:
    assert parse_part("2/8", {}) == (2, 8)
    array = {"SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_MIN": "10",
             "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert parse_part("env", array) == (2, 4)
    assert parse_part("env", {"SLURM_PROCID": "3", "SLURM_NTASKS": "5"}) == (3, 5)
    assert parse_part("env", {"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    for bad in ("3/3", "1", "a/b", "-1/2", "1/0"):
        with pytest.raises(ConfigError, match=rf"--part {bad}: give I/N with 0 <= I < N"):
            parse_part(bad, {})
    with pytest.raises(ConfigError, match=r"--part env: none of SLURM_ARRAY_TASK_ID/"
                                          r"SLURM_ARRAY_TASK_COUNT, .* is set; give --part I/N"):
        parse_part("env", {})
    with pytest.raises(ConfigError, match=r"--merge: joins the parts: give it without --part"):
        prepare(["x"], "v", "o", part="0/2", merge=True)


def test_the_sbatch_script_runs_the_parts_and_the_merge(corpus: dict, tmp_path: Path,
                                                        child_env: dict) -> None:
    """The array tasks and the merge job as SLURM would start them (its variables set)."""
    import sys

    from bertforge.cli import main

    out = tmp_path / "multi"
    args = ["--input", str(corpus["jsonl"]), "--vocab", str(corpus["vocab"]), "--output",
            str(out), "--max-seq-length", "48", "--docs-per-shard", "6",
            "--validation-fraction", "0.15"]
    single = tmp_path / "single"
    assert main(["prepare", *[str(single) if a == str(out) else a for a in args]]) == 0
    env = {**child_env, "PYTHON": sys.executable, "SLURM_ARRAY_JOB_ID": "77",
           "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_CPUS_PER_TASK": "1"}
    for task in ("1", "0"):
        done = subprocess.run(["bash", str(SBATCH), *args], env={
            **env, "SLURM_ARRAY_TASK_ID": task}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"prepare.sbatch: array job 77, part {task} of 2" in done.stdout
    merged = subprocess.run(["bash", str(SBATCH), "--merge", *args], env=env,
                            capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stderr
    assert digests(out) == digests(single)  # config.yaml too: the command a single run saves
    lone = subprocess.run(["bash", str(SBATCH), *args], env=child_env, capture_output=True,
                          text=True, timeout=60)
    assert lone.returncode == 2 and "not an array task; submit with sbatch --array" in lone.stderr
