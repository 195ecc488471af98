"""BERT pretraining as a task of the one runner (``bertforge.train.run``).

This file decides the model class (MLM + NSP, or MLM only when the data has no sentence pairs),
where its weights come from, the loss, the data and validation; the runner does the rest.
Denoising data (``--objective denoise``) goes to BART's task, ``bertforge.tasks.denoise``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.batch import IGNORE_INDEX, Batch, LossOutput, real_tokens, to_device
from bertforge.config import PretrainConfig
from bertforge.errors import ConfigError
from bertforge.models.unpad import layout_from_batch
from bertforge.train.data import MakeBatch, PretrainData, open_pretrain_data
from bertforge.train.distributed import DistInfo, all_reduce_sum
from bertforge.train.flops import batch_train_flops
from bertforge.train.guards import check_model_fits, check_vocab, explain_oom, refuse_nonfinite
from bertforge.train.resume import verify_model_files
from bertforge.train.run import RunResult, benchmark_task, distributed_run, run_task

log = logging.getLogger(__name__)


def pretraining_loss(model: nn.Module, batch: Batch) -> LossOutput:
    """MLM cross-entropy at the masked positions only (+ NSP/SOP when the batch has labels).

    The loader's batches say where the predicted tokens are (``mlm_positions``) and carry
    their ``TokenLayout``, so this loss and the model need no host-device sync; a batch without
    them (e.g. made by hand) costs the syncs of finding them.
    """
    labels = batch["mlm_labels"]
    masked = batch.get("mlm_positions")            # (N,) flat positions, row-major
    if masked is None:
        masked = labels.ne(IGNORE_INDEX)           # (B, S)
        target = labels[masked]
    else:
        target = labels.reshape(-1).index_select(0, masked)  # (N,) in the head's order
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"], masked_positions=masked,
                position_ids=batch.get("position_ids"), layout=layout_from_batch(batch))
    logits = getattr(out, "mlm_logits", None)
    logits = (out.logits if logits is None else logits).float()   # (N, V), N = masked tokens
    mlm_loss = F.cross_entropy(logits, target)
    stats = {"mlm_loss": mlm_loss.detach(),
             "mlm_acc": (logits.detach().argmax(-1) == target).float().mean()}
    loss = mlm_loss
    nsp_logits = getattr(out, "nsp_logits", None)
    if nsp_logits is not None:
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["nsp_labels"],
                                   ignore_index=IGNORE_INDEX)
        loss = loss + nsp_loss
        stats["nsp_loss"] = nsp_loss.detach()
    stats["loss"] = loss.detach()
    # real tokens / row slots: what padding (or packing) leaves of a padded layout's work
    stats["row_fill"] = batch["attention_mask"].float().mean()
    return LossOutput(loss, stats, sequences=int(batch["nsp_labels"].shape[0]),
                      tokens=real_tokens(batch))


@torch.no_grad()
def evaluate(model: nn.Module, data: PretrainData, info: DistInfo, num_batches: int,
             autocast: Callable[[], ContextManager],
             loss: Callable[[nn.Module, Batch], LossOutput] = pretraining_loss,
             keys: tuple[str, ...] = ("loss", "mlm_loss", "mlm_acc")) -> dict[str, float]:
    """Means of the ``loss`` stats ``keys`` (as ``val_<key>``) over the first ``num_batches``
    validation micro-batches, the same batches at every evaluation."""
    model.eval()
    totals = torch.zeros(len(keys) + 1, device=info.device)   # the stats, batches
    for i, batch in enumerate(data.validation_batches()):
        if i == num_batches:
            break
        with autocast():
            stats = loss(model, to_device(batch, info.device)).stats
        totals += torch.stack([*(stats[k] for k in keys), torch.ones((), device=info.device)])
    totals = all_reduce_sum(totals)
    n = max(float(totals[-1]), 1.0)
    return {f"val_{k}": float(totals[i]) / n for i, k in enumerate(keys)}


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
    return instantiate(cls, config, source, cfg, data, device)


def instantiate(cls: Any, config: Any, source: Path | None, cfg: PretrainConfig,
                data: PretrainData, device: torch.device) -> nn.Module:
    """``cls`` with ``source``'s (finite) weights, else fresh from ``config`` seeded by
    ``train.seed``, on ``device``; refuses data longer than the model's positions and a model
    that cannot fit in the device's memory."""
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

class PretrainTask:
    """MLM (+ NSP/SOP) on prepared data; validation loss and MLM accuracy on its held-out split."""

    name = "pretraining"
    init_key = "init_from"
    stat_keys: tuple[str, ...] = ("loss", "mlm_loss", "mlm_acc")  # validation reports val_<key>

    def __init__(self, cfg: PretrainConfig, info: DistInfo, make_batch: MakeBatch | None = None):
        self.cfg, self.info = cfg, info
        self.data = open_pretrain_data(cfg, info, make_batch)
        self.train = self.data.train
        self.tokenizer = self.data.tokenizer

    @property
    def has_validation(self) -> bool:
        return self.data.has_validation

    def build_model(self, resume_from: Path | None) -> nn.Module:
        return build_model(self.cfg, self.data, resume_from, self.info.device)

    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        return pretraining_loss(model, batch)

    def evaluate(self, model: nn.Module, autocast: Callable[[], ContextManager]) -> dict:
        return evaluate(model, self.data, self.info, self.cfg.train.eval_batches, autocast,
                        self.loss, self.stat_keys)

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        return batch_train_flops(model.config, batch["attention_mask"],
                                 batch["mlm_labels"].ne(IGNORE_INDEX), self.data.has_pairs,
                                 layout_from_batch(batch))

    def finish(self, model: nn.Module, output_dir: Path, validation: dict) -> dict:
        return validation  # the final checkpoint is the product

    def describe(self, last: dict, validation: dict) -> list[str]:
        lines = []
        if last:
            lines.append(f"  last loss    {last.get('loss', float('nan')):.4f} "
                         f"(mlm {last.get('mlm_loss', float('nan')):.4f}, "
                         f"mlm acc {last.get('mlm_acc', float('nan')):.3f})")
        if validation:
            lines.append(f"  validation   loss {validation['val_loss']:.4f}, "
                         f"mlm acc {validation['val_mlm_acc']:.3f}")
        return lines


def pretraining_task(cfg: PretrainConfig, info: DistInfo):
    """BART denoising for data prepared with ``--objective denoise``, else BERT's MLM (+NSP)."""
    from bertforge.data import native

    path = Path(cfg.data.path) if cfg.data.path else None
    objective = None
    if path is not None and (path / native.MANIFEST_NAME).is_file():
        objective = native.read_manifest(path, native_only=False).get("objective")
    if objective == "denoise":
        from bertforge.tasks.denoise import DenoiseTask

        return DenoiseTask(cfg, info)
    from bertforge.models.auto import config_class
    from bertforge.models.bart_config import BartConfig

    model = cfg.init_from or cfg.model
    if config_class(model) is BartConfig:
        raise ConfigError(f"model {model} is a BART model but the data at {cfg.data.path} is "
                          f"not denoising data; prepare it with `bertforge prepare --objective "
                          "denoise` (and a BPE vocabulary), or choose a BERT model")
    return PretrainTask(cfg, info)


def pretrain(cfg: PretrainConfig) -> RunResult:
    """Run pretraining as ``cfg`` says; see docs/pretraining.md and docs/bart.md."""
    with distributed_run(cfg, "pretrain") as info:
        return run_task(pretraining_task(cfg, info), cfg, info)


def benchmark_pretraining(cfg: PretrainConfig) -> dict:
    """``bertforge pretrain --benchmark``: the benchmark.json report."""
    with distributed_run(cfg, "pretrain") as info:
        return benchmark_task(pretraining_task(cfg, info), cfg, info)
