"""int8 dynamic quantization of an exported model, and what it costs in accuracy.

onnxruntime's dynamic quantization stores the weights of MatMul (and embedding Gather) nodes
as int8 and quantizes activations on the fly per batch, so it needs no calibration data; it
makes the file ~3-4x smaller and CPU inference faster (benchmarks/ measures by how much). It
changes the numbers, so the change is measured, not assumed: the fp32 and int8 graphs run on
the same inputs (the user's sample when given, else the synthetic batches) and the report gives

* per output, the largest absolute difference over real (non-padding) positions;
* for logits, how often the argmax (predicted class, token label, answer start or end) agrees;
* for hidden states, the smallest cosine similarity between fp32 and int8 vectors;
* for question answering on a sample, the answers themselves: how many are identical and the
  mean token F1 of the int8 answers against the fp32 ones, through the fine-tuning task's own
  post-processing (``postprocess_qa``) and SQuAD's F1 (``token_f1``).

These are agreement numbers between the two runtimes, not accuracy against gold labels: with
no labels in the sample, agreement with fp32 is what quantization can be judged by.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.export.heads import HeadSpec
from bertforge.export.inputs import Batch, EncodedSample, sample_batches

BATCH_SIZE = 8


@dataclass
class QuantizationReport:
    """What int8 quantization changed (see the module docstring for each number)."""

    path: Path
    size_bytes: int
    fp32_size_bytes: int
    inputs: str
    """"sample FILE (N rows)" or "synthetic (N rows)"."""
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    argmax_agreement: dict[str, float] = field(default_factory=dict)
    min_cosine: dict[str, float] = field(default_factory=dict)
    answer_agreement: float | None = None
    answer_f1: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path.name, "method": "onnxruntime.quantization.quantize_dynamic",
                "weight_type": "QInt8", "size_bytes": self.size_bytes,
                "fp32_size_bytes": self.fp32_size_bytes, "inputs": self.inputs,
                "max_abs_diff": self.max_abs_diff, "argmax_agreement": self.argmax_agreement,
                "min_cosine": self.min_cosine, "answer_agreement": self.answer_agreement,
                "answer_f1": self.answer_f1}

    def summary(self) -> str:
        """One line: file sizes and the agreement numbers."""
        parts = [f"int8 {self.path.name}: {self.size_bytes / 2**20:.1f} MiB "
                 f"(fp32 {self.fp32_size_bytes / 2**20:.1f} MiB), on {self.inputs}"]
        if self.answer_agreement is not None:
            parts.append(f"answers identical {self.answer_agreement:.1f}%, "
                         f"F1 vs fp32 {self.answer_f1:.1f}")
        parts += [f"{k} argmax agrees {v:.1f}%" for k, v in self.argmax_agreement.items()]
        parts += [f"{k} min cosine {v:.4f}" for k, v in self.min_cosine.items()]
        parts += [f"{k} max |diff| {v:.3g}" for k, v in self.max_abs_diff.items()]
        return "; ".join(parts)


class _DropPreprocessAdvice(logging.Filter):
    """Drops onnxruntime's advice to run its quantization pre-processing first: that step's
    symbolic shape inference cannot complete on our graphs (sequence-dependent shapes), and
    dynamic quantization needs no shapes, so the advice is noise on every export."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def quantize_int8(fp32_path: Path, int8_path: Path) -> None:
    """Write the int8 (QInt8 weights, dynamic activations) version of ``fp32_path``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root, advice = logging.getLogger(), _DropPreprocessAdvice()
    root.addFilter(advice)  # onnxruntime logs it through the root logger
    try:
        quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8)
    finally:
        root.removeFilter(advice)


def _run(session: Any, spec: HeadSpec, batch: Batch) -> dict[str, np.ndarray]:
    feeds = {n: batch[n] for n in spec.inputs}
    return dict(zip(spec.outputs, session.run(list(spec.outputs), feeds)))


def _positions(name: str, value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The real positions of an output: (N, last) rows for per-token outputs, all rows else."""
    if value.ndim == 3:          # (B, S, C): token rows at real positions
        return value[mask.astype(bool)]
    return value                 # (B, C) per sequence, or (B, S) QA logits over positions


def _argmax(name: str, value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    if name in ("start_logits", "end_logits"):  # (B, S): the answer position, padding excluded
        return np.where(mask.astype(bool), value, -np.inf).argmax(axis=1)
    return _positions(name, value, mask).argmax(axis=-1)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = (a * b).sum(axis=-1)
    return num / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


def compare_int8(fp32: Any, int8: Any, spec: HeadSpec, sample: EncodedSample, inputs: str,
                 path: Path, fp32_path: Path) -> QuantizationReport:
    """Run both sessions over ``sample`` and measure how far int8 moved (module docstring)."""
    from bertforge.data.finetuning.qa import postprocess_qa
    from bertforge.metrics.squad import token_f1

    report = QuantizationReport(path=path, size_bytes=path.stat().st_size,
                                fp32_size_bytes=fp32_path.stat().st_size, inputs=inputs)
    agree: dict[str, list[np.ndarray]] = {}
    cosines: dict[str, list[np.ndarray]] = {}
    full: dict[str, dict[str, list[np.ndarray]]] = {"fp32": {}, "int8": {}}
    width = sample.inputs["input_ids"].shape[1]
    for batch in sample_batches(sample.inputs, BATCH_SIZE):
        a, b = _run(fp32, spec, batch), _run(int8, spec, batch)
        mask = batch["attention_mask"]
        for name in spec.outputs:
            diff = np.abs(_positions(name, a[name], mask) - _positions(name, b[name], mask))
            if name in ("start_logits", "end_logits"):
                diff = diff[mask.astype(bool)]
            report.max_abs_diff[name] = max(report.max_abs_diff.get(name, 0.0),
                                            float(diff.max(initial=0.0)))
            if name.endswith("logits"):
                agree.setdefault(name, []).append(_argmax(name, a[name], mask) ==
                                                  _argmax(name, b[name], mask))
            else:
                cosines.setdefault(name, []).append(
                    _cosine(_positions(name, a[name], mask), _positions(name, b[name], mask)))
        if sample.features is not None:  # QA logits padded back to the window width
            for side, out in (("fp32", a), ("int8", b)):
                for name in spec.outputs:
                    pad = np.full((len(out[name]), width - out[name].shape[1]), -1e4, np.float32)
                    full[side].setdefault(name, []).append(np.concatenate([out[name], pad], 1))
    report.argmax_agreement = {k: 100.0 * float(np.concatenate(v).mean()) for k, v in agree.items()}
    report.min_cosine = {k: float(np.concatenate(v).min()) for k, v in cosines.items()}
    if sample.features is not None and sample.examples is not None:
        answers = {}
        for side in ("fp32", "int8"):
            start, end = (np.concatenate(full[side][n]) for n in ("start_logits", "end_logits"))
            answers[side] = postprocess_qa(sample.examples, sample.features, start, end,
                                           version_2=False).predictions
        ids = list(answers["fp32"])
        report.answer_agreement = 100.0 * float(np.mean(
            [answers["fp32"][i] == answers["int8"][i] for i in ids]))
        report.answer_f1 = 100.0 * float(np.mean(
            [token_f1(answers["int8"][i], answers["fp32"][i], version_2=True) for i in ids]))
    return report


__all__ = ["QuantizationReport", "compare_int8", "quantize_int8"]
