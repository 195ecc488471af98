"""sentence-similarity: train an embedding model (a bi-encoder) from any encoder bertforge knows.

Rows of (anchor, positive[, hard negatives]) train with in-batch negatives (InfoNCE), scored
pairs with CoSENT, rows with teacher margins with MarginMSE (``embedding.loss=auto`` picks by the
data's columns, ``bertforge.data.finetuning.pairs``). Every text of a micro-batch runs through
the encoder in one pass (``TextGroups``: column by column, unpadded), is pooled
(``embedding.pooling``) and, with ``embedding.normalize``, scaled to unit length; the losses
(``tasks/embedding_losses.py``) see (B, D) columns. ``embedding.cache_chunk`` computes the
vectors in chunks without keeping activations and replays each chunk in backward (GradCache),
so memory no longer grows with the batch; ``embedding.matryoshka_dims`` adds the loss of every
prefix size. Under DDP each anchor is scored against the candidates of all ranks.

The output directory is a sentence-transformers model (pooling, normalization, prompts and
Matryoshka sizes saved with it): ``SentenceTransformer(OUT)`` encodes as training did,
``bertforge serve`` serves it and ``bertforge export onnx`` exports it. With validation data,
``OUT/best`` holds the weights of the best evaluation (docs/embeddings.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np
import torch
from torch import nn

from bertforge.core.io import temp_name, write_json_atomic
from bertforge.data.batch import Batch, LossOutput, real_tokens
from bertforge.data.collate.texts import TextGroups
from bertforge.data.finetuning.pairs import TextRows
from bertforge.core.jsonfile import read_json_object
from bertforge.errors import CheckpointError, ConfigError
from bertforge.export.sentence_transformers import (saved_max_seq_length,
                                                    write_sentence_transformers_files)
from bertforge.ops.pooling import finish, pool
from bertforge.tasks import embedding_losses as losses
from bertforge.tasks.embedding_cache import cached_embeddings
from bertforge.tasks.embedding_eval import embed_texts, score_validation, validation_of
from bertforge.tasks.finetuning import RESULTS_FILE, Encoded, Examples, FinetuneTask, unwrap
from bertforge.tasks.settings import check_task_settings
from bertforge.train.distributed import gather_full_model, is_sharded

BEST_DIR = "best"
# The loss each kind of training row takes with embedding.loss=auto, and the kinds each loss
# accepts.
AUTO_LOSS = {"pairs": "infonce", "triplets": "infonce", "scored": "cosent"}
LOSS_KINDS = {"infonce": ("pairs", "triplets"), "cosent": ("scored",),
              "margin-mse": ("triplets",)}


def choose_loss(asked: str, rows: TextRows) -> str:
    """The loss for ``rows`` (``embedding.loss``: "auto" picks by the data); ConfigError when the
    data cannot train the loss asked for."""
    if asked == "auto":
        return "margin-mse" if rows.margins is not None else AUTO_LOSS[rows.kind]
    if asked not in LOSS_KINDS:
        raise ConfigError(f"embedding.loss={asked} trains rerankers (task text-ranking); "
                          f"sentence-similarity takes {', '.join(['auto', *LOSS_KINDS])}")
    if rows.kind not in LOSS_KINDS[asked] or (asked == "margin-mse" and rows.margins is None):
        need = {"infonce": "(anchor, positive[, negatives]) rows",
                "cosent": "scored pairs (sentence1, sentence2, score)",
                "margin-mse": "(query, positive, negatives) rows with teacher scores (a label "
                              "column, or FlagEmbedding's pos_scores/neg_scores)"}[asked]
        raise ConfigError(f"embedding.loss={asked} needs {need}, but {rows.source} holds "
                          f"{rows.kind} rows ({', '.join(rows.columns)}); use "
                          "embedding.loss=auto")
    return asked


class SentenceSimilarityTask(FinetuneTask):
    """Facts of its examples: ``loss`` (the loss its rows train with)."""

    supports_fsdp = True  # every rank evaluates; the model is gathered whole before a save

    def check_settings(self) -> None:
        check_task_settings(self.cfg, self.spec.name)  # embedding.*: its rules and check()
        e = self.cfg.embedding
        saved = saved_max_seq_length(self.source.directory)
        if self.cfg.data.max_seq_length is None and saved is not None:
            # A sentence-transformers model's own length (all-MiniLM-L6-v2: 256), as its
            # trainer would keep it, instead of the task's default of 128.
            self.max_seq_length = min(saved, self.source.config.max_position_embeddings)
        hidden = self.source.config.hidden_size
        if e.matryoshka_dims and max(e.matryoshka_dims) > hidden:
            raise ConfigError(f"embedding.matryoshka_dims {list(e.matryoshka_dims)} go beyond "
                              f"the model's {hidden} dimensions")
        self.best: dict[str, Any] | None = None  # metrics of the best evaluation so far

    def build_model(self, resume_from: Path | None) -> nn.Module:
        """The encoder; BERT's pooler (a dense layer over [CLS] that no pooling mode reads) is
        frozen, so it is saved as it came and DDP finds no parameter without a gradient."""
        model = super().build_model(resume_from)
        if getattr(model, "pooler", None) is not None:
            model.pooler.requires_grad_(False)
        best = self.output_dir() / BEST_DIR / RESULTS_FILE
        if resume_from is not None and best.is_file():  # the best so far, before the stop
            self.best = read_json_object(best, error=CheckpointError)
        return model

    # -- data ---------------------------------------------------------------------------------
    def read(self) -> Examples:
        d, read = self.cfg.data, self.spec.reader.load()
        train = read(d.train, max_rows=d.max_train_examples) if d.train else None
        facts = {"loss": choose_loss(self.cfg.embedding.loss, train) if train else None}
        if d.validation is None:
            return Examples(train, None, facts)
        return Examples(train, validation_of(d.validation, read, d.max_eval_examples), facts)

    def encode(self, examples: Any, training: bool) -> Encoded:
        if not training:  # validation texts are embedded when scored (they have no batches)
            return Encoded(examples)
        rows: TextRows = examples
        e = self.cfg.embedding
        prompts = [e.query_prompt or ""] + [e.passage_prompt or ""] * (len(rows.columns) - 1)
        index: dict[str, int] = {}
        table = np.array([[index.setdefault(prompts[c] + text, len(index))
                           for c, text in enumerate(row)] for row in rows.texts], dtype=np.int64)
        windows = self.tokenizer.encode_windows(list(index), max_length=self.max_seq_length)
        tokens = self.tokenizer.pad_windows(windows, self.max_seq_length)
        values = {}
        if rows.scores is not None:
            values["scores"] = np.asarray(rows.scores, dtype=np.float32)
        if rows.margins is not None:
            values["margins"] = np.asarray(rows.margins, dtype=np.float32)
        return Encoded(TextGroups(tokens, table, values, no_duplicates=e.no_duplicates
                                  and self.examples.facts["loss"] == "infonce"))

    # -- training -----------------------------------------------------------------------------
    def encode_texts(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(n, D) vectors of the (n, S) texts of ``inputs``, as the saved model gives them."""
        hidden = model(**inputs).last_hidden_state
        return finish(pool(hidden, inputs["attention_mask"], self.cfg.embedding.pooling),
                      self.cfg.embedding.normalize)

    def loss(self, model: nn.Module, batch: Batch) -> LossOutput:
        e = self.cfg.embedding
        inputs = self.model_inputs(batch)
        if e.cache_chunk:
            vectors = cached_embeddings(lambda part: self.encode_texts(model, part), inputs,
                                        e.cache_chunk, model)
        else:
            vectors = self.encode_texts(model, inputs)
        rows = len(batch["input_ids"]) // self.features.train.features.columns
        columns = list(vectors.float().unflatten(0, (-1, rows)))  # m x (B, D)
        loss_of = self.loss_function(batch)
        if e.matryoshka_dims:
            loss, stats = losses.matryoshka(loss_of, columns, e.matryoshka_dims)
        else:
            loss, stats = loss_of(columns)
        return LossOutput(loss, stats, sequences=rows, tokens=real_tokens(batch))

    def loss_function(self, batch: Batch) -> Callable[[list[torch.Tensor]], Any]:
        """The task's loss of m (B, D) columns (for the full vectors or a Matryoshka prefix)."""
        e, name = self.cfg.embedding, self.examples.facts["loss"]
        if name == "cosent":
            return lambda c: losses.cosent(c[0], c[1], batch["scores"], scale=e.scale,
                                           gather=e.gather)
        if name == "margin-mse":
            return lambda c: losses.margin_mse(c[0], c[1], torch.stack(c[2:], 1),
                                               batch["margins"])
        return lambda c: losses.info_nce(c[0], c[1:], scale=e.scale, symmetric=e.symmetric,
                                         gather=e.gather)

    # -- evaluation ---------------------------------------------------------------------------
    def embedder(self, model: nn.Module,
                 autocast: Callable[[], ContextManager]) -> Callable[[list[str], str], np.ndarray]:
        e = self.cfg.embedding
        prompts = {"query": e.query_prompt, "document": e.passage_prompt}

        def embed(texts: list[str], role: str) -> np.ndarray:
            return embed_texts(unwrap(model), self.tokenizer, texts,
                               max_length=self.max_seq_length, inputs=self.source.family.inputs,
                               batch_size=self.cfg.eval.batch_size, device=self.info.device,
                               autocast=autocast, pooling=e.pooling, normalize=e.normalize,
                               prompt=prompts[role])
        return embed

    def collect(self, model: nn.Module,
                autocast: Callable[[], ContextManager]) -> dict[str, Any]:
        metrics = score_validation(self.examples.evaluation, self.embedder(model, autocast))
        primary = self.primary(metrics)
        if self.cfg.data.train and (self.best is None or metrics[primary] > self.best[primary]):
            self.best = metrics
            self.save_model(model, self.output_dir() / BEST_DIR, metrics)
        return {"metrics": metrics}

    def primary(self, metrics: dict[str, float]) -> str:
        """The metric that picks the best model: nDCG@10, or Spearman for STS validation."""
        return self.spec.primary_metric if self.spec.primary_metric in metrics else \
            next(iter(metrics))

    def score(self, outputs: dict[str, Any]) -> dict:
        return dict(outputs["metrics"])

    # -- outputs ------------------------------------------------------------------------------
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    def whole_model(self, model: nn.Module) -> nn.Module | None:
        """The trained model, unsharded, on rank 0 (None on the others). A collective under
        ``train.fsdp``: every rank calls it."""
        if is_sharded(model):
            return gather_full_model(model)
        return unwrap(model) if self.info.is_main else None

    def write_model(self, model: nn.Module, directory: Path) -> None:
        """The (whole) model and its sentence-transformers files (pooling, normalization,
        prompts, Matryoshka sizes, max_seq_length) in ``directory``."""
        e = self.cfg.embedding
        model.save_pretrained(directory, tokenizer=self.tokenizer)
        prompts = {k: v for k, v in (("query", e.query_prompt), ("document", e.passage_prompt))
                   if v}
        write_sentence_transformers_files(
            directory, pooling=e.pooling, normalize=e.normalize,
            dimensions=self.source.config.hidden_size, max_seq_length=self.max_seq_length,
            prompts=prompts or None, matryoshka_dims=e.matryoshka_dims)

    def save_model(self, model: nn.Module, directory: Path, metrics: dict) -> None:
        """``write_model`` under a temporary name, renamed when whole (rank 0): an interrupted
        save leaves the previous ``directory`` as it was. Every rank calls it."""
        whole = self.whole_model(model)
        if whole is None:
            return
        work = temp_name(directory)
        try:
            self.write_model(whole, work)
            write_json_atomic(work / RESULTS_FILE, metrics, sort_keys=False)
            if directory.exists():
                shutil.rmtree(directory)
            os.replace(work, directory)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def finish(self, model: nn.Module, output_dir: Path, validation: dict) -> dict:
        self.write_outputs(output_dir, validation)
        whole = self.whole_model(model)
        if whole is not None:  # OUT itself is the final model
            self.write_model(whole, output_dir)
        return validation

    def describe(self, last: dict, validation: dict) -> list[str]:
        lines = super().describe(last, validation)
        lines[-1] = f"  model        {self.cfg.output_dir} (sentence-transformers and Hugging Face)"
        if self.best is not None:
            key = self.primary(self.best)
            lines.append(f"  best         {key} {self.best[key]:.4g}: "
                         f"{self.output_dir() / BEST_DIR}")
        return lines

    def write_predictions(self, output_dir: Path, outputs: dict[str, Any]) -> None:
        """Retrieval and STS write no predictions file: the metrics are the output."""


__all__ = ["BEST_DIR", "SentenceSimilarityTask", "choose_loss"]
