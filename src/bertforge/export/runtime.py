"""``OnnxModel``: an exported model run by onnxruntime, with the call signature of the PyTorch head.

Prediction and serving code calls a model as ``model(input_ids=..., attention_mask=...,
token_type_ids=...)`` and reads the fields of its output dataclass. ``OnnxModel`` keeps that
contract (same dataclass, torch tensors) and adds the few ``nn.Module`` members such code
touches (``config``, ``eval()``, ``to()``, ``training``), so a pipeline or the server takes it
in place of the PyTorch model without knowing the difference.

Supported heads: those of ``bertforge.export.heads.EXPORTABLE`` (BertModel, BertForMaskedLM,
BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification and the
ModernBERT classes of the same heads). Only the graph's inputs (its family's,
``HeadSpec.inputs``) are fed: ModernBERT takes no ``token_type_ids``, and any given are ignored.

Where it runs: :func:`execution_providers` turns a ``--device`` value into onnxruntime execution
providers, the one place that knows which device needs which provider and wheel. The model's
``device`` is then read back from the session, because onnxruntime silently drops the CUDA
provider when the CUDA libraries fail to load: a server must not say "cuda" while on the CPU.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from bertforge.core.jsonfile import read_json_object
from bertforge.errors import CheckpointError, ConfigError, UserError
from bertforge.export.heads import EXPORTABLE, HeadSpec, resolve_head
from bertforge.tasks.registry import SEQUENCE as SEQUENCE_AXIS

log = logging.getLogger(__name__)

FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

ONNX_EXTRA = "pip install 'bertforge[onnx]'"
"""How to install what the ONNX export and runtime need (the ``onnx`` extra)."""

Provider = Any
"""An onnxruntime provider: its name, or ``(name, options)`` such as a CUDA ``device_id``."""


def require_onnx(purpose: str, *modules: str) -> None:
    """``UserError`` naming the ``onnx`` extra unless every one of ``modules`` imports (the
    ``onnx`` and ``onnxruntime`` packages are optional: a base install lacks them)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"{purpose} needs the {name} package, which cannot be imported "
                            f"({reason}); install it with: {ONNX_EXTRA}") from None


def _parse_device(device: str | torch.device) -> torch.device | None:
    """``device`` as a torch device, None for "auto"; ``ConfigError`` unless onnxruntime can run
    there (cpu, cuda, cuda:N)."""
    if str(device) == "auto":
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {str(device)!r} is not one the ONNX backend runs on; use auto, "
                          "cpu, cuda or cuda:N")
    return parsed


def execution_providers(device: str | torch.device = "cpu") -> list[Provider]:
    """onnxruntime execution providers for ``device``, best first.

    ``cpu``: the CPU provider. ``cuda``/``cuda:N``: the CUDA provider (on GPU N), then the CPU
    provider for the nodes CUDA has no kernel for; a ``ConfigError`` when this onnxruntime has
    no CUDA provider (the plain ``onnxruntime`` wheel), since an explicit GPU request must not
    quietly run on the CPU. ``auto``: CUDA when torch sees a GPU and onnxruntime has the
    provider, else the CPU.
    """
    wanted = _parse_device(device)
    if wanted is not None and wanted.type == "cpu":
        return [CPU_PROVIDER]
    require_onnx("running an ONNX model", "onnxruntime")
    import onnxruntime as ort

    available = ort.get_available_providers()
    if wanted is None:
        use_cuda = CUDA_PROVIDER in available and torch.cuda.is_available()
        return [CUDA_PROVIDER, CPU_PROVIDER] if use_cuda else [CPU_PROVIDER]
    if CUDA_PROVIDER not in available:
        raise ConfigError(f"device {device} needs onnxruntime's {CUDA_PROVIDER}, which "
                          f"onnxruntime {ort.__version__} lacks (it has {', '.join(available)}); "
                          "pip uninstall onnxruntime && pip install onnxruntime-gpu, or use "
                          "--device cpu")
    cuda = CUDA_PROVIDER if wanted.index is None else (CUDA_PROVIDER,
                                                       {"device_id": wanted.index})
    return [cuda, CPU_PROVIDER]


def session_device(wanted: Sequence[Provider], session: Any) -> torch.device:
    """The device ``session`` really runs on: CUDA only if it kept the CUDA provider of
    ``wanted`` (onnxruntime drops it, with an error of its own, when the CUDA or cuDNN libraries
    fail to load), else the CPU, with a warning when CUDA was asked for."""
    kept = session.get_providers()
    for provider in wanted:
        name, options = (provider, {}) if isinstance(provider, str) else provider
        if name != CUDA_PROVIDER:
            continue
        if name in kept:
            index = options.get("device_id")
            return torch.device("cuda", int(index)) if index is not None else torch.device("cuda")
        log.warning("onnxruntime dropped %s (usually CUDA or cuDNN libraries that failed to "
                    "load; its own message above says which): running on the CPU and reporting "
                    "device cpu; providers in use: %s", CUDA_PROVIDER, ", ".join(kept))
    return torch.device("cpu")


def ort_session(path: str | os.PathLike[str], *, providers: Sequence[Provider] | None = None,
                threads: int | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``path`` (CPU unless ``providers`` says otherwise,
    see :func:`execution_providers`; ``threads`` caps intra-op threads, e.g. 1 on a shared
    machine)."""
    require_onnx("running an ONNX model", "onnxruntime")
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    chosen = list(providers) if providers is not None else execution_providers("cpu")
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=chosen)
    except Exception as exc:
        if not _is_load_failure(exc):
            raise
        reason = str(exc).split("failed:", 1)[-1].strip().splitlines()[0].rstrip(".")
        raise CheckpointError(f"{path} is not a model onnxruntime can load ({reason}): the file "
                              "is damaged or incomplete (e.g. cut short by a copy); export the "
                              "model again with `bertforge export onnx`") from None


def _is_load_failure(exc: Exception) -> bool:
    """Whether onnxruntime failed to read the model file itself (truncated or corrupt protobuf,
    an invalid graph), as opposed to a provider or device problem."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    kinds = (state.InvalidProtobuf, state.InvalidGraph, state.InvalidArgument, state.NoModel,
             state.Fail)
    return isinstance(exc, kinds) and "Load model from" in str(exc)


def check_output_shapes(session: Any, spec: HeadSpec, config: Any, file: Path,
                        config_file: Path) -> None:
    """``CheckpointError`` when a fixed size of the graph's outputs disagrees with config.json
    (a config.json edited to 3 labels beside a graph that scores 2 would otherwise serve 2
    scores under the first 2 of 3 names, silently)."""
    attributes = dict(spec.task.export.outputs)
    for output in session.get_outputs():
        shape = getattr(output, "shape", None)
        if output.name not in attributes or not isinstance(shape, (list, tuple)):
            continue
        for got, attribute in zip(shape[1:], attributes[output.name]):
            if attribute == SEQUENCE_AXIS or not isinstance(got, int):
                continue
            want = getattr(config, attribute)
            if got != want:
                raise CheckpointError(
                    f"{file} and {config_file} disagree: the graph's {output.name} has "
                    f"{attribute}={got} but config.json says {attribute}={want}; they come from "
                    "different models: export the model again with `bertforge export onnx` (or "
                    "restore the config.json of the exported model)")


def _masked_lm_names() -> str:
    """The masked-LM architectures that export ("BertForMaskedLM and ModernBertForMaskedLM")."""
    return " and ".join(n for n, s in EXPORTABLE.items() if s.head == "masked-lm")


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
        device: where to run: cpu (default), cuda, cuda:N or auto (see
            :func:`execution_providers`); ``self.device`` is where the session really runs.
        providers: onnxruntime execution providers, in place of those of ``device``.
        threads: intra-op thread count (onnxruntime's default: all cores).
    """

    def __init__(self, path: str | os.PathLike[str], *, quantized: bool = False,
                 device: str | torch.device = "cpu", providers: Sequence[Provider] | None = None,
                 threads: int | None = None) -> None:
        require_onnx("running an ONNX model (serve --backend onnx)", "onnxruntime")
        wanted = list(providers) if providers is not None else execution_providers(device)
        path = Path(path)
        directory, file = (path, path / (INT8_FILE if quantized else FP32_FILE)) if path.is_dir() \
            else (path.parent, path)
        if not file.is_file():
            hint = " (export with --quantize int8)" if file.name == INT8_FILE else ""
            raise ConfigError(f"--model {path}: {file.name} not found in {directory}{hint}; give "
                              "a directory written by `bertforge export onnx`")
        self.spec: HeadSpec
        self.spec, self.source = resolve_head(directory)
        """The head's signature; the directory's family and config (config.json read once)."""
        self._output_type = self.spec.output_type  # imported once, built for every call
        self.config = self.source.config
        self.directory = directory
        self.path = file
        self.session = ort_session(file, providers=wanted, threads=threads)
        names = [o.name for o in self.session.get_outputs()]
        if names != list(self.spec.outputs):
            raise ConfigError(f"{file} has outputs {names} but a {self.spec.architecture} export "
                              f"has {list(self.spec.outputs)}; export the model again")
        check_output_shapes(self.session, self.spec, self.config, file, directory / "config.json")
        self.training = False
        self.device = session_device(wanted, self.session)
        """Where the session runs (its providers decide; inputs are fed as numpy arrays and
        outputs come back as CPU tensors either way)."""
        self.export_info: dict[str, Any] = {}
        """export.json of the directory ({} when absent): exporter, opset, parity numbers."""
        info = directory / "export.json"
        if info.is_file():
            self.export_info = read_json_object(info, error=ConfigError,
                                                hint="export the model again")

    def __call__(self, input_ids: torch.Tensor | np.ndarray,
                 attention_mask: torch.Tensor | np.ndarray | None = None,
                 token_type_ids: torch.Tensor | np.ndarray | None = None,
                 masked_positions: torch.Tensor | None = None) -> Any:
        """(B, S) inputs -> the head's output dataclass holding CPU float32 tensors.

        Missing ``attention_mask`` means no padding, missing ``token_type_ids`` one segment, as in
        the PyTorch model; a family without token types (ModernBERT) ignores them. ``masked_positions`` ((B, S) bool, masked LM only) keeps the logits of
        those positions, (N, vocab), like ``BertForMaskedLM``.
        """
        ids = _numpy(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (batch, sequence), got shape {ids.shape}")
        given = {"attention_mask": (attention_mask, np.ones_like),
                 "token_type_ids": (token_type_ids, np.zeros_like)}
        feeds = {"input_ids": ids}
        for name in self.spec.inputs[1:]:  # the graph's inputs only (onnxruntime refuses others)
            value, default = given[name]
            feeds[name] = default(ids) if value is None else _numpy(value)
        results = self.session.run(list(self.spec.outputs), feeds)
        fields = {name: torch.from_numpy(value) for name, value in zip(self.spec.outputs, results)}
        if masked_positions is not None:
            if self.spec.head != "masked-lm":
                raise ValueError(f"masked_positions applies to {_masked_lm_names()} exports only")
            fields["logits"] = fields["logits"][masked_positions.cpu()]
        return self._output_type(**fields)

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
        """No-op: the device is chosen (``device``/``providers``) when the session is built."""
        return self

    def __repr__(self) -> str:
        return f"OnnxModel({self.spec.architecture}, {self.path}, {self.device})"


__all__ = ["CPU_PROVIDER", "CUDA_PROVIDER", "FP32_FILE", "INT8_FILE", "ONNX_EXTRA", "OnnxModel",
           "check_output_shapes", "execution_providers", "ort_session", "require_onnx",
           "session_device"]
