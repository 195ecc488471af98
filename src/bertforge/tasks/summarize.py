"""Summarization fine-tuning of BART: teacher-forced training, evaluation by generation and ROUGE.

Articles are cut to ``data.max_seq_length`` tokens (default 1024, BART's positions) and reference
summaries to ``data.max_target_length`` (default 256) for training, both within the model's
positions and checked with the generation settings before any data is read; the loss is token
cross-entropy with optional label smoothing (``train.label_smoothing``). Evaluation generates a summary for every
validation article (beam search with the model's generation settings and the recipe's
``eval.*`` overrides) and scores ROUGE-1/2/L/Lsum against all references. The fine-tuned
directory carries the generation settings it was evaluated with (generation_config.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
from torch import nn

from bertforge.core.limits import length_within
from bertforge.data.batch import Batch, LossOutput
from bertforge.data.finetuning.summarization import SummaryExample
from bertforge.errors import ConfigError
from bertforge.models.generation import GENERATION_CONFIG_NAME, GenerationConfig
from bertforge.models.generation.config import named_as
from bertforge.models.generation.texts import generate_texts, settings_for
from bertforge.runtime.guard import Probe, sequence_probe
from bertforge.tasks.denoise import seq2seq_batch_flops, seq2seq_loss
from bertforge.tasks.finetuning import Encoded, Examples, FinetuneTask, gather_outputs, unwrap

DEFAULT_TARGET_LENGTH = 256  # data.max_target_length when unset (the CNN/DailyMail recipe's)


class SummarizationTask(FinetuneTask):
    """The evaluation features are the encoded articles; references stay text (ROUGE reads
    text)."""

    # -- data -------------------------------------------------------------------------------
    def _read(self, path: str | None, require: bool, limit: int | None) -> list | None:
        if path is None:
            return None
        return self.spec.reader.load()(path, article_field=self.cfg.data.article_field,
                                       summary_field=self.cfg.data.summary_field,
                                       require_summaries=require, max_examples=limit)

    def read(self) -> Examples:
        data = self.cfg.data
        return Examples(self._read(data.train, True, data.max_train_examples),
                        self._read(data.validation, self.labelled, data.max_eval_examples))

    def _encode(self, texts: list[str], max_length: int) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int64)
                for ids in self.tokenizer.encode_truncated(texts, max_length)]

    def encode(self, examples: Sequence[SummaryExample], training: bool) -> Encoded:
        sources = self._encode([e.article for e in examples], self.max_seq_length)
        if not training:
            return Encoded(sources)
        targets = self._encode([e.summary or "" for e in examples], self.max_target_length)
        return Encoded(self.batches(sources, targets, pad_id=self.tokenizer.pad_id,
                                    decoder_start_id=self.source.config.decoder_start_token_id))

    def check_settings(self) -> None:
        """Target and generation lengths within the decoder's positions, and the generation
        settings valid with the model's own: checked before data is read, not after training."""
        config = self.source.config
        self.max_target_length = length_within(
            self.cfg.data.max_target_length, "data.max_target_length", DEFAULT_TARGET_LENGTH,
            config.max_position_embeddings, ConfigError)
        saved = (GenerationConfig.load(self.source.directory)
                 if (self.source.directory / GENERATION_CONFIG_NAME).is_file() else None)
        self._settings(config, saved)

    def _settings(self, config: Any, saved: GenerationConfig | None) -> GenerationConfig:
        try:
            return settings_for(config, saved, self.cfg.eval.generation_overrides(),
                                source=str(self.cfg.model),
                                default_max_length=self.max_target_length)
        except ConfigError as exc:
            raise named_as(exc, lambda name: self.cfg.eval.key_prefix + name) from None

    # -- training ---------------------------------------------------------------------------
    def model_overrides(self) -> dict[str, Any]:
        return {"finetuning_task": "summarization"}

    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        return seq2seq_loss(model, batch, self.cfg.train.label_smoothing)

    def batch_flops(self, model: nn.Module, batch: Batch) -> float:
        return seq2seq_batch_flops(unwrap(model).config, batch)

    # -- evaluation -------------------------------------------------------------------------
    def generation(self, model: nn.Module) -> GenerationConfig:
        """The settings evaluation generates with (and the fine-tuned model keeps)."""
        inner = unwrap(model)
        return self._settings(inner.config, inner.generation_config)

    def evaluation_probe(self) -> Probe | None:
        """The quality guard's probe: the longest articles, cut short (``sequence_probe``)."""
        return sequence_probe(self.features.evaluation.features, self.tokenizer.pad_id,
                              self.info.device)

    def collect(self, model: nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, np.ndarray]:
        """A summary of every evaluation article (ranks split them), gathered in order."""
        inner = unwrap(model)
        sources = self.features.evaluation.features
        share = np.array_split(np.arange(len(sources)), self.info.world_size)
        mine = generate_texts(inner, self.tokenizer,
                              [sources[i] for i in share[self.info.rank]],
                              self.generation(model), batch_size=self.cfg.eval.batch_size,
                              device=self.info.device, autocast=autocast,
                              progress=self.info.is_main)
        return gather_outputs({"summaries": np.array(mine, dtype=object)}, self.info)

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        references = [e.references for e in self.examples.evaluation]
        scores = self.spec.metric.load()(list(outputs["summaries"]), references)
        metrics = {k: scores[k] for k in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
        words = [len(s.split()) for s in outputs["summaries"]]
        metrics["summary_words"] = float(np.mean(words)) if words else 0.0
        return metrics

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        return [{"id": e.id, "summary": s}
                for e, s in zip(self.examples.evaluation, outputs["summaries"])]

    def finish(self, model: nn.Module, output_dir: Path, validation: dict) -> dict:
        unwrap(model).generation_config = self.generation(model)  # saved with the model
        return super().finish(model, output_dir, validation)


__all__ = ["SummarizationTask"]
