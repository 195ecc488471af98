"""``bertforge prepare`` on one machine against ``--part I/N`` on N machines plus ``--merge``.

    python benchmarks/prepare_parts_bench.py                    # 32 MB of text, 2 parts, 3 rounds
    python benchmarks/prepare_parts_bench.py --mb 4 --rounds 1  # a quick check
    python benchmarks/prepare_parts_bench.py --form parquet     # the same text as Parquet shards

Each round prepares the same corpus (``prepare_bench.sample_corpus``: the standard library's
docstrings, re-ordered per copy, in ~8 MB files; ``--form parquet`` writes the same documents
as Parquet shards of 2,000 rows a row group) twice, each run as `bertforge prepare` in its own
process with one worker: once whole (``single``), and as ``--parts`` processes started
together, ``--part I/N`` each, as N machines of one core would run them, followed by
``--merge``. This machine's cores stand in for the machines, so N is at most its core count.
Reported: seconds and input MB/s of each, the parts' slowest and fastest, the merge, and the
speed-up ``single / (slowest part + merge)`` per round (median over rounds); the merged output
must equal the single run's file for file (``identical``). Every part reads the whole input
(the cheap stage) and builds 1/N of the chunks; ``read_only_seconds`` times one reading pass
(``--part`` with N far above the chunk count builds nothing but reads everything), the part of
a part's time that does not shrink with N.
Results: ``benchmarks/results/prepare-parts-cpu-<date>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, write_result  # noqa: E402
from prepare_bench import default_vocab, sample_corpus  # noqa: E402

ROW_GROUP = 2_000


def parquet_corpus(files: list[Path], folder: Path) -> list[Path]:
    """The documents of ``files`` (blank-line separated) as Parquet, one file per text file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    out = []
    for f in files:
        docs = [d for d in f.read_text(encoding="utf-8").split("\n\n") if d.strip()]
        out.append(folder / (f.stem + ".parquet"))
        pq.write_table(pa.table({"text": docs}), out[-1], row_group_size=ROW_GROUP)
    return out


def bertforge(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-m", "bertforge.cli", "prepare", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(*procs: subprocess.Popen) -> None:
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise RuntimeError(f"prepare failed ({p.returncode}): {err.strip()[-500:]}")


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_round(common: list[str], work: Path, parts: int) -> dict:
    """Single run, then the parts together and the merge; outputs compared, then removed."""
    t0 = time.perf_counter()
    finish(bertforge(*common, "--output", str(work / "single")))
    single = time.perf_counter() - t0
    multi = work / "multi"
    t0, ends = time.perf_counter(), {}
    procs = [bertforge(*common, "--output", str(multi), "--part", f"{i}/{parts}")
             for i in range(parts)]
    while len(ends) < parts:
        for i, p in enumerate(procs):
            if i not in ends and p.poll() is not None:
                ends[i] = time.perf_counter() - t0
        time.sleep(0.01)
    finish(*procs)
    t1 = time.perf_counter()
    finish(bertforge(*common, "--output", str(multi), "--merge"))
    merge = time.perf_counter() - t1
    identical = digests(multi) == digests(work / "single")
    t0 = time.perf_counter()
    finish(bertforge(*common, "--output", str(work / "read"), "--part", "9999/10000"))
    read_only = time.perf_counter() - t0
    for name in ("single", "multi", "read"):
        shutil.rmtree(work / name)
    return {"single_seconds": single, "part_seconds": [ends[i] for i in range(parts)],
            "merge_seconds": merge, "read_only_seconds": read_only, "identical": identical,
            "speedup": single / (max(ends.values()) + merge)}


def summary(rounds: list[dict], mb: float, parts: int) -> dict:
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    slowest = statistics.median(max(r["part_seconds"]) for r in rounds)
    return {"single": {"seconds": round(med("single_seconds"), 2),
                       "input_mb_per_s": round(mb / med("single_seconds"), 2)},
            f"{parts}_parts": {"slowest_part_seconds": round(slowest, 2),
                               "merge_seconds": round(med("merge_seconds"), 2),
                               "input_mb_per_s": round(mb / (slowest + med("merge_seconds")), 2)},
            "read_only_seconds": round(med("read_only_seconds"), 2),
            "speedup": round(med("speedup"), 3),
            "speedup_per_round": [round(r["speedup"], 3) for r in rounds],
            "identical_every_round": all(r["identical"] for r in rounds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=32, help="Corpus size in MB of text.")
    ap.add_argument("--parts", type=int, default=2, help="Parts run together (<= cores).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--form", choices=("text", "parquet"), default="text")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", help="vocab.txt (default: MiniLM's, bert-base-uncased's vocab)")
    ap.add_argument("--output", help="Result JSON (default: results/prepare-parts-cpu-<date>).")
    args = ap.parse_args()
    if args.parts > (os.cpu_count() or 1):
        sys.exit(f"--parts {args.parts}: this machine has {os.cpu_count()} cores")
    meta = metadata(["pyarrow"])
    with tempfile.TemporaryDirectory(prefix="prepare-parts-") as tmp:
        work = Path(tmp)
        files = sample_corpus(work / "corpus", args.mb)
        if args.form == "parquet":
            files = parquet_corpus(files, work / "parquet")
        common = ["--input", *map(str, files), "--vocab", str(args.vocab or default_vocab()),
                  "--max-seq-length", str(args.seq), "--workers", "1"]
        rounds = []
        for r in range(args.rounds):
            rounds.append(one_round(common, work, args.parts))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in rounds[-1].items()), flush=True)
    result = {**meta, "benchmark": "prepare-parts", "corpus_mb": args.mb, "form": args.form,
              "parts": args.parts, "rounds": rounds, "load_average_1m_at_end":
              round(os.getloadavg()[0], 2), **summary(rounds, args.mb, args.parts)}
    print({k: result[k] for k in ("single", f"{args.parts}_parts", "read_only_seconds",
                                  "speedup", "identical_every_round")})
    write_result(result_path(f"prepare-parts-{args.form}-cpu", args.output), result)


if __name__ == "__main__":
    run_cli(main)
