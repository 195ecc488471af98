"""The worker side of ``bertforge prepare``: one chunk of documents -> one shard per split.

A worker process is set up once (:func:`init_worker`: job settings, the tokenizer, and a watch
that ends the worker when the main process is gone), then runs :func:`process_chunk` for each
chunk the main process hands it: segmentation, tokenization, validation assignment, instance
creation and the shard write (objective ``denoise`` stores sentence boundaries with the tokens).
Every random choice comes from an RNG seeded by ``(seed, chunk index, purpose)``, so a chunk's
shards are the same byte for byte whichever process builds them and however many there are.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data import native, native_writer
from bertforge.data.instances import Instance, create_instances
from bertforge.errors import DataError, UserError
from bertforge.core.signals import ignore_stop_signals

HDF5_SUFFIX = ".hdf5"
PARENT_POLL_S = 0.5  # how soon a pool worker notices that the main process is gone

_JOB: dict[str, Any] = {}  # per process: the job settings and the loaded tokenizer


def load_tokenizer(vocab: str | Path) -> Any:
    """The tokenizer for ``--vocab`` (WordPiece or byte-level BPE); ``DataError`` when it is
    missing or unusable."""
    from bertforge.tokenization import load_tokenizer as load_any

    path = Path(vocab)
    if not path.exists():
        raise DataError(f"--vocab {path}: no such file; give a vocab.txt, a tokenizer.json or a "
                        "tokenizer/model directory (make one with `bertforge vocab`)")
    try:
        return load_any(path)
    except UserError:
        raise
    except Exception as e:  # the tokenizers library raises plain exceptions for bad files
        raise DataError(f"--vocab {path}: cannot be read as a vocabulary ({e}); expected "
                        "vocab.txt (one token per line), a tokenizer.json, or a directory with "
                        "vocab.json + merges.txt") from e


def shard_name(split: str, index: int, fmt: str) -> str:
    """Relative path of chunk ``index``'s shard of ``split`` for output format ``fmt``."""
    suffix = native.SHARD_SUFFIX if fmt == "native" else HDF5_SUFFIX
    return native_writer.shard_name(split, index, suffix)


def init_worker(job: dict[str, Any], parent_pid: int | None, tokenizer: Any = None) -> None:
    """Load the job (settings from ``prepare`` plus ``vocab_path``) into this process.

    ``parent_pid``: for a pool worker, the pid of the ``prepare`` process, which the worker
    outlives by at most ``PARENT_POLL_S``; None when chunks run in that process itself.
    ``tokenizer``: the one ``prepare`` already loaded, when chunks run in its own process.
    """
    if parent_pid is not None:
        # N worker processes each running a tokenizer thread pool would oversubscribe the cores.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Ctrl-C reaches every process of the terminal, and `timeout` or a batch scheduler may
        # signal the whole process group: the main process decides what stops, and lets the
        # running chunks finish. (The pool starts workers with these signals blocked.)
        ignore_stop_signals()
        _exit_with_parent(parent_pid)
    _JOB.clear()
    _JOB.update(job, tokenizer=tokenizer or load_tokenizer(job["vocab_path"]))


def _exit_with_parent(parent_pid: int) -> None:
    """End this process soon after ``parent_pid`` is gone, however it ended.

    A main process killed with SIGKILL (or by the OOM killer) cannot stop its workers, which would
    otherwise wait for work forever, holding their memory; polling needs nothing from it. An
    orphan is adopted by another process, so ``getppid()`` changes, also if the main process died
    before this ran.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        # Nobody is left to read an exit status; a half-written shard is only a temporary file,
        # which the next run removes.
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _chunk_rng(seed: int, index: int, purpose: str) -> random.Random:
    """An RNG that depends only on (seed, chunk, purpose), never on the process or worker count."""
    digest = hashlib.sha256(f"{seed}/{index}/{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


def process_chunk(task: dict[str, Any]) -> dict[str, Any]:
    """Segment, tokenize, split, build instances and write this chunk's shard for each split.

    ``task`` is ``{"index", "docs", "bytes"}``; returns ``{"index", "bytes", "splits": {split:
    stats}}`` with the stats also stored in each shard (so a resumed run can read them back).
    """
    from bertforge.data.corpus import document_sentences

    job, index = _JOB, task["index"]
    sentences = [document_sentences(d) for d in task["docs"]]
    # A tokenizer whose words change with a space before them (ModernBERT's byte-level BPE
    # without a prefix space) sees each sentence after a document's first as running text does.
    joiner = getattr(job["tokenizer"], "sentence_joiner", "")
    flat = [joiner + s if k else s for doc in sentences for k, s in enumerate(doc)]
    ids = job["tokenizer"].encode_batch(flat, add_special_tokens=False) if flat else []
    split_rng = _chunk_rng(job["seed"], index, "split")
    by_split: dict[str, list[list[list[int]]]] = {s: [] for s in job["splits"]}
    pos = 0
    for doc in sentences:
        # One draw per document, empty or not, so the assignment of a document is stable.
        held_out = split_rng.random() < job["validation_fraction"]
        encoded = [list(x) for x in ids[pos : pos + len(doc)] if len(x)]
        pos += len(doc)
        by_split["validation" if held_out else "train"].append(encoded)
    out: dict[str, Any] = {"index": index, "bytes": task["bytes"], "splits": {}}
    # Validation first, train last: a chunk counts as finished once all its shards exist.
    for split in sorted(job["splits"], reverse=True):
        out["splits"][split] = _write_split(job, index, split, by_split[split])
    return out


def _write_split(job: dict[str, Any], index: int, split: str, docs: list[list[list[int]]]) -> dict:
    """Instances of one split of one chunk (``dupe_factor`` passes), shuffled and written."""
    rng = _chunk_rng(job["seed"], index, split)
    sp = job["special_ids"]
    instances: list[Instance] = []
    for _ in range(job["dupe_factor"]):  # 1 for native: masks vary per epoch at load time
        instances += create_instances(
            docs, rng, max_seq_length=job["max_seq_length"], short_seq_prob=job["short_seq_prob"],
            objective=job["objective"], cls_id=sp["cls"], sep_id=sp["sep"])
    rng.shuffle(instances)
    lengths = np.array([len(x.tokens) for x in instances], dtype=np.int64)
    stats = {
        "documents": sum(1 for d in docs if d), "skipped_documents": sum(1 for d in docs if not d),
        "sentences": sum(len(d) for d in docs), "instances": len(instances),
        "tokens": int(lengths.sum()),
        "length_histogram": native_writer.length_histogram(lengths, job["length_bin_width"]),
    }
    path = Path(job["root"]) / shard_name(split, index, job["output_format"])
    if job["output_format"] == "native":
        # denoise shards hold sentence tensors even when empty, so every shard of a split agrees.
        native_writer.write_shard(path, instances, vocab_size=job["vocab_size"],
                                  bin_width=job["length_bin_width"], stats=stats,
                                  sentences=job["objective"] == "denoise")
    else:
        _write_hdf5(path, instances, job, rng, stats)
    return stats


def _write_hdf5(path: Path, instances: list[Instance], job: dict, rng: random.Random,
                stats: dict) -> None:
    """Static-masked hdf5 shard, with the chunk's stats as a file attribute (for resuming)."""
    from bertforge.data.hdf5 import write_hdf5_shard

    sp = job["special_ids"]
    write_hdf5_shard(
        path, instances, max_seq_length=job["max_seq_length"],
        max_predictions=job["max_predictions"], masked_lm_prob=job["masked_lm_prob"],
        whole_word_masking=job["whole_word_masking"],
        is_continuation=job["tokenizer"].is_continuation, mask_id=sp["mask"],
        special_ids=sorted(set(sp.values())), vocab_size=job["vocab_size"],
        rng=np.random.default_rng(rng.getrandbits(64)),
        attrs={"bertforge_stats": json.dumps(stats, sort_keys=True)})


__all__ = ["HDF5_SUFFIX", "init_worker", "load_tokenizer", "process_chunk", "shard_name"]
