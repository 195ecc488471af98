"""BART denoising pretraining as a task of the one runner (``bertforge.train.run``).

Data prepared with ``--objective denoise`` holds documents with their sentence boundaries; the
noise (sentence permutation, text infilling, ...) is drawn at load time per sample from
``sample_rng(seed, epoch, index)`` like BERT's masks, so it is independent of workers and ranks
and fresh every epoch (``bertforge.data.collate.seq2seq.DenoisingBatchMaker``). The model
reconstructs the original document: cross-entropy over every target token. This file decides
the model, the batches, the loss and what validation reports; starting weights and the
validation pass are shared with BERT's pretraining (``bertforge.tasks.stream``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from bertforge.config import PretrainConfig
from bertforge.data.batch import IGNORE_INDEX, Batch, LossOutput
from bertforge.data.noising import noise_vocab
from bertforge.errors import ConfigError
from bertforge.ops.loss import vocab_cross_entropy
from bertforge.ops.unpad import layout_from_batch
from bertforge.models.loading import ModelSource
from bertforge.tasks.stream import CorpusTask
from bertforge.train.data import MakeBatch, PreparedData
from bertforge.train.distributed import DistInfo
from bertforge.train.flops import seq2seq_train_flops


def seq2seq_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> LossOutput:
    """Cross-entropy of the decoder's predictions at every target token (mean over tokens);
    ``label_smoothing`` spreads that much probability mass uniformly over the vocabulary."""
    labels = batch["labels"]
    scored = labels.ne(IGNORE_INDEX)                  # (B, T)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=batch["decoder_input_ids"], target_positions=scored,
                   layout=layout_from_batch(batch)).logits  # (N, V)
    # fp32 loss, gradient in the logits' dtype, one pass over them (bertforge.ops.loss)
    target = labels[scored]
    loss, nll, correct = vocab_cross_entropy(logits, target, label_smoothing)
    stats = {"loss": loss.detach(), "token_acc": correct.float() / target.numel()}
    if label_smoothing:
        stats["nll"] = nll
    tokens = batch["attention_mask"].sum() + scored.sum()
    return LossOutput(loss, stats, sequences=int(labels.shape[0]), tokens=tokens)


def seq2seq_batch_flops(config: Any, batch: Batch) -> float:
    """Training FLOPs of a seq2seq micro-batch from its CPU tensors (benchmark MFU)."""
    return seq2seq_train_flops(config, batch["attention_mask"].sum(1),
                               batch["labels"].ne(IGNORE_INDEX).sum(1))


class DenoiseTask(CorpusTask):
    """BART denoising on ``--objective denoise`` data; validation reconstruction loss."""

    name = "denoising"
    stat_keys = ("loss", "token_acc")

    def __init__(self, cfg: PretrainConfig, info: DistInfo, spec: Any,
                 prepared: PreparedData) -> None:
        if prepared.tokenizer is None:
            raise ConfigError(f"{cfg.data.path}: denoising data must come from `bertforge "
                              "prepare` (its tokenizer is saved with it)")
        super().__init__(cfg, info, spec, prepared)

    def check_model(self, source: ModelSource) -> None:
        if not source.family.seq2seq:
            raise ConfigError(f"the data at {self.cfg.data.path} was prepared for BART denoising "
                              f"(--objective denoise) but model {source.name} is not a "
                              "BART model; use model=bart-base, bart-large, bart-tiny or a BART "
                              "directory")

    def batch_maker(self) -> MakeBatch:
        """The record's batch maker (``DenoisingBatchMaker``): noise drawn per sample, sources
        cut at the model's positions."""
        cfg, maker = self.cfg, self.spec.batches.load()
        noise_spec, positions = cfg.data.noise.spec(), self.source.config.max_position_embeddings

        def make_batch(dataset: Any, tokenizer: Any) -> Any:
            return maker(dataset, seed=cfg.train.seed, spec=noise_spec,
                         vocab=noise_vocab(tokenizer), pad_id=tokenizer.pad_id,
                         max_source_length=positions)
        return make_batch

    def fresh_config(self) -> dict[str, Any]:
        """Vocabulary size and special ids of the data's tokenizer."""
        tok = self.tokenizer
        return dict(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, bos_token_id=tok.cls_id,
                    eos_token_id=tok.sep_id, decoder_start_token_id=tok.sep_id,
                    forced_bos_token_id=tok.cls_id, forced_eos_token_id=tok.sep_id)

    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        return seq2seq_loss(model, batch)

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        return seq2seq_batch_flops(model.config, batch)

    def describe(self, last: dict, validation: dict) -> list[str]:
        lines = []
        if last:
            lines.append(f"  last loss    {last.get('loss', float('nan')):.4f} "
                         f"(token acc {last.get('token_acc', float('nan')):.3f})")
        if validation:
            lines.append(f"  validation   loss {validation['val_loss']:.4f}, "
                         f"token acc {validation['val_token_acc']:.3f}")
        return lines


__all__ = ["DenoiseTask", "cross_entropy", "seq2seq_batch_flops", "seq2seq_loss"]
