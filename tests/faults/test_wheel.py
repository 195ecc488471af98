"""The wheel works on its own: built from this tree, installed into a clean venv and run from a
directory outside the source tree, `bertforge --help` starts and `bertforge demo` (which reads a
packaged recipe) finishes. Guards against files the CLI reads at run time living outside the
package, which a source checkout or an editable install hides."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "src" / "bertforge" / "recipes"


def run(cmd: list[str | Path], cwd: Path, timeout: float, **env: str) -> str:
    """Run ``cmd`` with nothing of this interpreter's environment pointing into the source tree;
    return its stdout, or fail showing the end of what it printed."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env={**clean, **env}, timeout=timeout,
                          capture_output=True, text=True)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout[-4000:]}\n"
                                  f"--- stderr\n{proc.stderr[-4000:]}")
    return proc.stdout


def build_wheel(tmp: Path) -> Path:
    # Build from a copy of what a clean clone has: an in-tree build would write build/ and
    # *.egg-info into the shared checkout, and stale files there can end up in the wheel.
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist,
         tree], cwd=tmp, timeout=600)
    (wheel,) = dist.glob("bertforge-*.whl")
    return wheel


@pytest.mark.slow
def test_wheel_runs_from_a_clean_venv(tmp_path: Path) -> None:
    assert ROOT not in tmp_path.parents  # the commands below must not see src/ on their path
    wheel = build_wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    recipes = {f"bertforge/{p.relative_to(RECIPES.parent).as_posix()}"
               for p in RECIPES.rglob("*.yaml")}
    assert recipes and recipes <= shipped, f"missing from the wheel: {sorted(recipes - shipped)}"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp_path, timeout=300)
    python, bertforge = venv / "bin" / "python", venv / "bin" / "bertforge"
    # Torch first, pinned to the version running this test: the local CPU build. Left to the
    # wheel's "torch>=2.3", pip would fetch the newest CUDA build (several GB).
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    # --no-compile: no .pyc for the thousands of modules the commands below never import
    run([python, "-m", "pip", "install", "-q", "--no-compile", torch_pin], cwd=tmp_path,
        timeout=1200)
    run([python, "-m", "pip", "install", "-q", "--no-compile", wheel], cwd=tmp_path, timeout=1200)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert run([bertforge, "--help"], cwd=outside, timeout=300).startswith("usage: bertforge")
    assert "pretrain/bert-large-phase1" in run([bertforge, "pretrain", "--help"], cwd=outside,
                                               timeout=300)
    found = run([python, "-c", "import bertforge, sysconfig; print(bertforge.__file__); "
                 "print(sysconfig.get_paths()['purelib'])"], cwd=outside, timeout=300)
    module, site_packages = map(Path, found.splitlines())
    assert module.is_relative_to(site_packages) and site_packages.is_relative_to(venv)

    out = run([bertforge, "demo", "--workdir", tmp_path / "demo", "--steps", "3", "--bart-steps",
               "3"], cwd=outside,
              timeout=900, OMP_NUM_THREADS="1")
    assert "=== summary ===" in out
    assert re.search(r"^\s+steps\s+3$", out.split("=== summary ===")[1], re.MULTILINE)
