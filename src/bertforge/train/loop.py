"""The one train loop: pretraining, fine-tuning and BART differ only in what they plug in.

``train_step`` does forward, loss, backward over the accumulation micro-batches (DDP all-reduce
only on the last), unscale, non-finite guard, clip, optimizer and scheduler step.
``Trainer.fit`` reads top to bottom: loop -> step -> log / evaluate / checkpoint / preempt.
Host-device syncs: the loop itself reads one scalar per optimizer step (the non-finite guard),
agrees on preemption with one tiny all-reduce per step under DDP, and reads metrics only at log
intervals. The model adds per micro-batch: the padding check that lets unpadded batches use fused
attention, and the masked-position selection of the MLM head (its size depends on the data).

What the run tells its user (``RunLogger``, at the end of this module): progress bar, JSON-lines
metrics, TensorBoard, loss-curve PNG. Only rank 0 writes. A resumed run continues the same metrics file (and TensorBoard log) from its
starting step; lines beyond it are dropped. The history a run keeps is rewritten atomically (temp
file + rename) before anything is appended, and every new line is flushed as it is written, so a
kill at any moment loses at most the line being written. A damaged line (a partial write from a
full disk or a kill mid-line) is dropped with a warning naming it; it never blocks a run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from bertforge.data.batch import LossOutput, to_device
from bertforge.errors import DataError, TrainingDiverged
from bertforge.optim.lamb import clip_grad_norm_, global_grad_norm
from bertforge.core.io import (APPEND_FLAGS, check_in_place, json_text, open_in_place,
                               write_text_atomic)
from bertforge.core.progress import progress_bar
from bertforge.core.signals import ALL_STOP_SIGNALS
from bertforge.runtime.precision import Precision
from bertforge.train.distributed import DistInfo, all_reduce_mean, any_rank, no_sync

log = logging.getLogger(__name__)

# loss_fn(model, batch) -> LossOutput: the loss to backpropagate, per-micro-batch stats that the
# loop averages over micro-steps and ranks (e.g. "mlm_loss", "mlm_acc"), and what to count.
LossFn = Callable[[nn.Module, dict], LossOutput]


class Scheduler(Protocol):
    def step(self) -> None: ...
    def get_last_lr(self) -> list[float]: ...


@dataclass
class StepResult:
    stats: dict[str, torch.Tensor]  # averaged over micro-steps (this rank)
    grad_norm: torch.Tensor         # before clipping
    skipped: bool                   # non-finite gradients: the weights were not touched
    sequences: int = 0              # trained on in this step (this rank), as the loss counts
    tokens: torch.Tensor | int = 0


def train_step(model: nn.Module, micro_batches: Sequence[dict] | MicroBatches, loss_fn: LossFn,
               optimizer: torch.optim.Optimizer, scheduler: Scheduler, precision: Precision,
               params: list[torch.Tensor], clip_norm: float = 0.0) -> StepResult:
    """One optimizer step over ``len(micro_batches)`` accumulation micro-steps (a list of
    batches on the model's device, or a :class:`MicroBatches` that fetches each when needed).

    Each micro-loss is divided by the number of micro-steps, so the gradient is the mean over
    micro-batches; DDP then averages over ranks. One process with k micro-steps and k ranks with
    one each therefore compute the same gradient. ``clip_norm`` > 0 clips here (AdamW); LAMB clips
    inside its own step.
    """
    k = len(micro_batches)
    stats: dict[str, torch.Tensor] = {}
    sequences, tokens = 0, 0
    for i, batch in enumerate(micro_batches):
        with no_sync(model, sync=i == k - 1), precision.autocast():
            out = loss_fn(model, batch)
        loss = out.loss / k
        if precision.scaler is not None:
            loss = precision.scaler.scale(loss)
        loss.backward()
        for name, value in out.stats.items():
            stats[name] = stats.get(name, 0.0) + value.detach().float() / k
        sequences, tokens = sequences + out.sequences, tokens + out.tokens

    if precision.scaler is not None:
        precision.scaler.unscale_(optimizer)
    if clip_norm > 0:
        grad_norm = clip_grad_norm_(params, clip_norm)
    else:
        grad_norm = global_grad_norm([p.grad for p in params if p.grad is not None])
    finite = bool(torch.isfinite(grad_norm))  # the loop's one sync per step: never step on inf/nan
    # LAMB needs the same global norm for its clipping: hand it over instead of recomputing it.
    kwargs = {"grad_norm": grad_norm} if getattr(optimizer, "clips_gradients", False) else {}
    if precision.scaler is not None:
        # The scaler re-checks for inf (found during unscale_) and skips the step itself.
        precision.scaler.step(optimizer, **kwargs)
        precision.scaler.update()
    elif finite:
        optimizer.step(**kwargs)
    with warnings.catch_warnings():
        # A skipped first step (fp16 overflow) makes torch warn that the scheduler stepped before
        # the optimizer; advancing anyway is intended: the step's data was consumed.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(stats=stats, grad_norm=grad_norm, skipped=not finite, sequences=sequences,
                      tokens=tokens)


class MicroBatches:
    """The k micro-batches of one optimizer step, taken from the stream only when the step
    reaches each one (and moved to ``device`` then), so the first forward starts as soon as its
    own batch is ready and loader workers keep producing while the device computes, whatever k
    is."""

    def __init__(self, stream: Iterator[dict], k: int, device: torch.device) -> None:
        self.stream, self.k, self.device = stream, k, device

    def __len__(self) -> int:
        return self.k

    def __iter__(self) -> Iterator[dict]:
        for i in range(self.k):
            batch = next(self.stream, None)
            if batch is None:
                raise DataError(f"the training data stream ended after micro-batch {i} of an "
                                f"accumulation group of {self.k}; a step needs all of them")
            yield to_device(batch, self.device)


def step_groups(batches: Iterable[dict], k: int, device: torch.device) -> Iterator[MicroBatches]:
    """One :class:`MicroBatches` per optimizer step while the stream has data: the loader yields
    a rank's micro-steps in order."""
    stream = iter(batches)
    while True:
        first = next(stream, None)
        if first is None:
            return
        yield MicroBatches(chain([first], stream), k, device)


# A Ctrl-C this long or longer after the first stops the run at once, without a checkpoint: a
# step can hang (a stuck DataLoader, a long evaluation) and the user must get their terminal
# back. One arriving sooner is the same request again, not impatience: torchrun forwards the
# SIGINT it got to ranks that got the terminal's own as well.
SIGINT_AGAIN_S = 3.0


class PreemptionFlag:
    """SIGTERM, SIGUSR1 and SIGINT (Ctrl-C) set a flag; the loop saves at the next step
    boundary and exits cleanly. A Ctrl-C at least ``SIGINT_AGAIN_S`` after the first raises
    ``KeyboardInterrupt`` where the step is (the command exits 130; the step in progress is not
    saved, the checkpoints written before are whole: every write is atomic). ``announce``: say
    so on the first Ctrl-C (one rank says it for all). Outside the loop the previous handlers
    apply (``bertforge.core.signals.raise_on_stop``, ``KeyboardInterrupt``)."""

    def __init__(self, announce: bool = True) -> None:
        self.requested = False
        self.announce = announce
        self._first_sigint: float | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in ALL_STOP_SIGNALS}

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 (signal API)
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_sigint is None:
                self._first_sigint = now
                if self.announce:
                    _say(f"Ctrl-C: the run saves a checkpoint after this step and stops; press "
                         f"Ctrl-C again (after {SIGINT_AGAIN_S:g} s) to stop at once without "
                         f"saving")
            elif now - self._first_sigint >= SIGINT_AGAIN_S:
                raise KeyboardInterrupt("a second Ctrl-C stopped the run at once; the step in "
                                        "progress was not saved, the checkpoints written before "
                                        "are intact (run the same command to resume)")
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _say(line: str) -> None:
    """``line`` on stderr from a signal handler: one unbuffered write, since the handler may
    run while the main thread is inside a buffered write to the same stream (a progress bar),
    which a second buffered write would break into."""
    start = "\n" if os.isatty(2) else ""  # off a progress bar's line
    try:
        os.write(2, f"{start}{line}\n".encode())
    except OSError:  # no stderr: the checkpoint is what matters
        pass


@dataclass
class Hooks:
    """What a task plugs into the loop besides its loss."""
    log: Callable[[int, dict], None]                   # (step, metrics) on every log interval
    checkpoint: Callable[[int], None]                  # save a checkpoint at this step
    evaluate: Callable[[int], dict] | None = None      # validation metrics at this step
    on_step: Callable[[int], None] = lambda step: None  # progress bar etc.
    on_skip: Callable[[int, str], None] = lambda step, why: None  # a step that left the weights


@dataclass
class LoopConfig:
    max_steps: int
    accumulation: int
    log_every: int
    checkpoint_every: int
    eval_every: int = 0
    clip_norm: float = 0.0
    max_skipped_steps: int = 20  # consecutive non-finite steps before TrainingDiverged


@dataclass
class LoopResult:
    step: int
    preempted: bool
    skipped_steps: int
    history: list = field(default_factory=list)


class Trainer:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Scheduler,
                 precision: Precision, loss_fn: LossFn, dist: DistInfo, cfg: LoopConfig,
                 hooks: Hooks) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.precision, self.loss_fn, self.dist, self.cfg, self.hooks = (
            precision, loss_fn, dist, cfg, hooks)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def fit(self, batches: Iterable[dict], start_step: int = 0) -> LoopResult:
        """Train from ``start_step`` to ``cfg.max_steps`` (or a preemption request).

        Raises ``TrainingDiverged`` after ``cfg.max_skipped_steps`` consecutive skipped steps,
        and when every step of this call was skipped, before checkpointing that step.
        """
        cfg, step, skipped, streak = self.cfg, start_step, 0, 0
        window: dict[str, torch.Tensor] = {}
        window_steps, window_seqs, window_tokens = 0, 0, 0
        t0 = time.perf_counter()
        preempt = PreemptionFlag(announce=self.dist.is_main)
        result = LoopResult(step=step, preempted=False, skipped_steps=0)
        self.model.train()
        if step >= cfg.max_steps:
            return result
        try:
            for group in step_groups(batches, cfg.accumulation, self.dist.device):
                # The scheduler already holds the rate of the step about to run; after
                # train_step it holds the next one, so read it here to log what was applied.
                lr = self.scheduler.get_last_lr()[0]
                out = train_step(self.model, group, self.loss_fn, self.optimizer, self.scheduler,
                                 self.precision, self.params, cfg.clip_norm)
                step += 1
                skipped += out.skipped
                streak = streak + 1 if out.skipped else 0
                if out.skipped:
                    scale = self.precision.scaler
                    self.hooks.on_skip(step, "non-finite gradients, weights not updated" + (
                        f"; loss scale now {scale.get_scale():g}" if scale is not None else ""))
                    self._check_divergence(step, streak, start_step, out)
                for name, value in {**out.stats, "grad_norm": out.grad_norm}.items():
                    window[name] = window.get(name, 0.0) + value
                window_steps += 1
                window_seqs += out.sequences
                window_tokens += out.tokens
                self.hooks.on_step(step)

                if step % cfg.log_every == 0 or step == cfg.max_steps:
                    metrics = self._reduce(window, window_steps)
                    elapsed = time.perf_counter() - t0
                    metrics.update(
                        step=step, lr=lr,
                        seq_per_s=window_seqs * self.dist.world_size / elapsed,
                        tokens_per_s=float(window_tokens) * self.dist.world_size / elapsed,
                        skipped_steps=skipped)
                    if self.precision.scaler is not None:
                        metrics["loss_scale"] = self.precision.scaler.get_scale()
                    self.hooks.log(step, metrics)
                    result.history.append(metrics)
                    window, window_steps, window_seqs, window_tokens = {}, 0, 0, 0
                    t0 = time.perf_counter()
                if self.hooks.evaluate and cfg.eval_every and step % cfg.eval_every == 0:
                    self.hooks.log(step, self.hooks.evaluate(step))
                    self.model.train()

                stop = any_rank(preempt.requested, self.dist.device)
                if stop or step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
                    self.hooks.checkpoint(step)
                if stop:
                    result.preempted = True
                if stop or step >= cfg.max_steps:
                    break
        finally:
            preempt.restore()
        result.step, result.skipped_steps = step, skipped
        return result

    def _check_divergence(self, step: int, streak: int, start_step: int, out: StepResult) -> None:
        """Stop a run that no longer learns: too many skips in a row, or nothing but skips."""
        all_skipped = step == self.cfg.max_steps and streak == step - start_step
        if streak < self.cfg.max_skipped_steps and not all_skipped:
            return
        loss = out.stats.get("loss")
        seen = f" (last loss {float(loss):.4g})" if loss is not None else ""
        what = (f"all {streak} steps of this run" if all_skipped and
                streak < self.cfg.max_skipped_steps else f"{streak} consecutive steps")
        raise TrainingDiverged(
            f"training diverged at step {step}: {what} had non-finite gradients{seen} and left "
            "the weights untouched. Lower optim.lr, check the data, or use bf16 instead of "
            f"fp16; train.max_skipped_steps (now {self.cfg.max_skipped_steps}) sets the limit")

    def _reduce(self, window: dict[str, torch.Tensor], n: int) -> dict[str, float]:
        """Mean over the window's steps and over ranks (a sync, at log intervals only)."""
        names = sorted(window)
        vec = torch.stack([torch.as_tensor(window[k], device=self.dist.device).float()
                           for k in names]) / n
        return dict(zip(names, all_reduce_mean(vec).tolist()))


# ---------------------------------------------------------------------------- the run's log
_SHOWN = ("loss", "val_loss", "mlm_acc", "lr", "seq_per_s")  # on the bar, or the plain line


class RunLogger:
    def __init__(self, output_dir: Path, *, enabled: bool, total_steps: int, start_step: int,
                 tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self._bar = None
        self._tb = None
        self._shown: dict[str, str] = {}  # latest value of each metric on the progress bar
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        where = f"output_dir {self.path.parent}"
        # Appended to in place: never through a link planted there, never a FIFO to hang on.
        check_in_place(self.path, "metrics file", where)
        # Lines past the starting step come from a run that died after its last checkpoint (or
        # from an earlier run in this directory): the resumed run drops them, atomically, and
        # appends from there.
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] <= start_step]
            write_text_atomic(self.path, "".join(json_text(r, str(self.path)) + "\n"
                                                 for r in kept))
        self._file = os.fdopen(open_in_place(self.path, APPEND_FLAGS, "metrics file", where),
                               "a", encoding="utf-8")
        self._bar = progress_bar(total=total_steps, initial=start_step, desc="train",
                                 unit="step", dynamic_ncols=True)
        self._total = total_steps
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"),
                                         purge_step=start_step + 1)
            except ImportError:
                log.warning("tensorboard is not installed; metrics go to %s only", self.path)

    def advance(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": step, **metrics}
        self._file.write(json_text(record, f"{self.path} step {step}") + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(key, value, step)
        if self._bar is not None:
            self._shown.update({k: f"{v:.4g}" for k, v in metrics.items()
                                if k in _SHOWN and isinstance(v, (int, float))})
            if self._bar.disable:  # no terminal (a log file, a pipe): one plain line instead
                shown = ", ".join(f"{k} {v}" for k, v in self._shown.items())
                print(f"train: step {step}/{self._total}: {shown}", file=sys.stderr, flush=True)
            else:
                self._bar.set_postfix(self._shown, refresh=False)

    def write(self, text: str) -> None:
        """Print without breaking the progress bar."""
        if self.enabled:
            tqdm.write(text)

    def close(self) -> None:
        """Close the file, bar and TensorBoard writer; safe to call more than once."""
        if not self.enabled:
            return
        self._file.close()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        self._bar = self._tb = None


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl: JSON objects with an integer ``step``.

    Any other line (cut short by a full disk or a kill, or edited by hand) is skipped with a
    warning naming its line number, so a damaged file never stops a run or a plot.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or type(record.get("step")) is not int:
                log.warning("%s:%d: not a complete metrics record (a write cut short?); "
                            "dropped", path, lineno)
                continue
            records.append(record)
    return records


def plot_loss_curve(metrics_path: Path, png_path: Path) -> Path | None:
    """Training (and validation) loss against step, as a PNG. None if there is nothing to plot."""
    records = read_metrics(metrics_path)
    def points(key: str) -> list[tuple[int, float]]:  # a diverged step's loss is null
        return [(r["step"], r[key]) for r in records
                if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]

    train, val = points("loss"), points("val_loss")
    if not train:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(*zip(*train), label="train loss")
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)
