"""``bertforge prepare``: corpus -> pretraining instances -> token shards, in parallel.

Instances follow ``objective``: BERT's sentence pairs (``nsp``), ALBERT's ordered pairs (``sop``),
packed single segments (``none``), or packed segments with their sentence boundaries for BART's
denoising (``denoise``, native format only).

The main process only reads documents (cheap I/O) and groups them, in input order, into chunks
of at most ``docs_per_shard`` documents or ``chunk_bytes`` of text, so chunk boundaries depend
only on the input. Each chunk becomes one shard per split, built by a worker
(:mod:`bertforge.data.prepare_worker`) with RNGs seeded by ``(seed, chunk index)``:
segmentation, tokenization, validation assignment, instance creation and the shard write. Hence the output is identical byte for byte whatever the worker count, and a
re-run skips the chunks whose shards exist (resume). ``manifest.json`` is written last.

Stopping: Ctrl-C, SIGTERM or SIGUSR1 reach the main process only (workers ignore them); it drops
the queued chunks, lets the running ones finish, removes temporary files and keeps every finished
shard. Workers end by themselves when the main process is gone, even after SIGKILL.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from bertforge.core import limits
from bertforge.data import native, native_writer
from bertforge.data import prepare_worker as worker
from bertforge.data.instances import check_instance_settings
from bertforge.data.prepare_worker import load_tokenizer
from bertforge.errors import ConfigError, DataError
from bertforge.core.io import write_json_atomic
from bertforge.core.signals import Stopped, raise_on_stop

SETTINGS_NAME = "prepare-settings.json"
TOKENIZER_DIR = "tokenizer"
# Rough English WordPiece density (bytes of raw text per token) for the up-front size estimate.
BYTES_PER_TOKEN = 4.5
# Rough English sentence length in tokens, for the size of denoise's sentence boundaries.
TOKENS_PER_SENTENCE = 25


@dataclass
class PrepareReport:
    """What ``prepare`` did; ``summary()`` is the one-screen text the CLI prints."""

    output: Path
    fmt: str
    objective: str
    totals: dict[str, int]
    splits: dict[str, dict[str, int]]
    chunks: int
    resumed_chunks: int
    input_bytes: int
    estimated_bytes: int
    output_bytes: int
    seconds: float
    skipped_inputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        t = self.totals
        lines = [
            f"prepared {self.output} ({self.fmt}, objective {self.objective})",
            f"  documents  {t['documents']:,} (+{t['skipped_documents']:,} skipped: no text left)",
            f"  sentences  {t['sentences']:,}",
            f"  instances  {t['instances']:,}",
            f"  tokens     {t['tokens']:,}",
        ]
        for name, s in self.splits.items():
            lines.append(f"  {name:<10} {s['instances']:,} instances, {s['tokens']:,} tokens, "
                         f"{s['documents']:,} documents")
        resumed = f" ({self.resumed_chunks} done by an earlier run)" if self.resumed_chunks else ""
        lines.append(f"  shards     {self.chunks} per split{resumed}")
        lines.append(f"  size       {_human(self.output_bytes)} from {_human(self.input_bytes)} of "
                     f"input (estimated {_human(self.estimated_bytes)}), {self.seconds:.1f}s")
        for title, items in (("skipped inputs", self.skipped_inputs),
                             ("reader warnings", self.warnings)):
            if items:
                lines.append(f"  {title} ({len(items)}):")
                lines += [f"    {x}" for x in items[:20]]
                if len(items) > 20:
                    lines.append(f"    ... and {len(items) - 20} more")
        return "\n".join(lines)


@raise_on_stop()  # SIGTERM/SIGUSR1 raise Stopped: the same clean exit as Ctrl-C
def prepare(
    inputs: Sequence[str | Path],
    vocab: str | Path,
    output: str | Path,
    *,
    max_seq_length: int = 128,
    max_predictions: int = 20,
    masked_lm_prob: float = 0.15,
    short_seq_prob: float = 0.1,
    objective: str = "nsp",
    whole_word_masking: bool = False,
    dupe_factor: int = 5,
    validation_fraction: float = 0.01,
    workers: int = 1,
    seed: int = 12345,
    fmt: str = "native",
    input_format: str = "auto",
    text_field: str = "text",
    docs_per_shard: int = 2048,
    chunk_bytes: int = 8 << 20,
    length_bin_width: int = native_writer.DEFAULT_BIN_WIDTH,
    overwrite: bool = False,
    progress: bool = True,
) -> PrepareReport:
    """Turn text files into pretraining shards in ``output`` and return a report.

    Keywords mirror the ``bertforge prepare`` flags. ``objective`` is one of ``nsp``, ``sop``,
    ``none`` or ``denoise``; ``denoise`` packs whole sentences as ``none`` does and also stores
    where each sentence ends (for BART's sentence permutation; the noise is drawn at load time),
    which only ``fmt="native"`` can hold. ``validation_fraction`` (default 0.01) is
    the probability that a document is held out for the ``validation`` split (0: no such split).
    ``dupe_factor`` applies to ``fmt="hdf5"`` only: that many instance passes, each with its own
    static masks; native shards store one pass and masks are drawn at load time.
    ``masked_lm_prob``, ``max_predictions`` and ``whole_word_masking`` go to the manifest as the
    loader's defaults. A chunk (one shard per split) is ``docs_per_shard`` documents or
    ``chunk_bytes`` of text, whichever comes first. ``overwrite`` replaces an earlier output made
    with other settings. Raises ``DataError``/``ConfigError`` for user mistakes.
    """
    started = time.perf_counter()
    _check_args(locals())
    from bertforge.data.corpus import expand_inputs

    say = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    files = expand_inputs([str(p) for p in inputs])
    tokenizer = load_tokenizer(vocab)
    output = Path(output)
    input_bytes = sum(f.stat().st_size for f in files)
    splits = ["train", "validation"] if validation_fraction > 0 else ["train"]
    vocab_size = int(tokenizer.vocab_size)
    settings = {
        "format": native.FORMAT_NAME if fmt == "native" else native.HDF5_DIR_FORMAT,
        "format_version": native.FORMAT_VERSION,
        "output_format": fmt, "vocab_hash": tokenizer.vocab_hash, "vocab_size": vocab_size,
        "do_lower_case": bool(tokenizer.do_lower_case), "special_ids": _special_ids(tokenizer),
        "max_seq_length": max_seq_length, "objective": objective, "short_seq_prob": short_seq_prob,
        "masked_lm_prob": masked_lm_prob, "max_predictions": max_predictions,
        "whole_word_masking": bool(whole_word_masking),
        "dupe_factor": dupe_factor if fmt == "hdf5" else 1,
        "validation_fraction": validation_fraction, "seed": seed, "input_format": input_format,
        "text_field": text_field, "docs_per_shard": docs_per_shard, "chunk_bytes": chunk_bytes,
        "length_bin_width": length_bin_width,
        "token_dtype": native_writer.token_dtype(vocab_size).str,
        "inputs": [[str(f.resolve()), f.stat().st_size] for f in files],
    }
    fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    _claim_output(output, settings, fingerprint, overwrite)
    tokenizer.save(output / TOKENIZER_DIR)

    estimate = _estimate_bytes(input_bytes, settings)
    say(f"prepare: {len(files)} input file(s), {_human(input_bytes)}; estimated output "
        f"~{_human(estimate)} ({fmt}) in {output}")
    job = {**settings, "vocab_path": str(vocab), "splits": splits, "root": str(output)}
    warnings: list[str] = []
    skipped: list[str] = []
    results: list[dict[str, Any]] = []
    resumed = 0
    bar = _progress_bar(input_bytes, progress)
    pool = _pool(workers, job, tokenizer)
    limit = 2 * workers if pool else 0  # chunks in flight: bounded so memory stays flat
    stop: BaseException | None = None  # the KeyboardInterrupt or Stopped that ends the run early
    try:
        pending: list[tuple[Future | None, dict[str, Any]]] = []
        for task in _chunks(files, input_format, text_field, docs_per_shard, chunk_bytes,
                            warnings, skipped):
            done = _finished_chunk(output, splits, task["index"], fmt)
            if done is not None:
                resumed += 1
                task = {"index": task["index"], "bytes": task["bytes"], "splits": done}
            pending.append((pool.submit(worker.process_chunk, task)
                            if pool and done is None else None, task))
            # Harvest in input order; finished (resumed) chunks at the front go straight through.
            while pending and (len(pending) > limit or "splits" in pending[0][1]):
                results.append(_harvest(*pending.pop(0), bar))
        while pending:
            results.append(_harvest(*pending.pop(0), bar))
    except (KeyboardInterrupt, Stopped) as e:
        stop = e
        raise
    except BrokenProcessPool as e:
        _kill_workers(pool)
        raise DataError(f"a prepare worker process died (often: out of memory) while writing "
                        f"{output}; run the same command again with fewer --workers, finished "
                        "shards are kept") from e
    finally:
        bar.close()
        if pool:
            # Queued chunks are dropped; running ones (workers ignore stop signals) finish
            # atomically.
            pool.shutdown(wait=True, cancel_futures=True)
        if stop is not None:
            native_writer.remove_temp_files(output, splits)
            why = str(stop) if isinstance(stop, Stopped) else "interrupted"
            say(f"prepare: {why}; finished shards are kept, run the same command to resume")

    if not results:
        raise DataError(f"no documents found in {', '.join(map(str, inputs))} (input format "
                        f"{input_format!r}); check --input and --input-format"
                        + "".join(f"; skipped {s}" for s in skipped[:5]))
    shard_names = {r["index"]: {s: worker.shard_name(s, r["index"], fmt) for s in splits}
                   for r in results}
    manifest = native_writer.build_manifest(settings, fingerprint, results, shard_names,
                                            TOKENIZER_DIR)
    totals = manifest["counts"]
    if totals["instances"] == 0:
        raise DataError(
            f"{totals['documents']} document(s) read from {', '.join(map(str, inputs))} but no "
            "instance could be built: documents need at least two tokens of text (check "
            "--input-format; with 'sentences' a blank line ends a document)")
    native_writer.write_manifest(output, manifest)
    return PrepareReport(
        output=output, fmt=fmt, objective=objective, totals=totals,
        splits={s: {k: manifest["splits"][s][k] for k in ("documents", "instances", "tokens")}
                for s in splits},
        chunks=len(results), resumed_chunks=resumed, input_bytes=input_bytes,
        estimated_bytes=estimate,
        output_bytes=sum(p.stat().st_size for p in output.rglob("*") if p.is_file()),
        seconds=time.perf_counter() - started, skipped_inputs=skipped, warnings=warnings)


def _special_ids(tok: Any) -> dict[str, int]:
    # BertTokenizer refuses a vocabulary without all five, so every id exists here.
    return {name: int(getattr(tok, f"{name}_id")) for name in ("pad", "unk", "cls", "sep", "mask")}


def _check_args(a: dict[str, Any]) -> None:
    """Reject impossible settings before any work, naming the flag."""
    from bertforge.data.corpus import FORMATS

    check_instance_settings(a["max_seq_length"], a["short_seq_prob"], a["objective"])
    checks = [
        ("--input-format", a["input_format"] in FORMATS, f"must be one of {', '.join(FORMATS)}"),
        ("--format", a["fmt"] in ("native", "hdf5"), "must be native or hdf5"),
        ("--format", not (a["fmt"] == "hdf5" and a["objective"] == "denoise"),
         "hdf5 stores static BERT masks and cannot hold --objective denoise data; use --format "
         "native"),
        ("--workers", isinstance(a["workers"], int) and a["workers"] >= 1, "must be >= 1"),
        ("--dupe-factor", isinstance(a["dupe_factor"], int) and a["dupe_factor"] >= 1, "must be >= 1"),
        ("--validation-fraction", a["validation_fraction"] in limits.FRACTION,
         f"must be a finite number {limits.FRACTION}"),
        ("--masked-lm-prob", a["masked_lm_prob"] in limits.MASKED_LM_PROB,
         f"must be a finite number {limits.MASKED_LM_PROB}"),
        ("--max-predictions", a["max_predictions"] >= 1, "must be >= 1"),
        ("docs_per_shard", a["docs_per_shard"] >= 1, "must be >= 1"),
        ("chunk_bytes", a["chunk_bytes"] >= 1, "must be >= 1"),
        ("length_bin_width", a["length_bin_width"] >= 1, "must be >= 1"),
    ]
    for name, ok, what in checks:
        if not ok:
            raise ConfigError(f"{name}: {what}")


def _claim_output(output: Path, settings: dict, fingerprint: str, overwrite: bool) -> None:
    """Create ``output``, or check that it holds an earlier run with the very same settings."""
    settings_file = output / SETTINGS_NAME
    if output.exists() and not output.is_dir():
        raise DataError(f"--output {output}: exists and is not a directory; choose another path")
    if settings_file.is_file():
        try:
            old = json.loads(settings_file.read_text(encoding="utf-8")).get("fingerprint")
        except (ValueError, AttributeError):
            old = None
        if old != fingerprint:
            if not overwrite:
                raise DataError(
                    f"--output {output}: holds data prepared with other settings or inputs (see "
                    f"{settings_file}); choose a new --output, or pass --overwrite to replace it")
            for name in (native.MANIFEST_NAME, SETTINGS_NAME):
                (output / name).unlink(missing_ok=True)
            for name in ("train", "validation", TOKENIZER_DIR):
                shutil.rmtree(output / name, ignore_errors=True)
    elif output.is_dir() and any(output.iterdir()):
        # Never delete what prepare did not write, even with --overwrite.
        raise DataError(f"--output {output}: directory is not empty and was not written by "
                        "`bertforge prepare`; choose a new or empty --output")
    for split in ("train", "validation"):
        (output / split).mkdir(parents=True, exist_ok=True)
    if not settings_file.is_file():
        write_json_atomic(settings_file, {"fingerprint": fingerprint, "settings": settings})
    native_writer.remove_temp_files(output, ["train", "validation"])


def _chunks(files: list[Path], input_format: str, text_field: str, docs_per_shard: int,
            chunk_bytes: int, warnings: list[str], skipped: list[str]) -> Iterator[dict[str, Any]]:
    """Documents of all files, in order, grouped into tasks ``{index, docs, bytes}``.

    A chunk closes after ``docs_per_shard`` documents or ``chunk_bytes`` characters of text
    (a property of the input alone); ``bytes`` is the on-disk input it consumed, for progress.
    """
    from bertforge.data.corpus import ReadStats, iter_documents

    docs: list = []
    text, index, files_done, reported = 0, 0, 0, 0
    for path in files:
        def warn(message: str, path: Path = path) -> None:
            warnings.append(message if str(path) in message else f"{path}: {message}")

        stats = ReadStats()
        for doc in iter_documents(path, input_format=input_format, text_field=text_field,
                                  warn=warn, stats=stats):
            docs.append(doc)
            text += sum(len(line) + 1 for line in doc.lines)
            if len(docs) >= docs_per_shard or text >= chunk_bytes:
                position = files_done + stats.input_bytes
                yield {"index": index, "docs": docs, "bytes": position - reported}
                index, docs, text, reported = index + 1, [], 0, position
        files_done += path.stat().st_size
        skipped += [f"{p}: {reason}" for p, reason in stats.skipped]
        if stats.documents == 0 and not stats.skipped:
            skipped.append(f"{path}: no documents (nothing matched --input-format {input_format})")
    if docs:
        yield {"index": index, "docs": docs, "bytes": files_done - reported}


def _finished_chunk(root: Path, splits: list[str], index: int, fmt: str) -> dict | None:
    """Per-split stats of chunk ``index`` if an earlier run finished it, else None."""
    paths = {s: root / worker.shard_name(s, index, fmt) for s in splits}
    if not all(p.is_file() for p in paths.values()):
        return None
    if fmt == "native":
        return {s: json.loads(native.read_shard_metadata(p)["stats"]) for s, p in paths.items()}
    import h5py

    out = {}
    for s, p in paths.items():
        with h5py.File(p, "r") as f:
            out[s] = json.loads(f.attrs["bertforge_stats"])
    return out


# --- worker pool ---------------------------------------------------------------------------------

def _pool(workers: int, job: dict[str, Any], tokenizer: Any) -> ProcessPoolExecutor | None:
    """A spawn-based process pool, or (workers == 1) None: chunks then run in this process."""
    if workers == 1:
        worker.init_worker(job, parent_pid=None, tokenizer=tokenizer)
        return None
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                               initializer=worker.init_worker, initargs=(job, os.getpid()))


def _kill_workers(pool: ProcessPoolExecutor | None) -> None:
    """SIGKILL the workers left in a broken pool.

    The pool's own clean-up only sends SIGTERM, which workers ignore; one left blocked on a queue
    lock that the dead worker held would make ``shutdown`` wait forever. ``_processes`` is private
    but present in every supported Python (3.14 adds ``kill_workers()``); test doubles lack it.
    """
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()


def _harvest(fut: Future | None, task: dict[str, Any], bar: Any) -> dict[str, Any]:
    """The result of one chunk, in input order: from its future, from an earlier run (resumed),
    or computed here (no pool); advances the progress bar."""
    if fut is not None:
        result = fut.result()
    else:
        result = task if "splits" in task else worker.process_chunk(task)
    for key in ("documents", "tokens"):
        bar.seen[key] = bar.seen.get(key, 0) + sum(v[key] for v in result["splits"].values())
    bar.set_postfix(docs=f"{bar.seen['documents']:,}", tokens=f"{bar.seen['tokens']:,}",
                    refresh=False)
    bar.update(result["bytes"])
    return result


# --- helpers -------------------------------------------------------------------------------------


def _estimate_bytes(input_bytes: int, settings: dict) -> int:
    tokens = input_bytes / BYTES_PER_TOKEN
    instances = tokens / (0.9 * settings["max_seq_length"])
    if settings["output_format"] == "native":
        itemsize = np.dtype(settings["token_dtype"]).itemsize
        size = tokens * itemsize + instances * 11  # + offsets (8), a_length (2), label (1)
        if settings["objective"] == "denoise":
            # sentence_offsets (8 per instance) and one int16 end per sentence
            size += instances * 8 + 2 * tokens / TOKENS_PER_SENTENCE
        return int(size)
    # Static masks, before gzip: int32 ids + int8 mask and segments [S], int32 positions and
    # ids [P], one label; per instance pass.
    per_instance = 6 * settings["max_seq_length"] + 8 * settings["max_predictions"] + 1
    return int(instances * per_instance * settings["dupe_factor"])


def _progress_bar(total: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare",
               disable=not enabled, smoothing=0.1, dynamic_ncols=True)
    bar.seen = {}  # running totals shown after the byte rate
    return bar


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
