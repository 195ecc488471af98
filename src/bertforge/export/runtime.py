"""``OnnxModel``: an exported model run by onnxruntime, with the call signature of the PyTorch head.

Prediction and serving code calls a model as ``model(input_ids=..., attention_mask=...,
token_type_ids=...)`` and reads the fields of its output dataclass. ``OnnxModel`` keeps that
contract (same dataclass, torch tensors) and adds the few ``nn.Module`` members such code
touches (``config``, ``eval()``, ``to()``, ``training``), so a pipeline or the server takes it
in place of the PyTorch model without knowing the difference.

Supported heads: those of ``bertforge.export.heads.HEADS`` (BertModel, BertForMaskedLM,
BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from bertforge.errors import ConfigError
from bertforge.export.heads import INPUT_NAMES, HeadSpec, resolve_head

FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"


def ort_session(path: str | os.PathLike[str], *, providers: Sequence[str] | None = None,
                threads: int | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` (CPU unless ``providers`` says otherwise;
    ``threads`` caps intra-op threads, e.g. 1 on a shared machine)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=options,
                                providers=list(providers or ["CPUExecutionProvider"]))


def _numpy(value: torch.Tensor | np.ndarray | Sequence) -> np.ndarray:
    """A (B, S) int64 array from a tensor (any device), an array or nested lists."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(value, dtype=np.int64))


class OnnxModel:
    """An exported model directory (``bertforge export onnx`` output) run by onnxruntime.

    Args:
        path: the export directory, or one of its .onnx files.
        quantized: with a directory, run ``model.int8.onnx`` instead of ``model.onnx``.
        providers: onnxruntime execution providers, default ``["CPUExecutionProvider"]``.
        threads: intra-op thread count (onnxruntime's default: all cores).
    """

    def __init__(self, path: str | os.PathLike[str], *, quantized: bool = False,
                 providers: Sequence[str] | None = None, threads: int | None = None) -> None:
        path = Path(path)
        directory, file = (path, path / (INT8_FILE if quantized else FP32_FILE)) if path.is_dir() \
            else (path.parent, path)
        if not file.is_file():
            hint = " (export with --quantize int8)" if file.name == INT8_FILE else ""
            raise ConfigError(f"--model {path}: {file.name} not found in {directory}{hint}; give "
                              "a directory written by `bertforge export onnx`")
        self.spec: HeadSpec
        self.spec, self.config = resolve_head(directory)
        self.directory = directory
        self.path = file
        self.session = ort_session(file, providers=providers, threads=threads)
        names = [o.name for o in self.session.get_outputs()]
        if names != list(self.spec.outputs):
            raise ConfigError(f"{file} has outputs {names} but a {self.spec.architecture} export "
                              f"has {list(self.spec.outputs)}; export the model again")
        self.training = False
        self.device = torch.device("cpu")
        self.export_info: dict[str, Any] = {}
        """export.json of the directory ({} when absent): exporter, opset, parity numbers."""
        info = directory / "export.json"
        if info.is_file():
            self.export_info = json.loads(info.read_text(encoding="utf-8"))

    def __call__(self, input_ids: torch.Tensor | np.ndarray,
                 attention_mask: torch.Tensor | np.ndarray | None = None,
                 token_type_ids: torch.Tensor | np.ndarray | None = None,
                 masked_positions: torch.Tensor | None = None) -> Any:
        """(B, S) inputs -> the head's output dataclass holding CPU float32 tensors.

        Missing ``attention_mask`` means no padding, missing ``token_type_ids`` one segment, as in
        the PyTorch model. ``masked_positions`` ((B, S) bool, masked LM only) keeps the logits of
        those positions, (N, vocab), like ``BertForMaskedLM``.
        """
        ids = _numpy(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, sequence), got shape {ids.shape}")
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids) if attention_mask is None else _numpy(attention_mask),
            "token_type_ids": np.zeros_like(ids) if token_type_ids is None else _numpy(token_type_ids),
        }
        results = self.session.run(list(self.spec.outputs), {n: feeds[n] for n in INPUT_NAMES})
        fields = {name: torch.from_numpy(value) for name, value in zip(self.spec.outputs, results)}
        if masked_positions is not None:
            if self.spec.architecture != "BertForMaskedLM":
                raise ValueError("masked_positions applies to BertForMaskedLM exports only")
            fields["logits"] = fields["logits"][masked_positions.cpu()]
        return self.spec.output_type(**fields)

    forward = __call__

    def eval(self) -> OnnxModel:
        """No-op (an exported graph has no training mode); returns self like ``nn.Module.eval``."""
        return self

    def train(self, mode: bool = True) -> OnnxModel:
        """Only ``train(False)`` is meaningful: an exported graph cannot train."""
        if mode:
            raise ValueError("an ONNX model cannot be trained; use the PyTorch model directory")
        return self

    def to(self, *args: Any, **kwargs: Any) -> OnnxModel:
        """No-op: the device is chosen by ``providers`` when the session is built."""
        return self

    def __repr__(self) -> str:
        return f"OnnxModel({self.spec.architecture}, {self.path})"


__all__ = ["FP32_FILE", "INT8_FILE", "OnnxModel", "ort_session"]
