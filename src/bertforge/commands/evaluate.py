"""``bertforge evaluate``: score predictions with SQuAD's official metrics or ROUGE, or a model
directory on a retrieval benchmark (BEIR layout; optionally reranked) or an STS file."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from bertforge.commands.base import Command
from bertforge.core.io import json_text
from bertforge.core.schema import REQUIRED, check_fields, opt
from bertforge.errors import ConfigError

_MODEL_MODES = ("retrieval", "sts")


@dataclass
class EvaluateConfig:
    what: str = opt(REQUIRED, "What to evaluate: predictions (squad, summarization) or a model "
                    "(retrieval: nDCG@10, MRR@10, recall@10/100, MAP@100 on a BEIR directory; "
                    "sts: Spearman of cosine similarities).", positional=True,
                    choices=("squad", "summarization", *_MODEL_MODES))
    predictions: Optional[str] = opt(None, "squad: predictions.json (question id -> answer); "
                                     "summarization: JSON Lines with id and summary (or "
                                     "prediction), or a .txt, one per line. Required by both.")
    data: Optional[str] = opt(None, "squad: the SQuAD dev JSON (v1.1 or v2.0); retrieval: a BEIR "
                              "directory (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv); sts: "
                              "GLUE STS-B TSV, or CSV/JSON Lines with sentence1, sentence2, "
                              "score.")
    na_probs: Optional[str] = opt(None, "squad v2.0: null_odds.json (no-answer scores) for the "
                                  "threshold search.")
    references: Optional[str] = opt(None, "summarization: reference summaries (JSONL/CSV/TSV, "
                                    "CNN/DailyMail story directory, or .txt one per line); "
                                    "matched by id when both have ids.")
    prediction_field: Optional[str] = opt(None, "summarization: the predictions' text field "
                                          "(default: summary/prediction).")
    reference_field: Optional[str] = opt(None, "summarization: the references' field (default: "
                                         "detected; a list field gives several references per "
                                         "example).")
    model: Optional[str] = opt(None, "retrieval, sts: the embedding model directory (e.g. from "
                               "`bertforge finetune` with task sentence-similarity, or a "
                               "sentence-transformers directory).")
    split: str = opt("test", "retrieval: the qrels split to score (qrels/SPLIT.tsv).")
    batch_size: int = opt(64, "retrieval, sts: texts per forward pass.", minimum=1)
    block_size: int = opt(16384, "retrieval: documents embedded and searched at a time (memory: "
                          "one block of vectors).", minimum=1)
    reranker: Optional[str] = opt(None, "retrieval: a reranker (cross-encoder) directory that "
                                  "re-scores each query's top --rerank-top documents; the "
                                  "metrics are then the reranked list's.")
    rerank_top: int = opt(100, "retrieval: documents per query the reranker re-scores.",
                          minimum=1)
    device: str = opt("auto", "retrieval, sts: auto (cuda if available), cpu, cuda, cuda:1...")
    output: Optional[str] = opt(None, "Also write the metrics to this JSON file (default: print "
                                "only).")

    def __post_init__(self) -> None:
        check_fields(self)
        need = {"summarization": ("predictions", "references"), "squad": ("predictions", "data"),
                "retrieval": ("model", "data"), "sts": ("model", "data")}[self.what]
        for key in need:
            if not getattr(self, key):
                raise ConfigError(f"evaluate {self.what} needs --{key.replace('_', '-')} "
                                  f"({_ROLES[key][self.what]})")
        if self.reranker and self.what != "retrieval":
            raise ConfigError(f"--reranker applies to evaluate retrieval, not {self.what}")


_ROLES = {
    "predictions": {"squad": "the predictions.json to score",
                    "summarization": "the summaries to score"},
    "references": {"summarization": "the reference summaries"},
    "data": {"squad": "the SQuAD dev JSON", "retrieval": "a BEIR dataset directory",
             "sts": "the STS pairs with gold scores"},
    "model": {"retrieval": "the embedding model directory",
              "sts": "the embedding model directory"},
}


def _retrieval(cfg: EvaluateConfig) -> tuple[dict[str, Any], str]:
    """(metrics, summary line) of --model on the BEIR directory --data, reranked when asked."""
    from bertforge.data.beir import read_beir
    from bertforge.inference.embedding import DirectoryEncoder, PairScorer
    from bertforge.retrieval.evaluate import evaluate_retrieval, rerank

    data = read_beir(cfg.data, cfg.split)
    encoder = DirectoryEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size)
    scorer = (PairScorer(cfg.reranker, device=cfg.device, batch_size=cfg.batch_size)
              if cfg.reranker else None)  # loaded before the long search: a bad one fails now
    metrics, run = evaluate_retrieval(
        encoder.embed_queries, encoder.embed_documents, data, block_size=cfg.block_size,
        top_k=max(100, cfg.rerank_top if scorer else 0), similarity=encoder.similarity,
        device=encoder.device)
    scored: dict[str, Any] = dict(metrics)
    what = "retrieval"
    if scorer is not None:
        from bertforge.metrics.retrieval import retrieval_metrics

        reranked = rerank(scorer, data, run, top=cfg.rerank_top)
        scored = {**retrieval_metrics(reranked, data.qrels), "first_stage": metrics}
        what = f"reranked top {cfg.rerank_top}"
    summary = (f"nDCG@10 {scored['ndcg@10']:.4f} ({what}; {encoder.similarity} similarity) over "
               f"{len(data.queries)} queries and {len(data.corpus)} documents of "
               f"{cfg.data} ({cfg.split})")
    return scored, summary


def _sts(cfg: EvaluateConfig) -> tuple[dict[str, Any], str]:
    """(metrics, summary line) of --model on the STS file --data."""
    from bertforge.data.finetuning.glue import read_glue
    from bertforge.inference.embedding import DirectoryEncoder
    from bertforge.retrieval.evaluate import evaluate_sts

    examples = read_glue(cfg.data, "stsb")
    encoder = DirectoryEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size)
    scores = evaluate_sts(encoder.embed, [(e.text_a, e.text_b or "") for e in examples],
                          [float(e.label) for e in examples])
    summary = (f"Spearman {scores['spearman']:.4f} (Pearson {scores['pearson']:.4f}) of cosine "
               f"similarities over {len(examples)} pairs of {cfg.data}")
    return scores, summary


def run_evaluate(cfg: EvaluateConfig) -> int:
    from bertforge.core.io import check_output_file, write_json_atomic

    if cfg.output:
        check_output_file(cfg.output, "--output")
    summary = ""
    if cfg.what in _MODEL_MODES:
        scores, summary = _retrieval(cfg) if cfg.what == "retrieval" else _sts(cfg)
    elif cfg.what == "summarization":
        from bertforge.metrics.rouge import evaluate_summarization_files

        scores = evaluate_summarization_files(Path(cfg.predictions), Path(cfg.references),
                                              prediction_field=cfg.prediction_field,
                                              reference_field=cfg.reference_field)
    else:
        from bertforge.metrics.squad import evaluate_squad_files

        scores = evaluate_squad_files(Path(cfg.data), Path(cfg.predictions),
                                      Path(cfg.na_probs) if cfg.na_probs else None)
    print(json_text(scores, "evaluate", indent=2))
    if summary:
        print(summary, file=sys.stderr)
    if cfg.output:
        write_json_atomic(cfg.output, scores, sort_keys=False)
        print(f"wrote {cfg.output}", file=sys.stderr)
    return 0


EVALUATE = Command("evaluate", "Score predictions (SQuAD v1.1/v2.0 official metrics, ROUGE) or a "
                   "model: retrieval on a BEIR directory (nDCG@10, optionally reranked) or STS "
                   "(Spearman).", EvaluateConfig, run_evaluate)
