"""What a run tells its user: progress bar, JSON-lines metrics, TensorBoard, loss-curve PNG.

Only rank 0 writes. A resumed run continues the same metrics file
(and TensorBoard log) from its starting step; lines beyond it are dropped.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from tqdm.auto import tqdm

log = logging.getLogger(__name__)


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
        # Lines past the starting step come from a run that died after its last checkpoint (or
        # from an earlier run in this directory): the resumed run rewrites them.
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= start_step]
        self._file = self.path.open("w")
        for record in kept:
            self._file.write(json.dumps(record) + "\n")
        self._bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                         dynamic_ncols=True)
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
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(key, value, step)
        if self._bar is not None:
            self._shown.update({k: f"{v:.4g}" for k, v in metrics.items()
                                if k in ("loss", "val_loss", "mlm_acc", "lr", "seq_per_s")})
            self._bar.set_postfix(self._shown, refresh=False)

    def write(self, text: str) -> None:
        """Print without breaking the progress bar."""
        if self.enabled:
            tqdm.write(text)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_loss_curve(metrics_path: Path, png_path: Path) -> Path | None:
    """Training (and validation) loss against step, as a PNG. None if there is nothing to plot."""
    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if math.isfinite(r.get("loss", math.nan))]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
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
