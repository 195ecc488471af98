"""What a run tells its user: progress bar, JSON-lines metrics, TensorBoard, loss-curve PNG.

Only rank 0 writes. A resumed run continues the same metrics file (and TensorBoard log) from its
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
import sys
from pathlib import Path

from tqdm.auto import tqdm

from bertforge.core.io import (APPEND_FLAGS, check_in_place, json_text, open_in_place,
                               write_text_atomic)
from bertforge.core.progress import progress_bar

log = logging.getLogger(__name__)
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
