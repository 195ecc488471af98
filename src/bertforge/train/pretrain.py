"""BERT pretraining: build -> restore -> loop -> summary, with everything task-specific here.

The loop itself is ``bertforge.train.loop``; this file decides the model class (MLM + NSP, or
MLM only when the data has no sentence pairs), the loss, the data, validation and checkpoints.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import PretrainConfig, save_config, to_dict
from bertforge.errors import ConfigError, RunError, TrainingDiverged
from bertforge.io import ensure_writable_dir
from bertforge.optim import build_optimizer, build_scheduler
from bertforge.optim.param_groups import needs_external_clipping
from bertforge.signals import Stopped, raise_on_stop
from bertforge.train import benchmark as bench
from bertforge.train.checkpoint import (TRAINING_STATE, CheckpointManager, CheckpointWriteError,
                                        checkpoint_step, gather_to_rank0, load_training_state,
                                        save_training_state)
from bertforge.train.data import PretrainData, open_pretrain_data
from bertforge.train.distributed import (DistInfo, all_reduce_sum, any_rank, barrier, cleanup,
                                         collective_failure, init_distributed, on_rank0, wrap_ddp)
from bertforge.train.guards import (check_model_fits, check_vocab, explain_oom, nonfinite_summary,
                                    optimizer_tensors, refuse_nonfinite)
from bertforge.train.loop import Hooks, LoopConfig, Trainer, to_device
from bertforge.train.precision import build_precision
from bertforge.train.resume import resolve_resume, verify_model_files
from bertforge.train.rng import capture_rng_state, restore_rng_state
from bertforge.train.run_log import RunLogger, plot_loss_curve

log = logging.getLogger(__name__)


def pretraining_loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MLM cross-entropy at the masked positions only (+ NSP/SOP when the batch has labels)."""
    labels = batch["mlm_labels"]
    masked = labels.ne(-100)                       # (B, S)
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"], masked_positions=masked)
    logits = getattr(out, "mlm_logits", None)
    logits = (out.logits if logits is None else logits).float()   # (N, V), N = masked tokens
    target = labels[masked]                        # (N,) row-major, as the head's positions
    mlm_loss = F.cross_entropy(logits, target)
    stats = {"mlm_loss": mlm_loss.detach(),
             "mlm_acc": (logits.detach().argmax(-1) == target).float().mean()}
    loss = mlm_loss
    nsp_logits = getattr(out, "nsp_logits", None)
    if nsp_logits is not None:
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["nsp_labels"], ignore_index=-100)
        loss = loss + nsp_loss
        stats["nsp_loss"] = nsp_loss.detach()
    stats["loss"] = loss.detach()
    return loss, stats


@torch.no_grad()
def evaluate(model: nn.Module, data: PretrainData, info: DistInfo, num_batches: int,
             autocast) -> dict[str, float]:
    """Mean validation loss and MLM accuracy over the first ``num_batches`` micro-batches."""
    model.eval()
    totals = torch.zeros(4, device=info.device)   # loss, mlm_loss, mlm_acc, batches
    for i, batch in enumerate(data.validation_batches()):
        if i == num_batches:
            break
        with autocast():
            _, stats = pretraining_loss(model, to_device(batch, info.device))
        totals += torch.stack([stats["loss"], stats["mlm_loss"], stats["mlm_acc"],
                               torch.ones((), device=info.device)])
    totals = all_reduce_sum(totals)
    n = max(float(totals[3]), 1.0)
    return {"val_loss": float(totals[0]) / n, "val_mlm_loss": float(totals[1]) / n,
            "val_mlm_acc": float(totals[2]) / n}


@dataclass
class PretrainResult:
    output_dir: Path
    step: int
    preempted: bool
    final_checkpoint: Path | None
    history: list = field(default_factory=list)
    validation: dict = field(default_factory=dict)


def build_model(cfg: PretrainConfig, data: PretrainData, resume_from: Path | None,
                device: torch.device) -> nn.Module:
    """The checkpoint being resumed, else ``init_from`` weights, else a fresh model.

    A fresh model takes vocabulary size, casing and [PAD] id from the prepared data. Weights
    from a checkpoint must match the data's vocabulary (by content) and be finite.
    """
    from bertforge.models import BertConfig, BertForMaskedLM, BertForPreTraining

    cls = BertForPreTraining if data.has_pairs else BertForMaskedLM
    source = resume_from or (Path(cfg.init_from) if cfg.init_from else None)
    if source is not None:
        if source != resume_from:  # a resume was verified whole by resolve_resume
            verify_model_files(source)
        config = BertConfig.load(source)
        if data.vocab_size and config.vocab_size != data.vocab_size:
            raise ConfigError(
                f"{source} has vocab_size {config.vocab_size} but the data at "
                f"{cfg.data.path} was prepared with {data.vocab_size} tokens; prepare the data "
                f"with the model's vocab")
        if not check_vocab(source, data.vocab_tokens, cfg.data.path):
            log.warning("cannot compare the vocabulary of %s with the data's (one side has no "
                        "vocab.txt/tokenizer.json); only the sizes were checked", source)
    else:
        overrides: dict[str, Any] = {}
        if data.vocab_size:
            overrides["vocab_size"] = data.vocab_size
        if data.do_lower_case is not None:
            overrides["do_lower_case"] = data.do_lower_case
        if data.pad_id is not None:
            overrides["pad_token_id"] = data.pad_id
        config = BertConfig.load(cfg.model).replace(**overrides)
    positions = config.max_position_embeddings
    if data.max_seq_length and data.max_seq_length > positions:
        raise ConfigError(
            f"the data at {cfg.data.path} has sequences of up to {data.max_seq_length} tokens but "
            f"the model has {positions} positions; prepare with --max-seq-length {positions} or "
            f"use a model with more positions")
    name = str(source or cfg.model)
    check_model_fits(config, device, name)
    with explain_oom(config, device, name):
        if source is not None:
            model = cls.from_pretrained(source)
            refuse_nonfinite(model.named_parameters(), source / "model.safetensors", source)
        else:
            torch.manual_seed(cfg.train.seed)
            model = cls(config)
        return model.to(device)


# Settings that define a run's trajectory: resuming with other values would silently train
# something else (e.g. a schedule restored for the old max_steps), so they must match.
_RUN_DEFINING = ("model", "train.max_steps", "train.global_batch_size", "train.seed", "optim",
                 "precision", "phase", "data.masked_lm_prob", "data.max_predictions",
                 "data.whole_word_masking", "data.bin_by_length")


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def check_resume_compatible(saved: dict, cfg: PretrainConfig, source: Path) -> None:
    """ConfigError listing every run-defining setting that differs from the checkpoint's."""
    old = _flat(json.loads(json.dumps(saved, default=str)))
    new = _flat(json.loads(json.dumps(to_dict(cfg), default=str)))
    diffs = [f"{k}: {old.get(k)!r} in the checkpoint, {new.get(k)!r} now"
             for k in sorted(set(old) | set(new))
             if k.startswith(_RUN_DEFINING) and old.get(k) != new.get(k)]
    if diffs:
        raise ConfigError(
            f"cannot resume from {source} with different settings ({'; '.join(diffs)}). Resume "
            f"with the checkpoint's settings, or start a new run (a new output_dir, or "
            f"resume=none) with init_from={source} to keep only its weights")


def pretrain(cfg: PretrainConfig, benchmark: bool = False) -> PretrainResult | dict:
    """Run (or benchmark) pretraining as ``cfg`` says; see docs/pretraining.md.

    SIGTERM/SIGUSR1 during the train loop save a checkpoint and return (``preempted``); outside
    it (start-up, the final evaluation) they raise ``bertforge.signals.Stopped`` at once.
    """
    with raise_on_stop():
        info = init_distributed(timeout_s=cfg.train.dist_timeout_s)
        try:
            result = _pretrain(cfg, info, benchmark)
            # Leave together: a rank that tears down its process group while rank 0 still
            # writes the summary and plot can abort inside gloo at exit.
            barrier()
            return result
        except RuntimeError as exc:
            failure = collective_failure(exc, info)
            if failure is None:
                raise
            raise failure from exc
        except Stopped:
            if info.is_main:
                log.warning("pretrain: stopped outside the train loop; checkpoints already in "
                            "%s are intact, run the same command to continue", cfg.output_dir)
            raise
        finally:
            cleanup()


def _pretrain(cfg: PretrainConfig, info: DistInfo, benchmark: bool) -> PretrainResult | dict:
    out = Path(cfg.output_dir)
    data = open_pretrain_data(cfg, info)
    if not benchmark:  # before the model is built: a run must be able to save what it computes
        ensure_writable_dir(out, "output_dir")
    manager = CheckpointManager(out, keep=cfg.checkpoint.keep)
    resume_from = None if benchmark else on_rank0(lambda: resolve_resume(cfg.resume, out))
    model = build_model(cfg, data, resume_from, info.device)
    if cfg.train.gradient_checkpointing:
        model.bert.encoder.gradient_checkpointing = True
    # Weights are initialised from the same seed on every rank (DDP also broadcasts them); from
    # here on each rank draws its own dropout masks, as rank-seeded generators.
    torch.manual_seed(cfg.train.seed + info.rank)
    optimizer = build_optimizer(model, cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay,
                                cfg.optim.betas, cfg.optim.eps, cfg.optim.max_grad_norm)
    scheduler = build_scheduler(optimizer, cfg.optim.schedule, cfg.train.max_steps,
                                cfg.optim.warmup, cfg.optim.power)
    precision = build_precision(cfg.precision, info.device)
    start_step = 0
    if resume_from is not None:
        state = load_training_state(resume_from, map_location=info.device)
        check_resume_compatible(state.config, cfg, resume_from)
        optimizer.load_state_dict(state.optimizer)
        refuse_nonfinite(optimizer_tensors(optimizer),
                         resume_from / TRAINING_STATE / "optimizer.pt", resume_from)
        scheduler.load_state_dict(state.scheduler)
        if precision.scaler is not None and state.scaler:
            precision.scaler.load_state_dict(state.scaler)
        # Every rank's loader sits at the same global batch, so a rank that the saving run did
        # not have (the world grew) can take rank 0's position.
        data.train.load_state_dict(state.data_state.get(info.rank, state.data_state.get(0, {})))
        start_step = state.step
    newest = None if benchmark else manager.latest()
    if newest is not None and checkpoint_step(newest) > start_step:
        raise ConfigError(
            f"{out} already holds {newest.name}, ahead of this run's start (step {start_step}); "
            f"continue that run with resume=auto, or write this one to a new output_dir")
    wrapped: nn.Module = torch.compile(model) if cfg.train.compile else model
    wrapped = wrap_ddp(wrapped, info)
    loop_cfg = LoopConfig(
        max_steps=cfg.train.max_steps, accumulation=data.train.accumulation_steps,
        log_every=cfg.train.log_every, checkpoint_every=cfg.checkpoint.every,
        eval_every=cfg.train.eval_every if data.has_validation else 0,
        clip_norm=cfg.optim.max_grad_norm if needs_external_clipping(optimizer) else 0.0,
        max_skipped_steps=cfg.train.max_skipped_steps)

    if benchmark:
        return bench.run(wrapped, model, optimizer, scheduler, precision, pretraining_loss,
                         data, info, loop_cfg, cfg)

    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    logger = RunLogger(out, enabled=info.is_main, total_steps=cfg.train.max_steps,
                       start_step=start_step, tensorboard=cfg.tensorboard)
    if resume_from is not None:
        logger.write(f"resumed from {resume_from} at step {start_step}")

    saved: list[Path] = []  # paths of this run's checkpoints, newest last

    def save_checkpoint(step: int) -> None:
        # Every rank holds the same weights and optimizer state, so every rank reaches the same
        # verdict here without talking to the others.
        problem = nonfinite_summary(chain(model.named_parameters(), optimizer_tensors(optimizer)))
        if problem:
            raise TrainingDiverged(
                f"at step {step} the weights or optimizer state hold {problem}; refusing to "
                "save them (lower optim.lr or check the data before resuming)")
        data_states = gather_to_rank0(data.train.state_dict())
        rng_states = gather_to_rank0(capture_rng_state())
        failure: CheckpointWriteError | None = None
        if info.is_main:
            def write(tmp: Path) -> None:
                model.save_pretrained(tmp, tokenizer=data.tokenizer)
                save_training_state(
                    tmp, optimizer=optimizer, scheduler=scheduler,
                    scaler=precision.scaler, step=step, phase=cfg.phase, data_state=data_states,
                    rng_states=rng_states, config=to_dict(cfg))
            try:
                saved.append(manager.save(step, write))
                logger.write(f"saved {saved[-1]}")
            except CheckpointWriteError as exc:
                failure = exc
        # In place of a barrier: every rank learns whether rank 0's save failed, and stops too.
        if any_rank(failure is not None, info.device):
            raise failure or RunError(f"rank 0 could not write checkpoint-{step} (see its "
                                      "message); checkpoints written before it are intact")

    last_eval: dict[int, dict] = {}  # step -> metrics of the latest evaluation

    def run_eval(step: int) -> dict:
        if step not in last_eval:
            last_eval.clear()
            last_eval[step] = evaluate(wrapped, data, info, cfg.train.eval_batches,
                                       precision.autocast)
        return last_eval[step]

    hooks = Hooks(log=logger.log, checkpoint=save_checkpoint,
                  evaluate=run_eval if data.has_validation else None, on_step=logger.advance,
                  on_skip=lambda step, why: logger.write(f"step {step} skipped: {why}"))
    trainer = Trainer(wrapped, optimizer, scheduler, precision, pretraining_loss, info, loop_cfg,
                      hooks)
    if resume_from is not None and info.rank in state.rng_states:
        # Last, so nothing between here and the first step draws from the restored generators.
        # A rank the saving run did not have keeps its seeded generators.
        restore_rng_state(state.rng_states[info.rank], source=str(resume_from))
    t0 = time.perf_counter()
    try:
        result = trainer.fit(data.train, start_step=start_step)
    except BaseException as exc:
        logger.close()  # end the progress bar (and flush the logs) before the error is shown
        if isinstance(exc, TrainingDiverged):
            raise TrainingDiverged(f"{exc}. The newest checkpoint, "
                                   f"{manager.latest() or '(none yet)'}, is intact") from None
        raise
    elapsed = time.perf_counter() - t0

    validation: dict = {}
    if data.has_validation and not result.preempted and cfg.train.eval_batches:
        logged = result.step in last_eval  # the loop evaluated this very step already
        validation = run_eval(result.step)
        if not logged:
            logger.log(result.step, validation)
    logger.close()
    final = saved[-1] if saved else manager.latest()
    if info.is_main:
        png = plot_loss_curve(out / "metrics.jsonl", out / "loss_curve.png")
        print(_summary(cfg, result, validation, elapsed, start_step, final, png))
    return PretrainResult(output_dir=out, step=result.step, preempted=result.preempted,
                          final_checkpoint=final, history=result.history, validation=validation)


def _summary(cfg: PretrainConfig, result, validation: dict, elapsed: float, start_step: int,
             final: Path | None, png: Path | None) -> str:
    last = result.history[-1] if result.history else {}
    steps = result.step - start_step
    lines = [
        "pretraining " + ("stopped for preemption" if result.preempted else "finished"),
        f"  steps        {start_step} -> {result.step} of {cfg.train.max_steps} "
        f"({steps / max(elapsed, 1e-9):.2f} steps/s, {elapsed:.0f} s)",
    ]
    if last:
        lines.append(f"  last loss    {last.get('loss', float('nan')):.4f} "
                     f"(mlm {last.get('mlm_loss', float('nan')):.4f}, "
                     f"mlm acc {last.get('mlm_acc', float('nan')):.3f})")
        lines.append(f"  throughput   {last.get('seq_per_s', 0):.1f} sequences/s")
    if result.skipped_steps:
        lines.append(f"  skipped      {result.skipped_steps} steps with non-finite gradients")
    if validation:
        lines.append(f"  validation   loss {validation['val_loss']:.4f}, "
                     f"mlm acc {validation['val_mlm_acc']:.3f}")
    lines.append(f"  checkpoint   {final}")
    lines.append(f"  metrics      {Path(cfg.output_dir) / 'metrics.jsonl'}")
    if png:
        lines.append(f"  loss curve   {png}")
    return "\n".join(lines)
