"""text-ranking: train a reranker (a cross-encoder) that scores a (query, passage) pair with one
logit.

Pointwise rows (query, passage, label in [0, 1]) train with binary cross-entropy on the logit;
listwise rows (query, positive, negatives...) with softmax cross-entropy over each query's
passages, the positive first (``embedding.loss=auto`` picks by the rows,
``bertforge.data.finetuning.pairs.read_ranking``). Validation rows are ranked per query by the
model and scored with the retrieval metrics (nDCG@10 first). The output is a 1-label sequence
classifier that sentence-transformers' ``CrossEncoder`` loads (sigmoid of the logit) and that
``bertforge serve`` uses for ``/rerank``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertforge.data.batch import Batch, LossOutput, real_tokens
from bertforge.data.finetuning.pairs import TextRows
from bertforge.errors import ConfigError
from bertforge.tasks.classify import sequence_arrays
from bertforge.tasks.finetuning import EncoderTask, Encoded, Examples
from bertforge.tasks.settings import check_task_settings

RANKING_LOSSES = {"bce": "pointwise", "listwise": "listwise"}


def ranking_loss(asked: str, rows: TextRows) -> str:
    """``bce`` for pointwise rows, ``listwise`` for (query, positive, negatives) rows;
    ConfigError for a loss the rows cannot train."""
    name = {"pointwise": "bce", "listwise": "listwise"}[rows.kind] if asked == "auto" else asked
    if RANKING_LOSSES.get(name) != rows.kind:
        raise ConfigError(f"embedding.loss={asked} cannot train text-ranking on {rows.source}: "
                          f"it holds {rows.kind} rows ({', '.join(rows.columns)}); bce takes "
                          "(query, passage, label) rows, listwise (query, positive, negatives)")
    if rows.kind == "listwise" and len(rows.columns) < 3:
        raise ConfigError(f"{rows.source} holds (query, positive) rows without negatives: a "
                          "reranker learns from passages to rank below the positive; add "
                          "negatives (bertforge mine writes them) or give labelled pairs")
    return name


def ranked_pairs(rows: TextRows) -> tuple[list[tuple[str, str]], list[str], list[float]]:
    """Every (query, passage) pair of validation ``rows`` with its query's text and its gold
    relevance (pointwise: the label; listwise: 1 for the positive, 0 for the negatives)."""
    pairs, queries, gold = [], [], []
    for i, texts in enumerate(rows.texts):
        if rows.kind == "pointwise":
            pairs.append((texts[0], texts[1]))
            queries.append(texts[0])
            gold.append(float(rows.scores[i]))
        else:
            for j, passage in enumerate(texts[1:]):
                pairs.append((texts[0], passage))
                queries.append(texts[0])
                gold.append(1.0 if j == 0 else 0.0)
    return pairs, queries, gold


class TextRankingTask(EncoderTask):
    """Facts of its examples: ``loss`` ("bce" or "listwise")."""

    def check_settings(self) -> None:
        check_task_settings(self.cfg, self.spec.name)  # embedding.*: its rules and check()

    def read(self) -> Examples:
        d, read = self.cfg.data, self.spec.reader.load()
        train = read(d.train, max_rows=d.max_train_examples) if d.train else None
        evaluation = read(d.validation, max_rows=d.max_eval_examples) if d.validation else None
        loss = ranking_loss(self.cfg.embedding.loss, train) if train is not None else None
        return Examples(train, evaluation, {"loss": loss})

    def encode(self, examples: TextRows, training: bool) -> Encoded:
        if not training:  # every (query, passage) pair, scored one by one
            pairs, queries, gold = ranked_pairs(examples)
            arrays = sequence_arrays(self.tokenizer, [q for q, _ in pairs], [p for _, p in pairs],
                                     self.max_seq_length, (len(pairs),))
            return Encoded(self.batches(arrays), alignment=(queries, gold))
        firsts = [t[0] for t in examples.texts for _ in t[1:]]
        seconds = [p for t in examples.texts for p in t[1:]]
        shape = (len(examples.texts),) + ((len(examples.columns) - 1,)
                                          if examples.kind == "listwise" else ())
        arrays = sequence_arrays(self.tokenizer, firsts, seconds, self.max_seq_length, shape)
        if examples.kind == "pointwise":
            arrays["labels"] = np.asarray(examples.scores, dtype=np.float32)
        return Encoded(self.batches(arrays))

    def loss(self, model: torch.nn.Module, batch: Batch) -> LossOutput:
        inputs = self.model_inputs(batch)
        rows = len(inputs["input_ids"])
        if self.examples.facts["loss"] == "bce":
            logits = model(**inputs).logits.float().squeeze(-1)  # (B,)
            loss = F.binary_cross_entropy_with_logits(logits, batch["labels"].float())
            return LossOutput(loss, {"loss": loss.detach()}, sequences=rows,
                              tokens=real_tokens(batch))
        # (B, C, S) -> (B * C, S): each pair is one sequence; (B * C, 1) logits -> (B, C).
        flat = {k: v.flatten(0, 1) for k, v in inputs.items()}
        logits = model(**flat).logits.float().view(rows, -1)
        target = torch.zeros(rows, dtype=torch.long, device=logits.device)  # positive first
        loss = F.cross_entropy(logits, target)
        acc = (logits.detach().argmax(-1) == 0).float().mean()
        return LossOutput(loss, {"loss": loss.detach(), "acc": acc}, sequences=rows,
                          tokens=real_tokens(batch))

    def outputs(self, out: Any, batch: Batch) -> dict[str, torch.Tensor]:
        return {"logits": out.logits}

    def score(self, outputs: dict[str, np.ndarray]) -> dict:
        queries, gold = self.features.evaluation.alignment
        scores = outputs["logits"][:, 0]
        qids = {q: f"q{i}" for i, q in enumerate(dict.fromkeys(queries))}
        run: dict[str, dict[str, float]] = {}
        qrels: dict[str, dict[str, int]] = {}
        for i, (query, relevance) in enumerate(zip(queries, gold)):
            run.setdefault(qids[query], {})[f"p{i}"] = float(scores[i])
            qrels.setdefault(qids[query], {})[f"p{i}"] = int(relevance >= 0.5)
        return self.spec.metric.load()(run, qrels)

    def prediction_rows(self, outputs: dict[str, np.ndarray]) -> list[dict]:
        queries, _ = self.features.evaluation.alignment
        return [{"query": q, "score": float(s)} for q, s in zip(queries, outputs["logits"][:, 0])]

    def model_overrides(self) -> dict[str, Any]:
        return {"num_labels": 1, "id2label": None, "problem_type": None,
                "finetuning_task": "text-ranking"}


__all__ = ["TextRankingTask", "ranked_pairs", "ranking_loss"]
