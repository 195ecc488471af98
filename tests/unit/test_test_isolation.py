"""The suite's own guarantee: a test not marked ``gpu`` runs on the CPU even on a GPU machine
(tests/conftest.py), so parity and bitwise-resume tests mean the same everywhere."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from bertforge.train.distributed import init_distributed


def test_unmarked_tests_and_their_children_see_no_gpu() -> None:
    assert torch.cuda.is_available() is False
    assert init_distributed().device == torch.device("cpu")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    child = subprocess.run([sys.executable, "-c", "import os; print(repr(os.environ.get("
                            "'CUDA_VISIBLE_DEVICES')))"], capture_output=True, text=True,
                           check=True)
    assert child.stdout.strip() == "''"


def test_loading_a_pipeline_leaves_matmul_precision_alone() -> None:
    """Building a precision for a GPU (what load_pipeline and every run do) must not switch the
    whole process to TF32: a later fp32 parity test would then compare TF32 numbers."""
    from bertforge.runtime.precision import build_precision

    before = torch.get_float32_matmul_precision()
    precision = build_precision("fp32", torch.device("cuda"))
    assert torch.get_float32_matmul_precision() == before
    with precision.scope():
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
