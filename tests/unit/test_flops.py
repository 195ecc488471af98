"""MFU's denominator: the peak FLOP/s looked up from the name CUDA reports for a GPU."""

from __future__ import annotations

import pytest

from bertforge.train.flops import peak_for_name


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989),      # SXM
    ("NVIDIA H100 PCIe", "bf16", 756),
    ("NVIDIA H100 NVL", "bf16", 835),
    ("NVIDIA H100 NVL", "fp32", 417.5),
    ("NVIDIA H200", "bf16", 989),
    ("NVIDIA H200 NVL", "fp16", 835),
    ("NVIDIA GH200 480GB", "bf16", 989),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312),
    ("NVIDIA A100 80GB PCIe", "fp32", 156),
    ("NVIDIA A10", "bf16", 125),
    ("NVIDIA L40S", "bf16", 362),
    ("NVIDIA L40", "bf16", 181),
    ("NVIDIA L4", "bf16", 121),
    ("Tesla V100-SXM2-32GB", "fp16", 125),
    ("Tesla V100-PCIE-16GB", "fp16", 112),
])
def test_each_form_of_a_chip_has_its_own_peak(name, precision, tflops) -> None:
    assert peak_for_name(name, precision) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name, precision", [
    ("Tesla V100-SXM2-32GB", "bf16"),   # no bf16 tensor cores
    ("NVIDIA GeForce RTX 4090", "bf16"),  # not in the table: MFU is not computed
    ("NVIDIA A1000", "bf16"),             # a name that merely contains "A100"
])
def test_unknown_peaks_are_none(name, precision) -> None:
    assert peak_for_name(name, precision) is None
