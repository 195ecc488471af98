"""Inference precision chosen from the CPU's units and held to a quality guard.

``precision="auto"`` on a CPU tries, fastest first, the precisions its units run well
(``bertforge.runtime.cpu``): bf16 on AMX or AVX512-BF16, then int8 on AMX-INT8 or VNNI. Each
candidate answers a probe batch next to fp32 and is kept when every probe input's outputs (all
of the model's floating outputs at its real tokens: logits, start and end scores, token states)
have a cosine similarity of at least :data:`GUARD_COSINE` to fp32's. The first one kept runs;
without a unit, or when none holds, fp32 runs and the choice says why. On a GPU ``auto`` is bf16
where the GPU supports it (as in training), else fp32.

An explicit ``bf16`` or ``int8`` runs as asked; its probe agreement is still measured and
reported, with a warning when it misses the guard or when the CPU lacks the unit (then the
precision is emulated, and slower than fp32).

How each precision is applied: bf16 runs under autocast with the linear weights stored in bf16
(``ops.linear.cast_linears``); int8 replaces the linear layers by int8 ones
(``ops.linear.quantize_linears``: weights per output channel, inputs per call), with attention,
softmax, LayerNorm and the residual stream in fp32.

The pipelines probe with fixed texts (``inference.pipelines.numerics``), a fine-tuning run's
evaluation with the first batch of its own evaluation data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bertforge.errors import ConfigError
from bertforge.ops.linear import cast_linears, quantize_linears
from bertforge.runtime.cpu import CpuUnits, cpu_units
from bertforge.runtime.precision import Precision, build_precision, resolve

log = logging.getLogger("bertforge.precision")

GUARD_COSINE = 0.999
"""The lowest cosine similarity to fp32's outputs a probe input may have for ``auto`` to keep
a precision (MiniLM's bf16 sentence vectors, at 0.99999, found the same top paragraph as fp32's
for 99.6% of SQuAD questions; its int8 ones, at 0.994, for 95.1%: docs/precision.md)."""


@dataclass(frozen=True)
class PrecisionChoice:
    """What a pipeline runs in and why."""

    name: str                  # fp32 | bf16 | int8 | fp16
    asked: str                 # what was asked for (auto, or one of the above)
    reason: str
    agreement: float | None = None
    """The lowest probe cosine to fp32 of the precision that runs (None: fp32, or a GPU)."""

    def summary(self) -> str:
        """One line: ``precision bf16 (auto: ...)``."""
        return f"precision {self.name} ({self.asked}: {self.reason})"


def _tensors(output: Any) -> list[torch.Tensor]:
    """The floating tensors of a model output (a tensor, a dataclass or a tuple of them, or
    an encoder's output object: its padded final states)."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if is_dataclass(output):
        output = [getattr(output, f.name) for f in fields(output)]
    elif hasattr(output, "last_hidden_state"):  # an encoder's output (packed or padded)
        output = [output.last_hidden_state]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    return []


def probe_vectors(output: Any, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per probe input, its outputs flattened into one fp32 vector: every floating output
    tensor with a batch dimension, at the input's real tokens where it has a token dimension
    (the padding's values are no answer). ``mask``: the (B, S) attention mask."""
    batch, width = mask.shape
    rows: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    for tensor in _tensors(output):
        if tensor.dim() == 0 or tensor.shape[0] != batch:
            continue
        for i in range(batch):
            row = tensor[i]
            if row.dim() >= 1 and row.shape[0] == width:
                row = row[mask[i].bool()]
            rows[i].append(row.float().flatten())
    return [torch.cat(parts) for parts in rows]


def agreement(reference: Sequence[torch.Tensor], candidate: Sequence[torch.Tensor]) -> float:
    """The lowest cosine similarity between matching vectors of the two runs."""
    return min(float(torch.nn.functional.cosine_similarity(a, b, dim=0))
               for a, b in zip(reference, candidate))


@dataclass(frozen=True)
class Probe:
    """A batch the candidates answer: the model's keyword inputs and their (B, S) mask."""

    inputs: dict[str, torch.Tensor]
    mask: torch.Tensor


SEQUENCE_PROBE_ROWS = 8
"""Sources in a token-sequence probe (generation, summarization evaluation)."""
SEQUENCE_PROBE_TOKENS = 128
"""Tokens kept of each probe source: (rows, tokens, vocabulary) logits stay small."""


def sequence_probe(sources: Sequence[np.ndarray], pad_id: int, device: torch.device) -> Probe:
    """The longest :data:`SEQUENCE_PROBE_ROWS` token-id ``sources``, each cut to
    :data:`SEQUENCE_PROBE_TOKENS` and padded with ``pad_id``: (B, S) ``input_ids`` and
    ``attention_mask``. An encoder-decoder decodes each source shifted by one, so its logits
    cover every kept token."""
    longest = np.argsort([-len(s) for s in sources], kind="stable")[:SEQUENCE_PROBE_ROWS]
    rows = [np.asarray(sources[i][:SEQUENCE_PROBE_TOKENS], dtype=np.int64) for i in longest]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.from_numpy(row)
        mask[i, :len(row)] = 1
    return Probe({"input_ids": ids.to(device), "attention_mask": mask.to(device)}, mask)


def _run(model: nn.Module, probe: Probe, precision: Precision) -> list[torch.Tensor]:
    with torch.inference_mode(), precision.autocast():
        return probe_vectors(model(**probe.inputs), probe.mask.cpu())


class _Trial:
    """Measures candidates against fp32 on one model. A measured int8 leaves its int8 layers in
    place until :meth:`restore`: kept, it needs no second quantization (``apply_precision``
    then finds no fp32 linear layer left to swap)."""

    def __init__(self, model: nn.Module, probe: Probe, device: torch.device,
                 units: CpuUnits) -> None:
        self.model, self.probe, self.device, self.units = model, probe, device, units
        self.reference = _run(model, probe, build_precision("fp32", device))
        self._swaps: list[tuple[nn.Module, str, nn.Module]] = []  # of a measured int8

    def measure(self, name: str) -> float:
        """The probe agreement of ``name``; bf16 under autocast alone (its weights cast later
        round to the same values), int8 with the layers swapped in (and back if it fails)."""
        if name != "int8":
            return agreement(self.reference,
                             _run(self.model, self.probe, build_precision(name, self.device)))
        self._swaps = quantize_linears(self.model, reduce_range=self.units.int8 is None)
        try:
            return agreement(self.reference,
                             _run(self.model, self.probe, build_precision("fp32", self.device)))
        except BaseException:
            self.restore()
            raise

    def restore(self) -> None:
        """The fp32 layers back in place of a measured int8's (nothing when none is in)."""
        for parent, attribute, original in self._swaps:
            setattr(parent, attribute, original)
        self._swaps = []


def candidates(units: CpuUnits) -> tuple[list[str], str]:
    """The precisions ``auto`` tries on a CPU with ``units``, fastest first, and what they
    rest on (the reason given when there is none)."""
    names = (["bf16"] if units.bf16 else []) + (["int8"] if units.int8 else [])
    if not names:
        return [], f"no bf16 or int8 units on {units.describe()}"
    found = ", ".join(f"{n} on {u}" for n, u in (("bf16", units.bf16), ("int8", units.int8)) if u)
    return names, f"{found} ({units.name})"


def _asked_on_cpu(trial: _Trial, asked: str, units: CpuUnits) -> PrecisionChoice:
    """An explicit bf16, int8 or fp16 on a CPU: as asked, with its agreement and warnings."""
    score = trial.measure(asked)
    unit = units.bf16 if asked == "bf16" else units.int8 if asked == "int8" else None
    if unit is None:
        log.warning("precision %s on %s: this CPU has no %s unit, so it is emulated and "
                    "likely slower than fp32", asked, units.describe(), asked)
    if score < GUARD_COSINE:
        log.warning("precision %s: the probe's outputs reach a cosine of %.5f to fp32's, "
                    "under the %.3f that auto asks for", asked, score, GUARD_COSINE)
    return PrecisionChoice(asked, asked, f"as asked; probe cosine to fp32 {score:.5f}", score)


def _choose_on_cpu(model: nn.Module, probe: Probe | None, asked: str, units: CpuUnits
                   ) -> PrecisionChoice:
    if asked == "fp32":
        return PrecisionChoice("fp32", asked, "as asked")
    if probe is None:
        name = "fp32" if asked == "auto" else asked
        return PrecisionChoice(name, asked, "no probe for the quality guard" + (
            "" if asked == "auto" else "; not measured"))
    trial = _Trial(model, probe, torch.device("cpu"), units)
    if asked != "auto":
        return _asked_on_cpu(trial, asked, units)
    names, found = candidates(units)
    if not names:
        return PrecisionChoice("fp32", asked, found)
    missed = []
    for name in names:
        score = trial.measure(name)
        if score >= GUARD_COSINE:
            return PrecisionChoice(name, asked, f"{found}; probe cosine to fp32 {score:.5f} >= "
                                   f"{GUARD_COSINE}", score)
        missed.append(f"{name} reached {score:.5f}")
        trial.restore()
    return PrecisionChoice("fp32", asked, f"{found}, but {' and '.join(missed)}, under the "
                           f"{GUARD_COSINE} probe cosine to fp32 the guard asks for")


def apply_precision(model: nn.Module, name: str, device: torch.device, *,
                    seq2seq: bool = False, units: CpuUnits | None = None) -> Precision:
    """Make ``model`` (built in fp32) run in ``name`` from here on; the :class:`Precision`
    whose ``autocast`` its forward passes take. int8 inputs keep 7 bits on a CPU without an
    int8 unit (``units``, default this machine's; ``ops.linear.Int8Linear``)."""
    if name == "int8":
        quantize_linears(model, reduce_range=(units or cpu_units()).int8 is None)
    elif name in ("bf16", "fp16") and not seq2seq:
        # encoder-decoders keep fp32 weights under autocast, as their pipelines always have
        cast_linears(model, torch.bfloat16 if name == "bf16" else torch.float16)
    return build_precision(name, device)


def choose_precision(model: nn.Module, device: torch.device, asked: str, probe: Probe | None, *,
                     seq2seq: bool = False, units: CpuUnits | None = None, where: str = ""
                     ) -> tuple[PrecisionChoice, Precision]:
    """Choose the precision for ``asked`` (``auto``, ``fp32``, ``bf16``, ``int8``, ``fp16``),
    apply it to ``model`` (built in fp32, in eval mode) and say which it is (logged at INFO,
    prefixed by ``where``). ``probe`` None (a task whose inputs are not one batch of model
    inputs): on a CPU ``auto`` runs fp32 and an explicit precision runs unmeasured. ``units``:
    the CPU's (default :func:`bertforge.runtime.cpu.cpu_units`)."""
    if device.type != "cpu":
        if asked == "int8":
            raise ConfigError("precision int8 is a CPU path (dynamically quantized linear "
                              "layers); on a GPU use bf16 or fp16")
        name = resolve(asked, device)
        choice = PrecisionChoice(name, asked, "GPU" + (" with bf16" if name == "bf16" else ""))
    else:
        units = units or cpu_units()
        choice = _choose_on_cpu(model, probe, asked, units)
    precision = apply_precision(model, choice.name, device, seq2seq=seq2seq, units=units)
    log.info("%s%s", f"{where}: " if where else "", choice.summary())
    return choice, precision


__all__ = ["GUARD_COSINE", "PrecisionChoice", "Probe", "SEQUENCE_PROBE_ROWS",
           "SEQUENCE_PROBE_TOKENS", "agreement", "apply_precision", "candidates",
           "choose_precision", "probe_vectors", "sequence_probe"]
