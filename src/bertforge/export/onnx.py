"""``bertforge export onnx``: a BERT or ModernBERT task model as an ONNX graph, checked against
PyTorch.

The output directory is self-contained for runtimes without PyTorch: ``model.onnx`` (inputs
the family's: ``input_ids``/``attention_mask``, plus ``token_type_ids`` for BERT, (batch,
sequence) int64, both axes dynamic; outputs named after the head's fields, see ``bertforge.export.heads``), ``config.json`` (labels,
task), the tokenizer files, ``generation_config.json`` / ``config.yaml`` and a
sentence-transformers model's pooling and length files when the model has them, optionally ``model.int8.onnx`` and a Triton model repository, and ``export.json``
recording the exporter, opset, versions, parity and quantization numbers.

Exporter: ``torch.onnx.export(dynamo=True)`` (torch.export) is tried first; when it cannot run
(it needs the ``onnxscript`` package) or fails on the model, the TorchScript tracer exports it
instead, and export.json says which ran and why. The tracer records one path through Python
control flow; our encoder branches on whether the batch has padding, so it is traced with a
padded batch, whose path (an explicit attention mask) is also correct for unpadded input.
ModernBERT is exported in its ``traceable`` mode (``bertforge.models.modernbert``): padded rows
with the local layers' band mask built on every call, with no shortcut that tests the length
against the sliding window, so the graph is right for sequences shorter and longer than it.

Parity bound: every export runs PyTorch and onnxruntime (CPUExecutionProvider) on the same
padded batches (``bertforge.export.inputs``) and fails when any output differs by more than
``atol`` (default 1e-4) anywhere: fp32 kernels of the two runtimes differ by float rounding
only (typically ~1e-6 for BERT-base logits), so 1e-4 passes every correct export and catches a
wrong graph (a baked-in shape or mask) by orders of magnitude. A failed export leaves nothing
at the output path: the directory is built under a hidden temporary name and renamed when done.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from bertforge.errors import ConfigError, RunError
from bertforge.export.heads import SEQUENCE, HeadSpec, resolve_head
from bertforge.export.inputs import (Batch, EncodedSample, encode_sample, read_sample,
                                     synthetic_batches, trimmed)
from bertforge.export.quantize import QuantizationReport, compare_int8, quantize_int8
from bertforge.export.runtime import FP32_FILE, INT8_FILE, ort_session, require_onnx
from bertforge.export.sentence_transformers import copy_sentence_transformers_files
from bertforge.core.io import (fsync_dir, output_lock, temp_name, write_bytes_atomic,
                               write_json_atomic)

DEFAULT_ATOL = 1e-4
"""Largest max-abs difference between PyTorch and onnxruntime fp32 outputs an export may show."""
EXPORTERS = ("auto", "dynamo", "torchscript")
_COPIED = ("config.json", "generation_config.json", "config.yaml")
"""Files copied as they are from the model directory when present."""
_SAMPLE_PARITY_ROWS = 4


class _TupleOutputs(nn.Module):
    """The model with its output dataclass flattened to a tuple in ``spec.outputs`` order
    (exporters take tensors and tuples, not dataclasses)."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...],
                 inputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.outputs, self.inputs = model, outputs, inputs

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        # The family's inputs (HeadSpec.inputs) in the order of its model's forward; a family
        # without token types is called with two.
        extra = () if token_type_ids is None else (token_type_ids,)
        out = self.model(input_ids, attention_mask, *extra)
        return tuple(getattr(out, name) for name in self.outputs)


def _traceable(model: nn.Module) -> nn.Module:
    """``model`` with every submodule that has an export mode (``traceable``) switched to it."""
    for module in model.modules():
        if hasattr(module, "traceable"):
            module.traceable = True
    return model


@dataclass
class ExportReport:
    """What ``export_onnx`` wrote and measured."""

    output_dir: Path
    architecture: str
    exporter: str
    """"dynamo" or "torchscript"."""
    exporter_note: str | None
    """Why the dynamo exporter was not used, when it was not."""
    opset: int
    atol: float
    parity: dict[str, float]
    """Largest |PyTorch - onnxruntime| per output over all parity batches."""
    parity_batches: list[tuple[int, int]]
    """(batch size, sequence length) of each parity batch."""
    quantization: QuantizationReport | None = None
    triton_dir: Path | None = None
    files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """A few lines for the end of ``bertforge export onnx``."""
        worst = ", ".join(f"{k} {v:.2e}" for k, v in self.parity.items())
        lines = [f"exported {self.architecture} to {self.output_dir / FP32_FILE} "
                 f"({self.exporter} exporter, opset {self.opset})",
                 f"  parity vs PyTorch on {len(self.parity_batches)} batches "
                 f"(bound {self.atol:g}): max |diff| {worst}"]
        if self.exporter_note:
            lines.append(f"  note: {self.exporter_note}")
        if self.quantization is not None:
            lines.append(f"  {self.quantization.summary()}")
        if self.triton_dir is not None:
            # triton_dir is the model's folder; the repository (and its README) one level up.
            lines.append(f"  Triton model repository: {self.triton_dir.parent} (model "
                         f"{self.triton_dir.name}; see {self.triton_dir.parent / 'README.md'})")
        return "\n".join(lines)


def _export_dynamo(wrapper: nn.Module, example: tuple[torch.Tensor, ...], path: Path,
                   opset: int, max_len: int) -> None:
    from torch.export import Dim

    names = wrapper.inputs
    batch, seq = Dim("batch"), Dim("sequence", max=max_len)
    torch.onnx.export(wrapper, example, str(path), dynamo=True, opset_version=opset,
                      input_names=list(names), output_names=list(wrapper.outputs),
                      dynamic_shapes={n: {0: batch, 1: seq} for n in names},
                      external_data=False)


def _export_torchscript(wrapper: nn.Module, example: tuple[torch.Tensor, ...], path: Path,
                        opset: int, output_dims: dict[str, tuple[int, ...]]) -> None:
    names = wrapper.inputs
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    for name, dims in output_dims.items():
        axes[name] = {0: "batch", **{i + 1: "sequence" for i, d in enumerate(dims) if d == SEQUENCE}}
    with warnings.catch_warnings():
        # The tracer warns about the Python branches it records once (see the module docstring);
        # the parity check, on other shapes and paddings, is the proof that the trace is general.
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, example, str(path), dynamo=False, opset_version=opset,
                          input_names=list(names), output_names=list(wrapper.outputs),
                          dynamic_axes=axes, do_constant_folding=True)


def _torch_outputs(wrapper: nn.Module, batch: Batch, names: tuple[str, ...]) -> list[np.ndarray]:
    with torch.no_grad():
        out = wrapper(*(torch.from_numpy(batch[n]) for n in names))
    return [t.float().numpy() for t in out]


def parity(wrapper: nn.Module, session: Any, spec: HeadSpec, batches: list[Batch]) -> dict[str, float]:
    """Largest |PyTorch - onnxruntime| per output over ``batches`` (all positions compared)."""
    worst = dict.fromkeys(spec.outputs, 0.0)
    for batch in batches:
        ours = _torch_outputs(wrapper, batch, spec.inputs)
        theirs = session.run(list(spec.outputs), {n: batch[n] for n in spec.inputs})
        for name, a, b in zip(spec.outputs, ours, theirs):
            if a.shape != b.shape:
                raise RunError(f"onnxruntime output {name} has shape {b.shape}, PyTorch "
                               f"{a.shape}, on a batch of shape {batch['input_ids'].shape}")
            worst[name] = max(worst[name], float(np.abs(a - b).max(initial=0.0)))
    return worst


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def _export(wrapper: nn.Module, spec: HeadSpec, example: tuple[torch.Tensor, ...], path: Path,
            opset: int, exporter: str, check: Callable[[], dict[str, float]],
            atol: float) -> tuple[str, str | None, dict[str, float]]:
    """Export with the chosen exporter and run ``check`` (parity numbers) on the result.

    "auto" keeps a dynamo export only when it passes the parity bound; when dynamo cannot run
    or its graph misses the bound, the TorchScript export replaces it. Returns (exporter used,
    why dynamo was not, parity numbers).
    """
    note = None
    if exporter in ("auto", "dynamo"):
        try:
            _export_dynamo(wrapper, example, path, opset, wrapper.model.config.max_position_embeddings)
            worst = check()
        except Exception as exc:  # any failure of the newer exporter: the tracer is the fallback
            if exporter == "dynamo":
                raise RunError(f"the dynamo ONNX exporter failed ({_first_line(exc)}); use the "
                               "TorchScript exporter instead") from exc
            note = f"dynamo exporter not used ({_first_line(exc)}); exported with TorchScript"
        else:
            if exporter == "dynamo" or all(v <= atol for v in worst.values()):
                return "dynamo", None, worst
            note = (f"the dynamo export missed the parity bound ({_numbers(worst)}); exported "
                    "with TorchScript")
        path.unlink(missing_ok=True)
    _export_torchscript(wrapper, example, path, opset, spec.output_dims(wrapper.model.config))
    return "torchscript", note, check()


def _numbers(worst: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in worst.items())


def _check_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConfigError(f"--output {output} already exists and is not empty; choose a new "
                          "directory or remove it")


def export_onnx(model_dir: str | os.PathLike[str], output_dir: str | os.PathLike[str], *,
                opset: int = 17, quantize: str | None = None,
                sample: str | os.PathLike[str] | None = None, triton: bool = False,
                atol: float = DEFAULT_ATOL, exporter: str = "auto",
                triton_max_batch_size: int = 64) -> ExportReport:
    """Export a BERT or ModernBERT model directory to ONNX in ``output_dir`` (layout in the module docstring).

    Args:
        model_dir: a model directory with config.json, weights and tokenizer files.
        output_dir: new (or empty) directory to create.
        opset: ONNX opset (14 or later: scaled-dot-product attention needs it).
        quantize: None, or "int8" to add ``model.int8.onnx`` and report its accuracy change.
        sample: text file (one example per line, tab between pair texts; QA
            ``question<TAB>context``) used for the parity check and the int8 comparison.
        triton: also write a Triton model repository under ``output_dir/triton``.
        atol: parity bound on the max abs difference of every output.
        exporter: "auto" (dynamo, falling back to TorchScript), "dynamo" or "torchscript".
        triton_max_batch_size: ``max_batch_size`` of the Triton config.

    Raises:
        UserError: the ``onnx`` or ``onnxruntime`` package is missing (``bertforge[onnx]``).
        ConfigError: bad arguments, not a model directory, an unsupported model.
        DataError: an unreadable sample or tokenizer.
        RunError: the exported graph disagrees with PyTorch beyond ``atol`` (numbers given).

    One export writes to ``output_dir`` at a time: a lock beside it (``.NAME.bertforge.lock``)
    makes a second one fail at once.
    """
    output = Path(output_dir)
    require_onnx("bertforge export onnx", "onnx", "onnxruntime")
    with output_lock(output, "--output", "bertforge export onnx", beside=True):
        return _export_locked(Path(model_dir), output, opset=opset, quantize=quantize,
                              sample=sample, triton=triton, atol=atol, exporter=exporter,
                              triton_max_batch_size=triton_max_batch_size)


def _export_locked(model_dir: Path, output: Path, *, opset: int, quantize: str | None,
                   sample: str | os.PathLike[str] | None, triton: bool, atol: float,
                   exporter: str, triton_max_batch_size: int) -> ExportReport:
    """:func:`export_onnx` under its output lock."""
    from bertforge.models.loading import load_model
    from bertforge.tokenization import EncoderTokenizer, load_tokenizer

    _check_arguments(quantize, opset, exporter, atol)
    spec, source = resolve_head(model_dir)
    model_dir = source.directory  # a Hub name's snapshot
    config = source.config
    _check_output(output)
    tokenizer = load_tokenizer(model_dir)
    if not isinstance(tokenizer, EncoderTokenizer):
        raise ConfigError(f"--model {model_dir} has a {type(tokenizer).__name__}, not an "
                          "encoder's tokenizer (WordPiece, or ModernBERT's BPE)")
    encoded: EncodedSample | None = None
    if sample is not None:
        qa = spec.task.name == "question-answering"
        encoded = encode_sample(read_sample(sample, needs_pairs=qa), tokenizer, config, qa,
                                spec.inputs)

    model = _traceable(load_model(source, spec.head))  # verified: every weight present, finite
    wrapper = _TupleOutputs(model, spec.outputs, spec.inputs).eval()
    batches = synthetic_batches(config, tokenizer.pad_id, names=spec.inputs)
    if encoded is not None:
        first = {k: v[:_SAMPLE_PARITY_ROWS] for k, v in encoded.inputs.items()}
        batches += [trimmed(first, slice(0, 1)), trimmed(first, slice(0, _SAMPLE_PARITY_ROWS))]
    example = tuple(torch.from_numpy(batches[1][n]) for n in spec.inputs)  # (3, S), padded rows

    output.parent.mkdir(parents=True, exist_ok=True)
    work = temp_name(output)
    work.mkdir()
    try:
        fp32_path = work / FP32_FILE

        def check() -> dict[str, float]:
            return parity(wrapper, ort_session(fp32_path), spec, batches)

        used, note, worst = _export(wrapper, spec, example, fp32_path, opset, exporter, check,
                                    atol)
        if not all(v <= atol for v in worst.values()):
            raise RunError(f"the exported ONNX model disagrees with PyTorch beyond the bound "
                           f"{atol:g} (max abs diff: {_numbers(worst)}); nothing was written to "
                           f"{output}. "
                           "Report this with the model's config.json")
        report = ExportReport(output_dir=output, architecture=spec.architecture, exporter=used,
                              exporter_note=note, opset=opset, atol=atol, parity=worst,
                              parity_batches=[tuple(b["input_ids"].shape) for b in batches])
        for name in _COPIED:
            if (model_dir / name).is_file():
                write_bytes_atomic(work / name, (model_dir / name).read_bytes())
        tokenizer.save(work)
        # An embedding model's pooling, normalization and input limit travel with it, so the
        # export answers with the vectors of the directory it came from.
        copy_sentence_transformers_files(model_dir, work)
        if quantize == "int8":
            int8_path = work / INT8_FILE
            quantize_int8(fp32_path, int8_path)
            measured = encoded if encoded is not None else EncodedSample(_stack(batches[2:]))
            source = (f"sample {sample} ({len(measured.inputs['input_ids'])} rows)" if encoded
                      is not None else f"synthetic ({len(measured.inputs['input_ids'])} rows)")
            report.quantization = compare_int8(ort_session(fp32_path), ort_session(int8_path),
                                               spec, measured, source, int8_path, fp32_path)
        if triton:
            from bertforge.export.triton import write_triton_repository

            repo = write_triton_repository(work / "triton", fp32_path, spec, config,
                                           name=_model_name(output),
                                           max_batch_size=triton_max_batch_size)
            report.triton_dir = output / "triton" / repo.name
        report.files = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
        write_json_atomic(work / "export.json", _export_json(report, spec, config, model_dir, sample))
        report.files.append("export.json")
        os.replace(work, output)  # an empty directory at `output` is replaced too
        fsync_dir(output.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return report


def _check_arguments(quantize: str | None, opset: int, exporter: str, atol: float) -> None:
    """ConfigError naming the first export setting that cannot work."""
    if quantize not in (None, "int8"):
        raise ConfigError(f"--quantize {quantize!r} is not supported; use int8 or leave it out")
    if opset < 14:
        raise ConfigError(f"--opset {opset} is too old; scaled-dot-product attention needs 14 or later")
    if exporter not in EXPORTERS:
        raise ConfigError(f"exporter {exporter!r} is not one of {', '.join(EXPORTERS)}")
    if not atol > 0:
        raise ConfigError(f"atol must be > 0, got {atol}")


def _stack(batches: list[Batch]) -> Batch:
    """Batches of one width stacked into one (N, S) set of rows."""
    return {n: np.concatenate([b[n] for b in batches]) for n in batches[0]}


def _model_name(output: Path) -> str:
    """A Triton model name from the output directory's name: letters, digits, '_' and '-'."""
    name = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in output.name)
    return name.strip("_") or "bert"


def _export_json(report: ExportReport, spec: HeadSpec, config: Any, model_dir: Path,
                 sample: Any) -> dict[str, Any]:
    import onnx
    import onnxruntime

    return {
        "format": 1,
        "source": str(model_dir),
        "architecture": report.architecture,
        "exporter": report.exporter,
        "exporter_note": report.exporter_note,
        "opset": report.opset,
        "inputs": {n: {"dtype": "int64", "shape": ["batch", "sequence"]} for n in spec.inputs},
        "outputs": {n: {"dtype": "float32", "shape": ["batch", *("sequence" if d == SEQUENCE else d
                                                                 for d in dims)]}
                    for n, dims in spec.output_dims(config).items()},
        "parity": {"atol": report.atol, "max_abs_diff": report.parity,
                   "batches": [list(s) for s in report.parity_batches],
                   "sample": str(sample) if sample is not None else None,
                   "runtime": "onnxruntime CPUExecutionProvider"},
        "quantization": report.quantization.to_json() if report.quantization else None,
        "triton": str(report.triton_dir.relative_to(report.output_dir)) if report.triton_dir else None,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                     "onnxruntime": onnxruntime.__version__},
        "files": report.files,
    }


__all__ = ["DEFAULT_ATOL", "EXPORTERS", "ExportReport", "export_onnx", "parity"]
