"""Shared pieces of the benchmark scripts: run metadata, memory sampling, result files.

Every result file says where and when it was measured (CPU model, cores, RAM, date, git commit,
library versions), so numbers from different machines or commits are never compared by mistake.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(tree: Path | None = None) -> str:
    """``git rev-parse HEAD`` of the checkout ``tree`` (default: the one holding this script),
    "-dirty" when tracked files changed; "uncommitted" if none."""
    tree = Path(__file__).resolve().parent if tree is None else tree
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=tree, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "uncommitted"
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return "uncommitted"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=tree)
    return commit + ("-dirty" if dirty.stdout.strip() else "")


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return getattr(mod, "__version__", None)


def metadata(extra_libraries: Sequence[str] = ()) -> dict[str, Any]:
    """Machine, date, commit and library versions for the top of a result file."""
    import psutil

    libs = ["torch", "tokenizers", "datasets", "transformers", *extra_libraries]
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "ram_gb": round(psutil.virtual_memory().total / 1e9, 1),
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),
            "os": platform.platform(),
        },
        "commit": git_commit(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in dict.fromkeys(libs)},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def result_path(kind: str, output: str | None) -> Path:
    """``output`` if given, else benchmarks/results/<kind>-<YYYY-MM-DD>.json."""
    if output:
        return Path(output)
    return RESULTS_DIR / f"{kind}-{datetime.date.today().isoformat()}.json"


def write_result(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def training_clock() -> tuple[Any, dict[str, float]]:
    """A transformers ``TrainerCallback`` and the dict it fills with ``begin`` and ``end``
    (``time.perf_counter``, the GPU synchronized at the end): the Trainer's training time, from
    ``on_train_begin`` to ``on_train_end``."""
    import torch
    import transformers

    clock: dict[str, float] = {}

    class Clock(transformers.TrainerCallback):
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            clock["begin"] = time.perf_counter()

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            clock["end"] = time.perf_counter()

    return Clock(), clock


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median plus min/max and the relative half-range, our stated noise of one figure."""
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return {"median": med, "min": lo, "max": hi,
            "noise_pct": 100.0 * (hi - lo) / (2 * med) if med else 0.0}


class TreeMemory:
    """Peak memory of one process and all its descendants, sampled every ``interval`` seconds.

    ``peak_rss`` sums resident set sizes: pages shared between processes (fork copy-on-write,
    shared libraries, memory-mapped files) are counted once per process, so it over-states a
    multi-process tree. ``peak_pss`` sums proportional set sizes (shared pages divided among
    their users), the fairer figure for trees; it is read from /proc/PID/smaps_rollup, which
    costs more, so it is sampled every ``pss_every`` RSS samples. ``peak_anon`` sums RSS minus
    its file-backed and shared part: the private heap, which memory-mapped files (Arrow caches)
    do not inflate and which the kernel cannot simply drop under memory pressure.
    """

    def __init__(self, pid: int, interval: float = 0.05, pss_every: int = 4) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval, self.pss_every = interval, pss_every
        self.peak_rss = self.peak_pss = self.peak_anon = 0
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree(self) -> list:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except Exception:  # the root has exited
            return []

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            procs = self._tree()
            rss = pss = anon = 0
            for p in procs:
                try:  # a child may exit between listing and reading
                    info = p.memory_info()
                    rss += info.rss
                    anon += info.rss - getattr(info, "shared", 0)  # `shared`: Linux only
                    if tick % self.pss_every == 0:
                        pss += p.memory_full_info().pss
                except Exception:
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_anon = max(self.peak_anon, anon)
            self.max_processes = max(self.max_processes, len(procs))
            tick += 1
            time.sleep(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_cli(main: Any) -> None:
    """Run a benchmark's ``main``; a mistake in the command line is one line and status 2."""
    from bertforge.errors import UserError

    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
