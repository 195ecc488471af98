"""BART denoising pretraining as a task of the one runner (``bertforge.train.run``).

Data prepared with ``--objective denoise`` holds documents with their sentence boundaries; the
noise (sentence permutation, text infilling, ...) is drawn at load time per sample from
``sample_rng(seed, epoch, index)`` like BERT's masks, so it is independent of workers and ranks
and fresh every epoch. The model reconstructs the original document: cross-entropy over every
target token. This file decides the model, its starting weights, the batches, loss and
validation; the runner does the rest, as for BERT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.data.batch import IGNORE_INDEX, Batch, LossOutput
from bertforge.config import PretrainConfig
from bertforge.data.masking import normalize_special_ids, sample_rng
from bertforge.data.noising import NoiseSpec, NoiseVocab, noise
from bertforge.data.seq2seq import collate_seq2seq, truncate_framed
from bertforge.errors import ConfigError
from bertforge.models.unpad import layout_from_batch
from bertforge.tasks.pretrain import PretrainTask, instantiate
from bertforge.train.data import PretrainData
from bertforge.train.distributed import DistInfo
from bertforge.train.flops import seq2seq_train_flops
from bertforge.train.guards import check_vocab
from bertforge.train.resume import verify_model_files


def noise_vocab(tokenizer: Any) -> NoiseVocab:
    """What noising needs from the data's tokenizer (its specials, mask id and word starts)."""
    specials = normalize_special_ids([tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id,
                                      tokenizer.sep_id, tokenizer.mask_id])
    starts = getattr(tokenizer, "is_word_start", None)
    if starts is None and getattr(tokenizer, "is_continuation", None) is not None:
        starts = ~tokenizer.is_continuation  # WordPiece: a word starts where "##" pieces do not
    return NoiseVocab(mask_id=int(tokenizer.mask_id), bos_id=int(tokenizer.cls_id),
                      eos_id=int(tokenizer.sep_id), vocab_size=int(tokenizer.vocab_size),
                      special_ids=specials, is_word_start=starts)


class DenoisingBatchMaker(torch.utils.data.Dataset):
    """(epoch, sample indices) -> a noised seq2seq micro-batch; runs in loader workers.

    Sources longer than ``max_source_length`` (insertion noise can lengthen a document) are cut,
    keeping their final ``</s>``.
    """

    def __init__(self, dataset: Any, *, seed: int, spec: NoiseSpec, vocab: NoiseVocab,
                 pad_id: int, max_source_length: int, pad_to_multiple_of: int = 8) -> None:
        self.dataset, self.seed, self.spec, self.vocab = dataset, seed, spec, vocab
        self.pad_id, self.max_source_length = pad_id, max_source_length
        self.pad_to_multiple_of = pad_to_multiple_of

    def pair(self, index: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(noised source, original target) of sample ``index`` in ``epoch``, int64."""
        tokens, ends = self.dataset.get_sentences(index)
        target = np.asarray(tokens, dtype=np.int64)
        source = noise(target, ends, sample_rng(self.seed, epoch, index), self.spec, self.vocab)
        return truncate_framed(source, self.max_source_length), target

    def __getitem__(self, key: tuple[int, np.ndarray]) -> dict[str, torch.Tensor]:
        epoch, indices = key
        pairs = [self.pair(int(i), epoch) for i in indices]
        return collate_seq2seq([p[0] for p in pairs], [p[1] for p in pairs], pad_id=self.pad_id,
                               decoder_start_id=self.vocab.eos_id,
                               pad_to_multiple_of=self.pad_to_multiple_of)


def seq2seq_loss(model: nn.Module, batch: Batch, label_smoothing: float = 0.0) -> LossOutput:
    """Cross-entropy of the decoder's predictions at every target token (mean over tokens);
    ``label_smoothing`` spreads that much probability mass uniformly over the vocabulary."""
    labels = batch["labels"]
    scored = labels.ne(IGNORE_INDEX)                  # (B, T)
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=batch["decoder_input_ids"], target_positions=scored,
                   layout=layout_from_batch(batch)).logits.float()  # (N, V)
    target = labels[scored]
    loss = F.cross_entropy(logits, target, label_smoothing=label_smoothing)
    stats = {"loss": loss.detach(),
             "token_acc": (logits.detach().argmax(-1) == target).float().mean()}
    if label_smoothing:
        stats["nll"] = F.cross_entropy(logits.detach(), target)
    tokens = batch["attention_mask"].sum() + scored.sum()
    return LossOutput(loss, stats, sequences=int(labels.shape[0]), tokens=tokens)


def seq2seq_batch_flops(config: Any, batch: Batch) -> float:
    """Training FLOPs of a seq2seq micro-batch from its CPU tensors (benchmark MFU)."""
    return seq2seq_train_flops(config, batch["attention_mask"].sum(1),
                               batch["labels"].ne(IGNORE_INDEX).sum(1))


def build_bart(cfg: PretrainConfig, data: PretrainData, resume_from: Path | None,
               device: torch.device) -> nn.Module:
    """The checkpoint being resumed, else ``init_from`` weights, else a fresh model whose
    vocabulary and special ids come from the data's tokenizer."""
    from bertforge.models.auto import config_class
    from bertforge.models.bart import BartConfig, BartForConditionalGeneration

    source = resume_from or (Path(cfg.init_from) if cfg.init_from else None)
    where = source or cfg.model
    if config_class(where) is not BartConfig:
        raise ConfigError(f"the data at {cfg.data.path} was prepared for BART denoising "
                          f"(--objective denoise) but model {where} is not a BART model; use "
                          "model=bart-base, bart-large, bart-tiny or a BART directory")
    tok = data.tokenizer
    if source is not None:
        if source != resume_from:
            verify_model_files(source)
        config = BartConfig.load(source)
        if config.vocab_size != tok.vocab_size:
            raise ConfigError(f"{source} has vocab_size {config.vocab_size} but the data at "
                              f"{cfg.data.path} was prepared with {tok.vocab_size} tokens; "
                              "prepare the data with the model's tokenizer")
        check_vocab(source, tok.vocab, cfg.data.path)
    else:
        config = BartConfig.load(cfg.model).replace(
            vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, bos_token_id=tok.cls_id,
            eos_token_id=tok.sep_id, decoder_start_token_id=tok.sep_id,
            forced_bos_token_id=tok.cls_id, forced_eos_token_id=tok.sep_id)
    return instantiate(BartForConditionalGeneration, config, source, cfg, data, device)

class DenoiseTask(PretrainTask):
    """BART denoising on ``--objective denoise`` data; validation reconstruction loss. What it
    shares with BERT pretraining (data streams, validation, outputs) is ``PretrainTask``'s."""

    name = "denoising"
    stat_keys = ("loss", "token_acc")

    def __init__(self, cfg: PretrainConfig, info: DistInfo) -> None:
        spec = cfg.data.noise.spec()
        max_source_length = self.max_source_length(cfg)

        def make_batch(dataset: Any, tokenizer: Any) -> DenoisingBatchMaker:
            return DenoisingBatchMaker(dataset, seed=cfg.train.seed, spec=spec,
                                       vocab=noise_vocab(tokenizer), pad_id=tokenizer.pad_id,
                                       max_source_length=max_source_length)

        super().__init__(cfg, info, make_batch)
        if self.tokenizer is None:
            raise ConfigError(f"{cfg.data.path}: denoising data must come from `bertforge "
                              "prepare` (its tokenizer is saved with it)")

    @staticmethod
    def max_source_length(cfg: PretrainConfig) -> int:
        """Positions of the model named by ``cfg`` (the longest source it can encode)."""
        from bertforge.models.auto import load_config

        # A resumed run has the same model (a run-defining key), so its config says the same.
        return load_config(cfg.init_from or cfg.model).max_position_embeddings

    def build_model(self, resume_from: Path | None) -> nn.Module:
        return build_bart(self.cfg, self.data, resume_from, self.info.device)

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
