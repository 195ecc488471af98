"""The one runner: build -> restore -> loop -> log / evaluate / checkpoint -> finish, for any task.

``run_task`` (and ``benchmark_task``) take a ``bertforge.train.task.Task`` and a run config; the
task brings data, model, loss and metrics, everything else is here. SIGTERM/SIGUSR1 during the
train loop save a checkpoint and return (``preempted``); outside it (start-up, the final
evaluation) they raise ``bertforge.core.signals.Stopped`` at once.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from bertforge.config import RunConfig, run_defining_keys, save_config, to_dict
from bertforge.errors import CheckpointError, ConfigError, RunError, TrainingDiverged
from bertforge.core.io import ensure_writable_dir, output_lock
from bertforge.optim import build_optimizer, build_scheduler, needs_external_clipping
from bertforge.core.signals import Stopped, raise_on_stop
from bertforge.train import benchmark as bench
from bertforge.train.checkpoint import (SHARDED_OPTIMIZER, TRAINING_STATE, CheckpointManager,
                                        CheckpointWriteError, capture_rng_state, checkpoint_step,
                                        gather_to_rank0, load_training_state, restore_rng_state,
                                        save_training_state)
from bertforge.train.optimizer_state import restore_optimizer, save_sharded_optimizer
from bertforge.train.distributed import (DistInfo, any_rank, barrier, cleanup,
                                         collective_failure, gather_full_model, init_distributed,
                                         local_tensors, on_rank0, shard_model, wrap_ddp)
from bertforge.train.guards import (nonfinite_summary, optimizer_tensors, refuse_nonfinite,
                                    resolve_resume)
from bertforge.train.loop import Hooks, LoopConfig, RunLogger, Trainer, plot_loss_curve
from bertforge.speed import apply_speed_options, check_attention_backend, compiles
from bertforge.runtime.precision import build_precision
from bertforge.train.task import Task

log = logging.getLogger(__name__)
REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # train.fsdp_reduce_dtype


@dataclass
class RunResult:
    output_dir: Path
    step: int
    preempted: bool
    final_checkpoint: Path | None
    history: list = field(default_factory=list)
    validation: dict = field(default_factory=dict)  # the task's final metrics


@contextmanager
def distributed_run(cfg: RunConfig, what: str) -> Iterator[DistInfo]:
    """Process group up for the body, torn down after; collective timeouts and stop signals
    become one-line errors that say the checkpoints in ``output_dir`` are intact. Rank 0 holds
    the lock of ``output_dir`` throughout (a second command writing there fails at once)."""
    with raise_on_stop():
        info = init_distributed(timeout_s=cfg.train.dist_timeout_s)
        try:
            with (output_lock(cfg.output_dir, "output_dir", f"bertforge {what}")
                  if info.is_main else nullcontext()):
                yield info
                # Leave together: a rank that tears down its process group while rank 0 still
                # writes the summary and plot can abort inside gloo at exit.
                barrier()
        except RuntimeError as exc:
            failure = collective_failure(exc, info)
            if failure is None:
                raise
            raise failure from exc
        except Stopped:
            if info.is_main:
                log.warning("%s: stopped outside the train loop; checkpoints already in %s are "
                            "intact, run the same command to continue", what, cfg.output_dir)
            raise
        finally:
            cleanup()


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


# Run-defining keys added with a default that differs from what the code did before them: a
# checkpoint without the key ran as this value.
_BEFORE_KEY_EXISTED = {"optim.schedule_counting": "nvidia"}


def check_resume_compatible(saved: dict, cfg: RunConfig, source: Path, init_key: str) -> None:
    """ConfigError listing every run-defining setting that differs from the checkpoint's;
    ``init_key`` is the config key that starts a run from a checkpoint's weights only."""
    defining = tuple(run_defining_keys(type(cfg)))
    old = _flat(json.loads(json.dumps(saved, default=str)))
    new = _flat(json.loads(json.dumps(to_dict(cfg), default=str)))
    # A key the checkpoint's bertforge did not have yet meant what its default means now, or
    # what the code did before the key existed where the default changed with it.
    default = _flat(json.loads(json.dumps(to_dict(type(cfg)()), default=str)))
    old = {**{k: _BEFORE_KEY_EXISTED.get(k, v) for k, v in default.items() if k not in old},
           **old}
    diffs = [f"{k}: {old.get(k)!r} in the checkpoint, {new.get(k)!r} now"
             for k in sorted(set(old) | set(new))
             if k.startswith(defining) and old.get(k) != new.get(k)]
    if diffs:
        raise ConfigError(
            f"cannot resume from {source} with different settings ({'; '.join(diffs)}). Resume "
            f"with the checkpoint's settings, or start a new run (a new output_dir, or "
            f"resume=none) with {init_key}={source} to keep only its weights")


class _Setup:
    """Everything built before the first step: model (restored), optimizer, schedule, precision."""

    def __init__(self, task: Task, cfg: RunConfig, info: DistInfo, benchmark: bool) -> None:
        out = Path(cfg.output_dir)
        if not benchmark:  # before the model is built: a run must be able to save what it computes
            ensure_writable_dir(out, "output_dir")
        self.manager = CheckpointManager(out, keep=cfg.checkpoint.keep)
        if cfg.train.fsdp and info.distributed and not task.supports_fsdp:
            raise ConfigError(f"train.fsdp=true is not supported by {task.name} (it writes its "
                              "model from rank 0 alone); run it with train.fsdp=false (DDP)")
        self.precision = build_precision(cfg.precision, info.device)
        if cfg.train.unpad:  # before the model is built: the kernel exists here for this dtype
            check_attention_backend(cfg.train.attention_backend, info.device,
                                    self.precision.dtype or torch.float32)
        self.resume_from = None if benchmark else on_rank0(lambda: resolve_resume(cfg.resume, out))
        self.max_steps = task.total_steps()
        self.model = model = task.build_model(self.resume_from)
        apply_speed_options(  # before sharding: FSDP's hooks stay outside the compiled graphs
            model, unpad=cfg.train.unpad, attention_backend=cfg.train.attention_backend,
            gradient_checkpointing=cfg.train.gradient_checkpointing,
            compile=compiles(cfg.train.compile, info.device))
        # FSDP2 replaces the parameters with sharded ones (DTensors), so it comes before the
        # optimizer is built over them; DDP wraps the model at the end instead.
        self.sharded = bool(cfg.train.fsdp) and shard_model(
            model, info, self.precision.dtype, REDUCE_DTYPES[cfg.train.fsdp_reduce_dtype])
        # Weights are initialised from the same seed on every rank (DDP also broadcasts them);
        # from here on each rank draws its own dropout masks, as rank-seeded generators.
        torch.manual_seed(cfg.train.seed + info.rank)
        self.optimizer = build_optimizer(model, cfg.optim.name, cfg.optim.lr,
                                         cfg.optim.weight_decay, cfg.optim.betas, cfg.optim.eps,
                                         cfg.optim.max_grad_norm)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim.schedule, self.max_steps,
                                         cfg.optim.warmup, cfg.optim.power,
                                         decay=cfg.optim.decay,
                                         decay_shape=cfg.optim.decay_shape,
                                         min_lr_ratio=cfg.optim.min_lr_ratio,
                                         # fine-tuning counts steps as transformers' Trainer
                                         counting=getattr(cfg.optim, "schedule_counting",
                                                          "nvidia"))
        self.start_step, self.rng_states = 0, {}
        if self.resume_from is not None:
            self._restore(task, cfg, info)
        newest = None if benchmark else self.manager.latest()
        if newest is not None and checkpoint_step(newest) > self.start_step:
            raise ConfigError(
                f"{out} already holds {newest.name}, ahead of this run's start (step "
                f"{self.start_step}); continue that run with resume=auto, or write this one to "
                "a new output_dir")
        self.wrapped = model if self.sharded else wrap_ddp(model, info)
        self.loop_cfg = LoopConfig(
            max_steps=self.max_steps, accumulation=task.train.accumulation_steps,
            log_every=cfg.train.log_every, checkpoint_every=cfg.checkpoint.every,
            eval_every=cfg.train.eval_every if task.has_validation else 0,
            clip_norm=(cfg.optim.max_grad_norm if needs_external_clipping(self.optimizer)
                       else 0.0),
            max_skipped_steps=cfg.train.max_skipped_steps)

    def _restore(self, task: Task, cfg: RunConfig, info: DistInfo) -> None:
        source = self.resume_from
        assert source is not None
        state = load_training_state(source, map_location=info.device)
        check_resume_compatible(state.config, cfg, source, task.init_key)
        restore_optimizer(self.model, self.optimizer, state, self.sharded)
        where = source / TRAINING_STATE / ("optimizer.pt" if state.optimizer is not None
                                           else SHARDED_OPTIMIZER)
        if not self.sharded:
            refuse_nonfinite(optimizer_tensors(self.optimizer), where, source)
        else:  # each rank checks its shard; all stop if any finds a problem
            problem: CheckpointError | None = None
            try:
                refuse_nonfinite(local_tensors(optimizer_tensors(self.optimizer)), where, source)
            except CheckpointError as exc:
                problem = exc
            if any_rank(problem is not None, info.device):
                raise problem or CheckpointError(f"{where} holds non-finite values (found by "
                                                 "another rank); resume from an older checkpoint")
        self.scheduler.load_state_dict(state.scheduler)
        if self.precision.scaler is not None and state.scaler:
            self.precision.scaler.load_state_dict(state.scaler)
        # Every rank's loader sits at the same global batch, so a rank that the saving run did
        # not have (the world grew) can take rank 0's position.
        task.train.load_state_dict(state.data_state.get(info.rank, state.data_state.get(0, {})))
        self.start_step, self.rng_states = state.step, state.rng_states


def benchmark_task(task: Task, cfg: RunConfig, info: DistInfo) -> dict:
    """Time real training steps of ``task`` (no checkpoints); the benchmark.json report."""
    s = _Setup(task, cfg, info, benchmark=True)
    with s.precision.scope():
        return bench.run(s.wrapped, s.model, s.optimizer, s.scheduler, s.precision, task, info,
                         s.loop_cfg, cfg)


def run_task(task: Task, cfg: RunConfig, info: DistInfo) -> RunResult:
    """Train ``task`` as ``cfg`` says, resuming from ``output_dir`` when asked; see
    docs/pretraining.md and docs/finetuning.md."""
    s = _Setup(task, cfg, info, benchmark=False)
    out = Path(cfg.output_dir)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    logger = RunLogger(out, enabled=info.is_main, total_steps=s.max_steps,
                       start_step=s.start_step, tensorboard=cfg.tensorboard)
    if s.resume_from is not None:
        logger.write(f"resumed from {s.resume_from} at step {s.start_step}")
    saved: list[Path] = []  # paths of this run's checkpoints, newest last
    hooks = Hooks(log=logger.log, checkpoint=_checkpointer(task, cfg, info, s, logger, saved),
                  on_step=logger.advance,
                  on_skip=lambda step, why: logger.write(f"step {step} skipped: {why}"))

    last_eval: dict[int, dict] = {}  # step -> metrics of the latest evaluation
    if task.has_validation:
        def run_eval(step: int) -> dict:
            if step not in last_eval:
                last_eval.clear()
                last_eval[step] = task.evaluate(s.wrapped, s.precision.autocast)
            return last_eval[step]
        hooks.evaluate = run_eval

    trainer = Trainer(s.wrapped, s.optimizer, s.scheduler, s.precision, task.loss, info,
                      s.loop_cfg, hooks)
    if info.rank in s.rng_states:
        # Last, so nothing between here and the first step draws from the restored generators.
        # A rank the saving run did not have keeps its seeded generators.
        restore_rng_state(s.rng_states[info.rank], source=str(s.resume_from))
    t0 = time.perf_counter()
    with s.precision.scope():  # TF32 on GPUs for the run's fp32 matmuls, restored afterwards
        try:
            result = trainer.fit(task.train, start_step=s.start_step)
        except BaseException as exc:
            logger.close()  # end the progress bar (and flush the logs) before the error is shown
            if isinstance(exc, TrainingDiverged):
                raise TrainingDiverged(f"{exc}. The newest checkpoint, "
                                       f"{s.manager.latest() or '(none yet)'}, is intact") from None
            raise
        elapsed = time.perf_counter() - t0

        validation: dict = {}
        if not result.preempted:
            if hooks.evaluate is not None:
                logged = result.step in last_eval  # the loop evaluated this very step already
                validation = hooks.evaluate(result.step)
                if not logged:
                    logger.log(result.step, validation)
            validation = task.finish(s.model, out, validation)
    logger.close()
    final = saved[-1] if saved else s.manager.latest()
    if info.is_main:
        png = plot_loss_curve(out / "metrics.jsonl", out / "loss_curve.png")
        print(_summary(task, s, result, validation, elapsed, final, png, out))
    return RunResult(output_dir=out, step=result.step, preempted=result.preempted,
                     final_checkpoint=final, history=result.history, validation=validation)


def _checkpointer(task: Task, cfg: RunConfig, info: DistInfo, s: _Setup, logger: RunLogger,
                  saved: list[Path]) -> Callable[[int], None]:
    model, optimizer = s.model, s.optimizer

    def save_checkpoint(step: int) -> None:
        # Every rank holds the same weights and optimizer state, so every rank reaches the same
        # verdict here without talking to the others; sharded, each checks its shard and they agree.
        named = chain(model.named_parameters(), optimizer_tensors(optimizer))
        problem = nonfinite_summary(local_tensors(named) if s.sharded else named)
        if s.sharded and any_rank(problem is not None, info.device):
            problem = problem or "non-finite values (found by another rank)"
        if problem:
            raise TrainingDiverged(
                f"at step {step} the weights or optimizer state hold {problem}; refusing to "
                "save them (lower optim.lr or check the data before resuming)")
        data_states = gather_to_rank0(task.train.state_dict())
        rng_states = gather_to_rank0(capture_rng_state())
        full, tmp = (_write_shards(s, info, step) if s.sharded else (model, None))
        failure: CheckpointWriteError | None = None
        if info.is_main:
            assert full is not None

            def write(tmp: Path) -> None:
                full.save_pretrained(tmp, tokenizer=task.tokenizer)
                save_training_state(
                    tmp, optimizer=None if s.sharded else optimizer, scheduler=s.scheduler,
                    scaler=s.precision.scaler, step=step, phase=task.phase,
                    data_state=data_states, rng_states=rng_states, config=to_dict(cfg))
            try:
                saved.append(s.manager.save(step, write, tmp=tmp))
                logger.write(f"saved {saved[-1]}")
            except CheckpointWriteError as exc:
                failure = exc
        # In place of a barrier: every rank learns whether rank 0's save failed, and stops too.
        if any_rank(failure is not None, info.device):
            raise failure or RunError(f"rank 0 could not write checkpoint-{step} (see its "
                                      "message); checkpoints written before it are intact")

    return save_checkpoint


def _write_shards(s: _Setup, info: DistInfo, step: int) -> tuple[nn.Module | None, Path | None]:
    """The sharded part of an FSDP checkpoint, on every rank: the full weights gathered to rank
    0 (returned there as an unsharded model) and each rank's optimizer shard written into the
    temporary directory rank 0 created (returned everywhere). Nothing is published here."""
    full = gather_full_model(s.model)

    def start() -> Path:
        try:
            return s.manager.start(step)
        except OSError as exc:
            raise CheckpointWriteError(f"cannot create a directory for checkpoint-{step} in "
                                       f"{s.manager.output_dir} ({exc}); checkpoints written "
                                       "before it are intact") from exc

    tmp = on_rank0(start)
    where = tmp / TRAINING_STATE / SHARDED_OPTIMIZER
    failure: CheckpointWriteError | None = None
    try:
        save_sharded_optimizer(s.model, s.optimizer, where)
    except Exception as exc:  # noqa: BLE001 (torch wraps every rank's OSError in its own type)
        failure = CheckpointWriteError(
            f"rank {info.rank} could not write its optimizer shard into checkpoint-{step}/"
            f"{TRAINING_STATE}/{SHARDED_OPTIMIZER} ({' '.join(str(exc).split())[:240]}); nothing "
            "of it was published and checkpoints written before it are intact. Free space (or "
            "fix the file system), then run the same command to resume")
    if any_rank(failure is not None, info.device):
        if info.is_main:
            s.manager.discard(tmp)
        raise failure or RunError(f"another rank could not write its optimizer shard of "
                                  f"checkpoint-{step} (see its message); checkpoints written "
                                  "before it are intact")
    return full, tmp


def _summary(task: Task, s: _Setup, result, validation: dict, elapsed: float,
             final: Path | None, png: Path | None, out: Path) -> str:
    last = result.history[-1] if result.history else {}
    steps = result.step - s.start_step
    lines = [
        f"{task.name} " + ("stopped for preemption" if result.preempted else "finished"),
        f"  steps        {s.start_step} -> {result.step} of {s.max_steps} in {elapsed:.0f} s "
        f"({steps / max(elapsed, 1e-9):.2f} steps/s overall: start-up, evaluation and "
        "checkpoints included)",
    ]
    lines += task.describe(last, validation)
    if last:
        lines.append(f"  throughput   {last.get('seq_per_s', 0):.1f} sequences/s while training "
                     "(the last log interval)")
    if result.skipped_steps:
        lines.append(f"  skipped      {result.skipped_steps} steps with non-finite gradients")
    lines.append(f"  checkpoint   {final}")
    lines.append(f"  metrics      {out / 'metrics.jsonl'}")
    if png:
        lines.append(f"  loss curve   {png}")
    return "\n".join(lines)
