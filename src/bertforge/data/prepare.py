"""``bertforge prepare``: corpus -> pretraining instances -> token shards, in parallel.

Instances follow ``objective``: BERT's sentence pairs (``nsp``), ALBERT's ordered pairs (``sop``),
packed single segments (``none``), or packed segments with their sentence boundaries for BART's
denoising (``denoise``, native format only).

The settings are one :class:`~bertforge.data.prepare_config.PrepareConfig`, checked before any
work; :func:`prepare_data` then runs named stages: read the inputs (``_open_inputs``), record
the settings and claim the output (``_settings``, ``_claim_output``), write the shards
(``_write_shards``), and last the manifest (``_write_manifest``). The main process only reads
documents (cheap I/O) and groups them, in input order, into chunks of at most
``docs_per_shard`` documents or ``chunk_bytes`` of text (``_chunks``), so chunk boundaries
depend only on the input. Each chunk becomes one shard per split, built by a worker
(:mod:`bertforge.data.prepare_worker`) with RNGs seeded by ``(seed, chunk index)``:
segmentation, tokenization, validation assignment, instance creation and the shard write.
Hence the output is identical byte for byte whatever the worker count, and a re-run skips the
chunks whose shards exist (resume). ``manifest.json`` is written last.

Stopping: Ctrl-C, SIGTERM or SIGUSR1 reach the main process only (workers ignore them); it drops
the queued chunks, lets the running ones finish, removes temporary files and keeps every finished
shard. Workers end by themselves when the main process is gone, even after SIGKILL.

Across machines (:mod:`bertforge.data.prepare_parts`): ``--part I/N`` builds the chunks whose
index is I modulo N into ``OUTPUT/parts/I-of-N``; ``--merge`` joins the N parts into the output
a single run writes (:func:`_merge`).
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

from bertforge.data import native, native_writer
from bertforge.data import prepare_parts as parts
from bertforge.data import prepare_worker as worker
from bertforge.data.prepare_config import PrepareConfig, parse_part
from bertforge.data.prepare_report import (  # noqa: F401 (the estimate's constants, re-exported)
    BYTES_PER_TOKEN, TOKENS_PER_SENTENCE, PrepareReport, estimate_bytes as _estimate_bytes,
    human as _human)
from bertforge.data.prepare_worker import load_tokenizer
from bertforge.core.jsonfile import read_json_object
from bertforge.errors import DataError
from bertforge.core.io import LOCK_NAME, output_lock, write_json_atomic
from bertforge.core.signals import Stopped, raise_on_stop, starting_workers

SETTINGS_NAME = "prepare-settings.json"
TOKENIZER_DIR = "tokenizer"


def prepare(inputs: Sequence[str | Path] | str | Path, vocab: str | Path, output: str | Path,
            *, fmt: str = "native", progress: bool = True, **settings: Any) -> PrepareReport:
    """Turn text files into pretraining shards in ``output`` and return a report.

    ``settings`` are the fields of :class:`~bertforge.data.prepare_config.PrepareConfig` (the
    ``bertforge prepare`` flags, with their defaults and checks there; ``fmt`` is ``--format``),
    run by :func:`prepare_data`. ``objective`` is one of ``nsp``, ``sop``, ``none`` or
    ``denoise``; ``denoise`` packs whole sentences as ``none`` does and also stores where each
    sentence ends (for BART's sentence permutation; the noise is drawn at load time), which only
    ``fmt="native"`` can hold. ``validation_fraction`` (default 0.01) is the probability that a
    document is held out for the ``validation`` split (0: no such split). ``dupe_factor``
    applies to ``fmt="hdf5"`` only: that many instance passes, each with its own static masks;
    native shards store one pass and masks are drawn at load time. ``masked_lm_prob``,
    ``max_predictions`` and ``whole_word_masking`` go to the manifest as the loader's defaults.
    A chunk (one shard per split) is ``docs_per_shard`` documents or ``chunk_bytes`` of text,
    whichever comes first. ``overwrite`` replaces an earlier output made with other settings.
    Raises ``DataError``/``ConfigError`` for user mistakes.
    """
    inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    cfg = PrepareConfig(input=[str(p) for p in inputs], vocab=str(vocab), output=str(output),
                        format=fmt, **settings)
    return prepare_data(cfg, progress=progress)


@dataclass
class _Sources:
    """The read stage's result: the input files, their size and the tokenizer."""

    files: list[Any]  # corpus.Input: files and datasets
    input_bytes: int
    tokenizer: Any


@dataclass
class _Shards:
    """The shard stage's result: one entry per chunk, in input order, and what was skipped."""

    results: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0  # of the whole input (a part builds some of them)
    resumed: int = 0
    warnings: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


@raise_on_stop()
def prepare_data(cfg: PrepareConfig, *, progress: bool = True) -> PrepareReport:
    """``bertforge prepare`` with validated settings: read the inputs, record the settings and
    claim the output, write the shards (segment, tokenize, split and build instances per chunk,
    in ``prepare_worker``), then the manifest."""
    started = time.perf_counter()
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None)
    sources = _open_inputs(cfg)
    settings = _settings(cfg, sources)
    fingerprint = _fingerprint(settings)
    output = Path(cfg.output)
    if output.exists() and not output.is_dir():
        raise DataError(f"--output {output}: exists and is not a directory; choose another path")
    if cfg.merge:
        return _merge(cfg, sources, settings, fingerprint, started)
    part = parse_part(cfg.part) if cfg.part else None
    root = parts.part_dir(output, part) if part else output
    # A part's own settings name it: its folder resumes only the same part.
    own = {**settings, "part": list(part)} if part else settings
    root.mkdir(parents=True, exist_ok=True)
    with output_lock(root, "--output", "bertforge prepare"):  # one writer at a time
        _claim_output(root, own, _fingerprint(own), cfg.overwrite)
        sources.tokenizer.save(root / TOKENIZER_DIR)
        estimate = _estimate_bytes(sources.input_bytes, settings) // (part[1] if part else 1)
        size = (f"{_human(sources.input_bytes)}; estimated output ~{_human(estimate)}"
                if sources.input_bytes else "size not known (streamed)")
        say(f"prepare{f' part {part[0]}/{part[1]}' if part else ''}: {len(sources.files)} "
            f"input(s), {size} ({cfg.format}) in {root}")
        shards = _write_shards(cfg, sources, settings, root, part, progress=progress, say=say)
        if part:
            _require_chunks(cfg, shards)
            parts.write_part_record(root, part, fingerprint, shards.chunks,
                                    [r["index"] for r in shards.results])
            manifest = _build_manifest(cfg, settings, fingerprint, shards)
        else:
            manifest = _write_manifest(cfg, settings, fingerprint, shards)
    return _report(cfg, root, manifest, shards, sources.input_bytes, estimate, started)


def _fingerprint(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _report(cfg: PrepareConfig, root: Path, manifest: dict[str, Any], shards: _Shards,
            input_bytes: int, estimate: int, started: float) -> PrepareReport:
    return PrepareReport(
        output=root, fmt=cfg.format, objective=cfg.objective, totals=manifest["counts"],
        splits={s: {k: manifest["splits"][s][k] for k in ("documents", "instances", "tokens")}
                for s in _splits(cfg) if s in manifest["splits"]},
        chunks=len(shards.results), resumed_chunks=shards.resumed, input_bytes=input_bytes,
        estimated_bytes=estimate,
        output_bytes=sum(p.stat().st_size for p in root.rglob("*") if p.is_file()),
        seconds=time.perf_counter() - started, skipped_inputs=shards.skipped,
        warnings=shards.warnings)


def _merge(cfg: PrepareConfig, sources: _Sources, settings: dict[str, Any], fingerprint: str,
           started: float) -> PrepareReport:
    """``--merge``: the finished parts' shards moved into the output, with the manifest a
    single run writes (re-run after an interruption, it finishes the moves)."""
    output, settings_file = Path(cfg.output), Path(cfg.output) / SETTINGS_NAME
    if (not (output / parts.PARTS_DIR).is_dir() and (output / native.MANIFEST_NAME).is_file()
            and settings_file.is_file()
            and read_json_object(settings_file).get("fingerprint") == fingerprint):
        raise DataError(f"--merge: {output} is merged already (its manifest.json is complete); "
                        "nothing to do")
    with output_lock(output, "--output", "bertforge prepare"):
        found = parts.finished_parts(output, fingerprint)
        _claim_output(output, settings, fingerprint, cfg.overwrite, keep=parts.PARTS_DIR)
        sources.tokenizer.save(output / TOKENIZER_DIR)
        shards = _Shards(chunks=found[0][1]["chunks"])
        for folder, record in found:
            for index in record["indices"]:
                for split in _splits(cfg):
                    name = worker.shard_name(split, index, cfg.format)
                    parts.move_shard(folder / name, output / name)
                shards.results.append({"index": index, "splits": _finished_chunk(
                    output, _splits(cfg), index, cfg.format)})
        shards.results.sort(key=lambda r: r["index"])
        manifest = _write_manifest(cfg, settings, fingerprint, shards)
        shutil.rmtree(output / parts.PARTS_DIR)
    return _report(cfg, output, manifest, shards, sources.input_bytes, 0, started)


def _splits(cfg: PrepareConfig) -> list[str]:
    return ["train", "validation"] if cfg.validation_fraction > 0 else ["train"]


def _open_inputs(cfg: PrepareConfig) -> _Sources:
    """Stage 1, read: the input files (expanded, checked to exist) and the tokenizer."""
    from bertforge.data.corpus import expand_inputs, input_size

    files = expand_inputs(list(cfg.input))
    tokenizer = load_tokenizer(cfg.vocab)
    return _Sources(files, sum(input_size(f) for f in files), tokenizer)


def _settings(cfg: PrepareConfig, sources: _Sources) -> dict[str, Any]:
    """Everything the output depends on (its fingerprint decides whether a re-run resumes)."""
    from bertforge.data.corpus import input_key, input_size

    tokenizer, fmt = sources.tokenizer, cfg.format
    vocab_size = int(tokenizer.vocab_size)
    return {
        "format": native.FORMAT_NAME if fmt == "native" else native.HDF5_DIR_FORMAT,
        "format_version": native.FORMAT_VERSION,
        "output_format": fmt, "vocab_hash": tokenizer.vocab_hash, "vocab_size": vocab_size,
        "do_lower_case": bool(tokenizer.do_lower_case), "special_ids": _special_ids(tokenizer),
        "max_seq_length": cfg.max_seq_length, "objective": cfg.objective,
        "short_seq_prob": cfg.short_seq_prob, "masked_lm_prob": cfg.masked_lm_prob,
        "max_predictions": cfg.max_predictions,
        "whole_word_masking": bool(cfg.whole_word_masking),
        "dupe_factor": cfg.dupe_factor if fmt == "hdf5" else 1,
        "validation_fraction": cfg.validation_fraction, "seed": cfg.seed,
        "input_format": cfg.input_format, "text_field": cfg.text_field,
        "docs_per_shard": cfg.docs_per_shard, "chunk_bytes": cfg.chunk_bytes,
        "length_bin_width": cfg.length_bin_width,
        "token_dtype": native_writer.token_dtype(vocab_size).str,
        "inputs": [[input_key(f), input_size(f)] for f in sources.files],
    }


def _write_shards(cfg: PrepareConfig, sources: _Sources, settings: dict[str, Any], output: Path,
                  part: tuple[int, int] | None, *, progress: bool, say: Any) -> _Shards:
    """Stage 2, the chunks (``part``'s only, when given): each is segmented, tokenized, split,
    turned into instances and written as shards in ``output`` by a worker
    (``prepare_worker.process_chunk``); a chunk an earlier run finished is read back instead.
    Stopping keeps every finished shard."""
    splits = _splits(cfg)
    job = {**settings, "vocab_path": str(cfg.vocab), "splits": splits, "root": str(output)}
    shards = _Shards()
    from bertforge.data.corpus import known_size

    bar = _progress_bar(known_size(sources.files), progress)
    pool = _pool(cfg.workers, job, sources.tokenizer)
    stop: BaseException | None = None  # the KeyboardInterrupt or Stopped that ends the run early
    try:
        _run_chunks(cfg, sources, output, part, pool, bar, shards)
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
    return shards


def _run_chunks(cfg: PrepareConfig, sources: _Sources, output: Path, part: tuple[int, int] | None,
                pool: ProcessPoolExecutor | None, bar: Any, shards: _Shards) -> None:
    """Submit the chunks (``part``'s) in input order and harvest them in the same order, with
    at most 2 x workers in flight so memory stays flat."""
    splits = _splits(cfg)
    limit = 2 * cfg.workers if pool else 0
    pending: list[tuple[Future | None, dict[str, Any]]] = []
    for task in _chunks(sources.files, cfg.input_format, cfg.text_field, cfg.docs_per_shard,
                        cfg.chunk_bytes, shards.warnings, shards.skipped):
        shards.chunks += 1
        if not parts.mine(task["index"], part):
            bar.update(task["bytes"])  # another part's: read, not built
            continue
        done = _finished_chunk(output, splits, task["index"], cfg.format)
        if done is not None:
            shards.resumed += 1
            task = {"index": task["index"], "bytes": task["bytes"], "splits": done}
        future = None
        if pool and done is None:
            with starting_workers():  # a submit may start a worker process
                future = pool.submit(worker.process_chunk, task)
        pending.append((future, task))
        # Harvest in input order; finished (resumed) chunks at the front go straight through.
        while pending and (len(pending) > limit or "splits" in pending[0][1]):
            shards.results.append(_harvest(*pending.pop(0), bar))
    while pending:
        shards.results.append(_harvest(*pending.pop(0), bar))


def _write_manifest(cfg: PrepareConfig, settings: dict[str, Any], fingerprint: str,
                    shards: _Shards) -> dict[str, Any]:
    """Stage 3: the manifest, written last (its presence marks a finished output)."""
    _require_chunks(cfg, shards)
    manifest = _build_manifest(cfg, settings, fingerprint, shards)
    inputs, totals = ", ".join(cfg.input), manifest["counts"]
    if totals["instances"] == 0:
        raise DataError(
            f"{totals['documents']} document(s) read from {inputs} but no instance could be "
            "built: documents need at least two tokens of text (check --input-format; with "
            "'sentences' a blank line ends a document)")
    native_writer.write_manifest(Path(cfg.output), manifest)
    return manifest


def _require_chunks(cfg: PrepareConfig, shards: _Shards) -> None:
    """``DataError`` when the inputs held no document at all."""
    if not shards.chunks:
        raise DataError(f"no documents found in {', '.join(cfg.input)} (input format "
                        f"{cfg.input_format!r}); check --input and --input-format"
                        + "".join(f"; skipped {s}" for s in shards.skipped[:5]))


def _build_manifest(cfg: PrepareConfig, settings: dict[str, Any], fingerprint: str,
                    shards: _Shards) -> dict[str, Any]:
    shard_names = {r["index"]: {s: worker.shard_name(s, r["index"], cfg.format)
                                for s in _splits(cfg)} for r in shards.results}
    return native_writer.build_manifest(settings, fingerprint, shards.results, shard_names,
                                        TOKENIZER_DIR)


def _special_ids(tok: Any) -> dict[str, int]:
    # Every tokenizer class refuses a vocabulary without all five, so every id exists here.
    return {name: int(getattr(tok, f"{name}_id")) for name in ("pad", "unk", "cls", "sep", "mask")}


def _claim_output(output: Path, settings: dict, fingerprint: str, overwrite: bool,
                  keep: str = "") -> None:
    """Create ``output``, or check that it holds an earlier run with the very same settings
    (``keep``: a name prepare may find there besides its own: the parts being merged)."""
    settings_file = output / SETTINGS_NAME
    if settings_file.is_file():
        try:
            old = read_json_object(settings_file).get("fingerprint")
        except DataError:  # damaged: not this run's settings, so treated as other settings
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
    elif any(p.name not in (LOCK_NAME, keep) for p in output.iterdir()):
        # Never delete what prepare did not write, even with --overwrite.
        raise DataError(f"--output {output}: directory is not empty and was not written by "
                        "`bertforge prepare`; choose a new or empty --output")
    for split in ("train", "validation"):
        (output / split).mkdir(parents=True, exist_ok=True)
    if not settings_file.is_file():
        write_json_atomic(settings_file, {"fingerprint": fingerprint, "settings": settings})
    native_writer.remove_temp_files(output, ["train", "validation"])


def _chunks(files: list[Any], input_format: str, text_field: str, docs_per_shard: int,
            chunk_bytes: int, warnings: list[str], skipped: list[str]) -> Iterator[dict[str, Any]]:
    """Documents of all files, in order, grouped into tasks ``{index, docs, bytes}``.

    A chunk closes after ``docs_per_shard`` documents or ``chunk_bytes`` characters of text
    (a property of the input alone); ``bytes`` is the on-disk input it consumed, for progress.
    """
    from bertforge.data.corpus import ReadStats, input_size, iter_documents

    docs: list = []
    text, index, files_done, reported = 0, 0, 0, 0
    for path in files:
        def warn(message: str, path: Any = path) -> None:
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
        files_done += input_size(path)
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
    # The pool's queues start multiprocessing's resource tracker: a process of ours too, which
    # would die of a SIGUSR1 sent to the group (it ignores only SIGINT and SIGTERM) and be
    # relaunched with tracebacks; it inherits the blocked signals instead.
    with starting_workers():
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


def _progress_bar(total: int | None, enabled: bool) -> Any:
    from bertforge.core.progress import progress_bar

    bar = progress_bar(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare",
                       disable=not enabled, smoothing=0.1, dynamic_ncols=True)
    bar.seen = {}  # running totals shown after the byte rate
    return bar
