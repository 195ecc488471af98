"""benchmarks/gpu_check.sh --dry-run: every stage of the one-call GPU check runs on the CPU with
tiny shapes (a few minutes on 2 cores), so the script that gets one shot on a GPU is known to
work step by step. Results go to a temporary folder, never into benchmarks/results/."""

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
STAGES = ["setup", "env", "pytest", "data", "pretrain", "finetune", "bart", "serve", "onnx",
          "fp16", "bench-phase1", "bench-phase2", "runner"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_passes_every_stage(tmp_path: Path) -> None:
    """Every stage in one call, the opt-in suite stage (what ``--suite`` runs as a second call
    on a GPU: the suite's fine-tuning, inference, BART and ModernBERT entries on a seeded random
    BERT body) included, so set-up, environment and data are built once for both."""
    out, results = tmp_path / "out", tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "",
           "BERTFORGE_GPU_CHECK_RESULTS": str(results)}
    env.pop("OUT", None)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out),
                           "--results-dir", str(results), "--only", ",".join(STAGES + ["suite"])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "expected wall time on one H100" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == STAGES + ["suite"]
    assert {s["stage"]: s["status"] for s in summary["stages"]} == {
        s: "ok" for s in STAGES + ["suite"]}
    assert summary["ok"] and summary["finished"] and summary["dry_run"]
    assert summary["commit"] and summary["date"] and summary["device"]

    # The files that come back from a GPU machine: at most 8, flat in --out.
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "summary.md", "env.json", "pretrain-bench-phase1.json",
            "pretrain-bench-phase2.json", "runner-benchmark.json", "suite-summary.md",
            "logs.tar.gz"} == names
    runner = json.loads((out / "runner-benchmark.json").read_text())
    assert "host_syncs_per_step" in runner
    # the runner also ran eagerly (the dry run's is eager both times: the ratio is about 1)
    head = json.loads(next(results.glob("gpu-check-*/runner.json")).read_text())["headline"]
    assert head["eager_sequences_per_s"] > 0 and head["compiled_over_eager"] > 0
    fp16 = json.loads(next(results.glob("gpu-check-*/fp16.json")).read_text())
    assert fp16["headline"]["fp16"]["loss_scale_max"] > 0
    suite = json.loads(next(results.glob("gpu-check-*/suite.json")).read_text())
    assert set(suite["entries"]) == {"finetune", "inference", "bart", "modernbert-small"}
    assert all(e["status"] == "ok" for e in suite["entries"].values())
    assert "## " in (out / "suite-summary.md").read_text()

    # Everything under the temporary folders: nothing written into the checkout.
    assert not list((ROOT / "benchmarks" / "results").glob("gpu-check-cpu-dry-run-*"))
