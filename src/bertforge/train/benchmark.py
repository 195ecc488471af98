"""``--benchmark`` mode of every training command: time real training steps, report throughput
and MFU.

The timed steps are the same ``train_step`` a run uses (same data, masking, accumulation,
precision, optimizer). Sequences and tokens are what the task's loss counts; FLOPs are the
task's count per micro-batch from real (unpadded) lengths (see ``flops.py``), so padding never
inflates MFU.
"""

from __future__ import annotations

import datetime
import platform
import resource
import time
from pathlib import Path
from contextlib import ExitStack
from typing import Any, Iterator

import torch
from torch import nn

from bertforge.core.io import write_json_atomic
from bertforge.train.distributed import DistInfo, all_reduce_sum
from bertforge.train.flops import peak_flops
from bertforge.train.loop import LoopConfig, step_groups, train_step
from bertforge.speed import compiles
from bertforge.train.syncs import SyncCounter, host_resident


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB


def run(wrapped: nn.Module, model: nn.Module, optimizer, scheduler, precision, task,
        info: DistInfo, loop_cfg: LoopConfig, cfg) -> dict:
    warmup, steps = cfg.benchmark.warmup_steps, cfg.benchmark.steps
    params = [p for p in wrapped.parameters() if p.requires_grad]
    seen: list[dict] = []  # the host batches of the step running now, as the loader made them
    counting: list[SyncCounter] = []  # the sync counter of the last step, while it runs

    def host_batches() -> Iterator[dict]:
        """The loader's stream, recorded; its own work (masking, collating) is no sync of the
        step, while the model reading a batch's host-side entries is free by design."""
        stream = iter(task.train)
        while True:
            with ExitStack() as paused:
                for counter in counting:
                    paused.enter_context(counter.paused())
                batch = next(stream)
            seen.append(batch)
            for counter in counting:
                counter.exempt(host_resident(None, [batch]))
            yield batch

    groups = step_groups(host_batches(), loop_cfg.accumulation, info.device)

    def step() -> Any:
        seen.clear()
        return train_step(wrapped, next(groups), task.loss, optimizer, scheduler, precision,
                          params, loop_cfg.clip_norm)

    wrapped.train()
    for _ in range(warmup):
        step()
    if info.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(info.device)
    # FLOPs are counted from the host batches after each step (no device involved), and the
    # loss's token counts stay on the device until the clock stops, so counting adds no syncs.
    flops, seqs, tokens = 0.0, 0, torch.zeros((), dtype=torch.float64, device=info.device)
    _sync(info.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = step()
        flops += sum(task.batch_flops(model, b) for b in seen)
        seqs, tokens = seqs + out.sequences, tokens + out.tokens
    _sync(info.device)
    elapsed = time.perf_counter() - t0
    # One more step, untimed, with every op that would make the host wait for the device counted.
    with SyncCounter(info.device, host_resident(optimizer, [])) as syncs:
        counting.append(syncs)
        step()
    totals = torch.tensor([seqs, float(tokens), flops], dtype=torch.float64)
    totals = all_reduce_sum(totals.to(info.device)).cpu()
    seqs, tokens, flops = totals.tolist()
    peak = peak_flops(info.device, precision.name)
    achieved = flops / elapsed
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": (torch.cuda.get_device_name(info.device) if info.device.type == "cuda"
                   else f"CPU ({platform.processor() or platform.machine()}, "
                        f"{torch.get_num_threads()} threads)"),
        "world_size": info.world_size, "torch": torch.__version__, "model": cfg.model,
        "model_shape": model.config.shape_summary(),
        "precision": precision.name, "global_batch_size": cfg.train.global_batch_size,
        "micro_batch_size": cfg.train.micro_batch_size,
        "accumulation": loop_cfg.accumulation,
        "compiled": compiles(cfg.train.compile, info.device),
        "warmup_steps": warmup, "timed_steps": steps,
        "seconds": elapsed, "sequences_per_s": seqs / elapsed, "tokens_per_s": tokens / elapsed,
        "mean_tokens_per_sequence": tokens / max(seqs, 1),
        "model_tflops_per_s": achieved / 1e12,
        "mfu": achieved / (peak * info.world_size) if peak else None,
        "mfu_note": None if peak else "peak FLOP/s unknown for this device; MFU not computed",
        "peak_memory_gib": _peak_memory_gib(info.device),
        "host_syncs_per_step": dict(syncs.counts),
    }
    if info.is_main:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        # Insertion order is the reading order of the report, so keys are not sorted.
        write_json_atomic(out / "benchmark.json", report, sort_keys=False)
        mfu = f"{report['mfu']:.1%}" if report["mfu"] is not None else "n/a (unknown peak)"
        print(f"benchmark: {report['sequences_per_s']:.1f} sequences/s, "
              f"{report['tokens_per_s']:.0f} tokens/s, {report['model_tflops_per_s']:.2f} "
              f"model TFLOP/s, MFU {mfu}, peak memory {report['peak_memory_gib']:.2f} GiB "
              f"on {report['device']} -> {out / 'benchmark.json'}")
    return report
