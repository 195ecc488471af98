"""What the embedding and reranker tasks are scored on while they train, and how their model in
memory is run for it.

A validation set is one of three things (``data.validation``):
- a BEIR directory (corpus.jsonl, queries.jsonl, qrels/dev.tsv or qrels/test.tsv): retrieval
  metrics, nDCG@10 first;
- a file of scored pairs (sentence1, sentence2, score): Spearman and Pearson correlation of the
  cosine similarities (STS);
- a file of (anchor, positive[, negatives]) rows: retrieval of each anchor's positive among all
  the file's positives and negatives (nDCG@10, MRR@10, recall, MAP).
The metrics are ``bertforge.retrieval``'s, the ones ``bertforge evaluate`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch
from torch import nn

from bertforge.data.beir import BeirData, read_beir
from bertforge.data.finetuning.pairs import TextRows
from bertforge.ops.pooling import finish, pool


@dataclass(frozen=True)
class Validation:
    """``beir`` (a retrieval set) or ``sts`` (pairs with their gold scores)."""

    beir: BeirData | None = None
    sts: tuple[list[tuple[str, str]], list[float]] | None = None
    source: str = ""


def validation_of(path: str, read_rows: Callable[..., TextRows],
                  max_rows: int | None) -> Validation:
    """The validation set at ``path`` (see the module notes)."""
    if Path(path).is_dir():
        split = "dev" if (Path(path) / "qrels" / "dev.tsv").is_file() else "test"
        return Validation(beir=read_beir(path, split), source=path)
    rows = read_rows(path, max_rows=max_rows)
    if rows.kind == "scored":
        return Validation(sts=([(t[0], t[1]) for t in rows.texts],
                               [float(s) for s in rows.scores]), source=path)
    return Validation(beir=rows_as_retrieval(rows), source=path)


def rows_as_retrieval(rows: TextRows) -> BeirData:
    """(anchor, positive, negatives...) rows as a retrieval set: every distinct anchor is a
    query whose relevant documents are its positives; the corpus is every distinct positive
    and negative of the file."""
    corpus_ids: dict[str, str] = {}
    query_ids: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for texts in rows.texts:
        for text in texts[1:]:
            corpus_ids.setdefault(text, f"d{len(corpus_ids)}")
        qid = query_ids.setdefault(texts[0], f"q{len(query_ids)}")
        qrels.setdefault(qid, {})[corpus_ids[texts[1]]] = 1
    return BeirData(corpus={i: t for t, i in corpus_ids.items()},
                    queries={i: t for t, i in query_ids.items()}, qrels=qrels)


@torch.no_grad()
def embed_texts(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, max_length: int,
                inputs: Sequence[str], batch_size: int, device: torch.device,
                autocast: Callable[[], ContextManager], pooling: str, normalize: bool,
                prompt: str | None = None) -> np.ndarray:
    """(N, D) float32 vectors of ``texts`` (``prompt`` put before each) from ``model`` (a bare
    encoder, as it trains: no DDP wrapper), longest texts first so that batches hold texts of
    similar lengths; the order of ``texts`` is kept."""
    was_training = model.training
    model.eval()
    texts = [f"{prompt}{t}" for t in texts] if prompt else list(texts)
    windows = tokenizer.encode_windows(texts, max_length=max_length)
    lengths = np.array([len(w.ids) for w in windows])
    order = np.argsort(-lengths, kind="stable")
    parts = [np.zeros((0, 0), dtype=np.float32)]
    for start in range(0, len(order), batch_size):
        chosen = [windows[i] for i in order[start:start + batch_size]]
        arrays = tokenizer.pad_windows(chosen, max(len(w.ids) for w in chosen))
        batch = {k: torch.from_numpy(arrays[k]).to(device) for k in inputs}
        with autocast():
            hidden = model(**batch).last_hidden_state
        vectors = finish(pool(hidden, batch["attention_mask"], pooling).float(), normalize)
        parts.append(vectors.cpu().numpy())
    model.train(was_training)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts[1:])[np.argsort(order)].astype(np.float32, copy=False)


def score_validation(validation: Validation, embed: Callable[[list[str], str], np.ndarray],
                     block_size: int = 16384) -> dict[str, float]:
    """The metrics of ``validation``; ``embed(texts, role)`` gives their vectors, ``role``
    "query" or "document" (which prompt they get)."""
    from bertforge.retrieval.evaluate import evaluate_retrieval, evaluate_sts

    if validation.sts is not None:
        pairs, gold = validation.sts
        return evaluate_sts(lambda texts: embed(texts, "query"), pairs, gold)
    metrics, _ = evaluate_retrieval(lambda texts: embed(texts, "query"),
                                    lambda texts: embed(texts, "document"), validation.beir,
                                    block_size=block_size)
    return metrics


__all__ = ["Validation", "embed_texts", "rows_as_retrieval", "score_validation",
           "validation_of"]
