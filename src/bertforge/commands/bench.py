"""``bertforge bench inference``: sequences/s per core of a model directory's pipeline at batch
1 and saturated, p50 and p99 latency, for each precision and replica count, naming the CPU and
the instruction set each precision runs on (``bertforge.inference.bench`` measures)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from bertforge.commands.base import Command
from bertforge.core.limits import INFERENCE_PRECISIONS
from bertforge.core.numbers import ascii_int
from bertforge.core.schema import REQUIRED, check_fields, opt
from bertforge.errors import ConfigError


def precision_list(text: str) -> list[str]:
    """``fp32,bf16`` -> ["fp32", "bf16"] (the ``--precision`` flag)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    wrong = [n for n in names if n not in INFERENCE_PRECISIONS]
    if not names or wrong:
        raise argparse.ArgumentTypeError(f"expected comma-separated precisions from "
                                         f"{', '.join(INFERENCE_PRECISIONS)}, got {text}")
    return names


def replica_list(text: str) -> list[int]:
    """``1,2`` -> [1, 2] (the ``--replicas`` flag)."""
    counts = [ascii_int(s.strip()) for s in text.split(",") if s.strip()]
    if not counts or any(c is None or c < 1 for c in counts):
        raise argparse.ArgumentTypeError("expected comma-separated replica counts >= 1 written "
                                         f"with the digits 0-9, got {text}")
    return [c for c in counts if c is not None]


@dataclass
class BenchConfig:
    """``bertforge bench``."""

    what: str = opt(REQUIRED, "What to measure: inference (sequences/s per core of a model "
                    "directory's pipeline).", positional=True, choices=("inference",))
    model: str = opt(REQUIRED, "A model directory.")
    task: Optional[str] = opt(None, "The pipeline's task (default: the model's own; "
                              "feature-extraction for a sentence-transformers directory).")
    precision: Optional[List[str]] = opt(
        None, "Precisions to measure, comma-separated: fp32, bf16, int8, fp16, or auto (what "
        "auto picks, named in the report). Default: fp32, and bf16 and int8 where this CPU has "
        "their units.", parse=precision_list, metavar="P1,P2,...")
    seq_length: int = opt(128, "Tokens per sequence: English text cut to this length.",
                          minimum=3)
    batch_size: int = opt(32, "Sequences per call when saturated.", minimum=1)
    cores: Optional[int] = opt(None, "Cores to use: the first N this process may run on "
                               "(default: all of them); each replica gets an equal share, "
                               "with one torch thread per core.", minimum=1)
    replicas: List[int] = opt(help="Replica counts to measure, comma-separated (1,2: one "
                              "process on all the cores, then two on half each, at once).",
                              factory=lambda: [1], parse=replica_list, metavar="R1,R2,...")
    seconds: float = opt(3.0, "Timed seconds per phase (batch 1, saturated) of each cell.",
                         minimum=0.0)
    iterations: Optional[int] = opt(None, "Timed calls per phase instead of --seconds.",
                                    minimum=1)
    warmup: int = opt(3, "Untimed calls before each phase.", minimum=0)
    output: Optional[str] = opt(None, "Write the report here as JSON.")

    def __post_init__(self) -> None:
        check_fields(self)
        for name in self.precision or ():
            if name not in INFERENCE_PRECISIONS:
                raise ConfigError(f"precision {name!r} is not one of "
                                  f"{', '.join(INFERENCE_PRECISIONS)}")
        if not self.replicas or min(self.replicas) < 1:
            raise ConfigError(f"replicas must be counts >= 1, got {list(self.replicas)}")


def _precisions(asked: list[str] | None, units: Any) -> tuple[list[str], list[dict]]:
    """The precisions to measure and, by default, those left out with why."""
    if asked:
        return list(dict.fromkeys(asked)), []
    names, skipped = ["fp32"], []
    for name, unit in (("bf16", units.bf16), ("int8", units.int8)):
        if unit:
            names.append(name)
        else:
            skipped.append({"precision": name, "reason": f"no {name} unit on "
                            f"{units.describe()}; --precision {name} measures it emulated"})
    return names, skipped


def _plan(cores: list[int], replicas: int) -> list[list[int]]:
    """``replicas`` disjoint equal shares of ``cores``, as a server's replicas get them
    (``runtime.cpu.split_cores``); a remainder stays idle, so that every replica's per-core
    rate is measured on as many cores."""
    from bertforge.runtime.cpu import split_cores

    used = len(cores) // replicas * replicas
    return split_cores(cores[:used] if used else cores, replicas)


def _cores(asked: int | None) -> list[int]:
    from bertforge.runtime.cpu import core_ids

    usable = core_ids()
    if asked is not None and asked > len(usable):
        raise ConfigError(f"--cores {asked}: this process may run on {len(usable)} cores "
                          f"({', '.join(map(str, usable))})")
    return usable[:asked] if asked else usable


def _unit(name: str, units: Any) -> str:
    """The instruction set ``name`` runs on here."""
    import torch

    if name in ("bf16", "int8"):
        return getattr(units, name) or "none (emulated)"
    return torch.backends.cpu.get_cpu_capability()


def _command_line(cfg: BenchConfig) -> str:
    parts = ["bertforge bench inference", f"--model {cfg.model}"]
    for key in ("task", "precision", "seq_length", "batch_size", "cores", "replicas",
                "seconds", "iterations", "warmup"):
        value = getattr(cfg, key)
        if value is not None:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            parts.append(f"--{key.replace('_', '-')} {text}")
    return " ".join(parts)


def _machine(units: Any, cores: list[int]) -> dict[str, Any]:
    import torch

    from bertforge import __version__

    return {"cpu": units.name, "units": units.describe(), "bf16_unit": units.bf16,
            "int8_unit": units.int8, "emulated": units.emulated,
            "kernels": torch.backends.cpu.get_cpu_capability(), "cores_used": cores,
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "bertforge": __version__,
            "python": platform.python_version()}


def _cells(cfg: BenchConfig, settings: Any, names: list[str], cores: list[int],
           units: Any) -> list[dict]:
    """Each precision (loaded once here, its choice settled) at each replica count."""
    from bertforge.inference.bench import load, measure_here, run_replicas, summarize

    plans = {r: _plan(cores, r) for r in cfg.replicas}  # refused before any loading
    rows = []
    for asked in names:
        pipe = load(settings, asked)
        choice = pipe.precision_choice
        for count in cfg.replicas:
            plan = plans[count]
            timings = ([measure_here(pipe, settings, plan[0])] if count == 1
                       else run_replicas(settings, choice.name, plan))
            used = sum(len(p) for p in plan)
            rows.append({"precision": choice.name, "asked": asked, "task": pipe.task,
                         "unit": _unit(choice.name, units), "choice": choice.summary(),
                         "agreement": choice.agreement, "replicas": count,
                         "cores_per_replica": len(plan[0]), "cores": used,
                         **summarize(timings, used)})
        del pipe  # one model in memory at a time
    return rows


def run_bench(cfg: BenchConfig) -> int:
    from bertforge.core.io import write_json_atomic
    from bertforge.inference.bench import BenchSettings
    from bertforge.models.loading import model_directory
    from bertforge.runtime.cpu import cpu_units

    model_dir = model_directory(cfg.model)
    task = cfg.task or ("feature-extraction" if (model_dir / "modules.json").is_file() else None)
    units, cores = cpu_units(), _cores(cfg.cores)
    names, skipped = _precisions(cfg.precision, units)
    settings = BenchSettings(str(model_dir), task, cfg.seq_length, cfg.batch_size, cfg.seconds,
                             cfg.iterations, cfg.warmup)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows = _cells(cfg, settings, names, cores, units)
    report = {
        "benchmark": "bench-inference", "command": _command_line(cfg),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(units, cores),
        "load_average": {"start": load_before,
                         "end": os.getloadavg() if hasattr(os, "getloadavg") else None},
        "model": str(model_dir), "task": rows[0]["task"] if rows else task,
        "seq_length": cfg.seq_length, "batch_size": cfg.batch_size,
        "measured": "pipeline.run on requests parsed before timing (padding, forward pass, "
                    "post-processing; no tokenization); per core = sequences/s / cores used",
        "skipped": skipped, "results": rows}
    print(format_report(report))
    if cfg.output:
        write_json_atomic(Path(cfg.output), report, sort_keys=False)
        print(f"wrote {cfg.output}")
    return 0


COLUMNS = ("precision", "unit", "replicas", "batch-1 seq/s/core", "p50 ms", "p99 ms",
           "saturated seq/s/core", "saturated seq/s", "agreement")


def _row(r: dict) -> list[str]:
    one, full = r["batch_1"], r["saturated"]
    name = r["precision"] if r["asked"] == r["precision"] else f"{r['asked']} -> {r['precision']}"
    agreement = "-" if r["agreement"] is None else f"{r['agreement']:.5f}"
    return [name, r["unit"], f"{r['replicas']} x {r['cores_per_replica']} cores",
            f"{one['seq_per_s_per_core']:.1f}", f"{one['p50_ms']:.2f}", f"{one['p99_ms']:.2f}",
            f"{full['seq_per_s_per_core']:.1f}", f"{full['seq_per_s']:.1f}", agreement]


def format_report(report: dict) -> str:
    """The report as people read it: the CPU, one table row per cell, then each precision's
    choice and the precisions left out."""
    machine, rows = report["machine"], report["results"]
    lines = [f"CPU: {machine['units']}, {len(machine['cores_used'])} cores used",
             (f"model: {report['model']} ({report['task']}, {report['seq_length']} tokens, "
              f"saturated batch {report['batch_size']})"),
             f"measured: {report['measured']}"]
    table = [list(COLUMNS)] + [_row(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines += [" | ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
              for line in table]
    seen = dict.fromkeys(f"{r['asked']}: {r['choice']}" for r in rows)
    lines += list(seen)
    lines += [f"{s['precision']} not measured: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines)


BENCH = Command("bench", "Measure a model's inference: sequences/s per core at batch 1 and "
                "saturated, p50/p99 latency, per precision and replica count.", BenchConfig,
                run_bench)

__all__ = ["BENCH", "BenchConfig", "format_report", "run_bench"]
