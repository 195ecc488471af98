"""Two-rank runs shared by the DDP and FSDP tests: the run arguments, torchrun, and the
comparisons (weights and metrics lines agree to ~1e-5 relative between layouts)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

STEPS = 4
COMPARED = ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "grad_norm", "lr", "skipped_steps")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_args(tiny, tiny_args, out: Path, *extra: str) -> list[str]:
    return tiny_args(out, f"--model={tiny.model_nodrop}", f"--train.max_steps={STEPS}",
                     "--checkpoint.every=2", *extra)


def torchrun(args: list[str], env: dict[str, str], cwd: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           "-m", "bertforge.cli", "pretrain", *args]
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def assert_weights_close(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=1e-5, atol=1e-6, msg=name)


def assert_lines_close(got: list[dict], want: list[dict]) -> None:
    got = [r for r in got if "loss" in r]
    want = [r for r in want if "loss" in r]
    assert [r["step"] for r in got] == [r["step"] for r in want] and got
    for g, w in zip(got, want):
        for key in (k for k in COMPARED if k in w):  # (an MLM-only run has no nsp_loss)
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), (g["step"], key)
