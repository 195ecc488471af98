"""Exporting fine-tuned models for runtimes without PyTorch: ONNX (fp32 and int8), an
onnxruntime-backed model object for serving, and a Triton Inference Server model repository."""

from bertforge.export.heads import EXPORTABLE, HEADS, HeadSpec
from bertforge.export.onnx import DEFAULT_ATOL, ExportReport, export_onnx
from bertforge.export.quantize import QuantizationReport
from bertforge.export.runtime import OnnxModel
from bertforge.export.triton import triton_config, write_triton_repository

__all__ = ["DEFAULT_ATOL", "EXPORTABLE", "HEADS", "ExportReport", "HeadSpec", "OnnxModel",
           "QuantizationReport", "export_onnx", "triton_config", "write_triton_repository"]
