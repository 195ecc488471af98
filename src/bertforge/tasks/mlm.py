"""BERT pretraining (masked LM, with NSP or SOP on sentence pairs) as a task of the one runner.

This file decides the head (MLM + NSP/SOP, or MLM only when the data has no sentence pairs),
the loss, and what validation reports; the starting weights and validation pass are shared with
BART's denoising (``bertforge.tasks.stream``), and the runner does the rest.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from bertforge.data.batch import IGNORE_INDEX, Batch, LossOutput, real_tokens
from bertforge.errors import ConfigError
from bertforge.ops.loss import vocab_cross_entropy
from bertforge.ops.unpad import layout_from_batch
from bertforge.models.loading import ModelSource
from bertforge.models.registry import family_of_config
from bertforge.speed import read_positions
from bertforge.tasks.stream import CorpusTask
from bertforge.train.flops import batch_train_flops


def _takes_token_types(model: nn.Module) -> bool:
    """Whether the model's family takes token type ids (BERT does; ModernBERT has none), read
    from its config through a DDP wrapper."""
    config = getattr(getattr(model, "module", model), "config", None)
    if getattr(type(config), "model_type", None) is None:  # not a family's model (a test's)
        return True
    return "token_type_ids" in family_of_config(config).inputs


def pretraining_loss(model: nn.Module, batch: Batch) -> LossOutput:
    """MLM cross-entropy at the masked positions only (+ NSP/SOP when the batch has labels).

    The loader's batches say where the predicted tokens are (``mlm_positions``) and carry
    their ``TokenLayout``, so this loss and the model need no host-device sync; a batch without
    them (e.g. made by hand) costs the syncs of finding them. Token type ids go to models
    whose family takes them.
    """
    labels = batch["mlm_labels"]
    masked = batch.get("mlm_positions")            # (N,) flat positions, row-major
    if masked is None:
        masked = labels.ne(IGNORE_INDEX)           # (B, S)
        target = labels[masked]
    else:
        target = labels.reshape(-1).index_select(0, masked)  # (N,) in the head's order
    types = {"token_type_ids": batch["token_type_ids"]} if _takes_token_types(model) else {}
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], **types,
                masked_positions=masked, position_ids=batch.get("position_ids"),
                layout=layout_from_batch(batch))
    logits = getattr(out, "mlm_logits", None)
    logits = out.logits if logits is None else logits   # (N, V), N = masked tokens
    # fp32 loss, gradient in the logits' dtype, one pass over them (bertforge.ops.loss)
    mlm_loss, _, correct = vocab_cross_entropy(logits, target)
    stats = {"mlm_loss": mlm_loss.detach(), "mlm_acc": correct.float() / target.numel()}
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


class PretrainTask(CorpusTask):
    """MLM (+ NSP/SOP) on prepared data; validation loss and MLM accuracy on its held-out split."""

    name = "pretraining"
    stat_keys = ("loss", "mlm_loss", "mlm_acc")

    def check_model(self, source: ModelSource) -> None:
        if source.family.seq2seq:
            raise ConfigError(f"model {source.name} is a {source.family.name} model but the data "
                              f"at {self.cfg.data.path} is not denoising data; prepare it with "
                              "`bertforge prepare --objective denoise` (and a BPE vocabulary), "
                              "or choose a BERT model")
        objective = self.prepared.objective
        if objective not in ("nsp", "sop"):
            return
        # Sentence-pair data trains a pair head (NSP/SOP) beside the masked LM: the model must
        # have one, and a checkpoint that is continued must hold its weights.
        if "pretraining" not in source.family.heads:
            lacks = f"{source.family.name} models have no {objective.upper()} head"
        elif source.directory is not None and source.head not in (None, "pretraining"):
            lacks = (f"{source.directory} is a {'/'.join(source.config.architectures or ())} "
                     f"checkpoint, without an {objective.upper()} head")
        else:
            return
        raise ConfigError(f"{lacks}; {self.missing_head_remedy()}")

    def missing_head_remedy(self) -> str | None:
        """For sentence-pair data: prepare it for the masked LM alone, or take a pair head."""
        objective = self.prepared.objective
        if objective not in ("nsp", "sop"):
            return None
        return (f"the data at {self.cfg.data.path} was prepared as sentence pairs for "
                f"{objective.upper()} (--objective {objective}): prepare it again for the "
                "masked LM alone with `bertforge prepare --objective none` (same inputs and "
                "vocabulary), or start from a model with the pair head (BertForPreTraining)")

    def fresh_config(self) -> dict[str, Any]:
        """Vocabulary size, casing and special ids of the prepared data (those it records; the
        model family's config takes the fields it has)."""
        data, ids = self.data, self.data.special_ids
        return {k: v for k, v in (("vocab_size", data.vocab_size),
                                  ("do_lower_case", data.do_lower_case),
                                  ("pad_token_id", data.pad_id),
                                  ("cls_token_id", ids.get("cls")), ("bos_token_id", ids.get("cls")),
                                  ("sep_token_id", ids.get("sep")), ("eos_token_id", ids.get("sep")))
                if v is not None}

    def model_head(self) -> str:
        """MLM + NSP/SOP, or MLM only when the data has no sentence pairs."""
        return "pretraining" if self.data.has_pairs else "masked-lm"

    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        return pretraining_loss(model, batch)

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        return batch_train_flops(model.config, batch["attention_mask"],
                                 batch["mlm_labels"].ne(IGNORE_INDEX), self.data.has_pairs,
                                 layout_from_batch(batch),
                                 read=read_positions(model))

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


__all__ = ["PretrainTask", "pretraining_loss"]
