"""benchmarks/gpu_check.sh --dry-run: every stage of the one-call GPU check runs on the CPU with
tiny shapes (a few minutes on 2 cores), so the script that gets one shot on a GPU is known to
work step by step. Results go to a temporary folder, never into benchmarks/results/. The stages
that run the benchmark scripts take minutes more and are a ``long`` test (run them before a GPU
run: ``BERTFORGE_LONG_TESTS=1``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STAGES = ["setup", "data", "pretrain", "finetune", "serve", "onnx", "env", "pytest", "bart", "fp16",
          "bench-phase1", "bench-phase2", "runner", "suite"]  # the plan's order
# The stages that run the benchmark scripts (compiled variants, the suite's entries): minutes on
# a CPU, so `make test` leaves them to the ``long`` test below.
BENCH_STAGES = ["bench-phase1", "bench-phase2", "suite"]


def dry_run(tmp_path: Path, stages: list[str]) -> tuple[Path, Path, str]:
    """``gpu_check.sh --dry-run --only STAGES`` into temporary folders: (out, results, stdout)."""
    out, results = tmp_path / "out", tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "",
           "BERTFORGE_GPU_CHECK_RESULTS": str(results)}
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out),
                           "--results-dir", str(results), "--only", ",".join(stages)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "expected wall time on one H100" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == stages
    assert {s["stage"]: s["status"] for s in summary["stages"]} == {s: "ok" for s in stages}
    assert summary["ok"] and summary["finished"] and summary["dry_run"]
    assert summary["commit"] and summary["date"] and summary["device"]
    # Everything under the temporary folders: nothing written into the checkout.
    assert not list((ROOT / "benchmarks" / "results").glob("gpu-check-cpu-dry-run-*"))
    return out, results, proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_passes_every_stage(tmp_path: Path) -> None:
    """Every stage but the benchmark scripts' in one call (those: the ``long`` test below), the
    smoke stages in their two lanes side by side."""
    stages = [s for s in STAGES if s not in BENCH_STAGES]
    out, results, _ = dry_run(tmp_path, stages)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["wall_seconds"] < summary["total_seconds"]  # the lanes overlapped
    # The files that come back from a GPU machine: at most 8, flat in --out.
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "summary.md", "env.json", "runner-benchmark.json",
            "logs.tar.gz"} == names
    runner = json.loads((out / "runner-benchmark.json").read_text())
    assert "host_syncs_per_step" in runner
    # the runner also ran eagerly (the dry run's is eager both times: the ratio is about 1)
    head = json.loads(next(results.glob("gpu-check-*/runner.json")).read_text())["headline"]
    assert head["eager_sequences_per_s"] > 0 and head["compiled_over_eager"] > 0
    fp16 = json.loads(next(results.glob("gpu-check-*/fp16.json")).read_text())
    assert fp16["headline"]["fp16"]["loss_scale_max"] > 0


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_of_the_benchmark_stages(tmp_path: Path) -> None:
    """The benchmark stages and the suite stage (the suite's fine-tuning, inference, BART and
    ModernBERT entries on a seeded random BERT body), in one call after set-up, data and
    environment. Run it before a GPU run:
    ``BERTFORGE_LONG_TESTS=1 pytest tests/integration/test_gpu_check.py``."""
    out, results, _ = dry_run(tmp_path, ["setup", "data", "env", *BENCH_STAGES])
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "summary.md", "env.json", "pretrain-bench-phase1.json",
            "pretrain-bench-phase2.json", "suite-summary.md", "logs.tar.gz"} == names
    suite = json.loads(next(results.glob("gpu-check-*/suite.json")).read_text())
    assert set(suite["entries"]) == {"finetune", "inference", "bart", "modernbert-small"}
    assert all(e["status"] == "ok" for e in suite["entries"].values())
    assert "## " in (out / "suite-summary.md").read_text()
