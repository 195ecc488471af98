"""``bertforge evaluate``: score predictions with SQuAD's official metrics or ROUGE, or a model:
an embedding directory on a retrieval benchmark (BEIR layout; optionally reranked) or an STS
file, or a fine-tuned model on labelled data of its task (``finetuned``).

A model is evaluated at ``--precision`` (default fp32). At any other precision it is evaluated
at fp32 too, in the same process, and the report puts the two side by side: the metrics at
each, their difference (the precision's minus fp32's), each pass's wall time, and what ran and
why (``bertforge.runtime.guard``): the quality guard of a precision, measured on the metric the
user cares about rather than on a probe's cosine.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

from bertforge.commands.base import Command, precision_option
from bertforge.core.io import json_text
from bertforge.core.schema import REQUIRED, check_fields, closest_key, flag, opt
from bertforge.errors import ConfigError

_MODEL_MODES = ("finetuned", "retrieval", "sts")


@dataclass
class EvaluateConfig:
    what: str = opt(REQUIRED, "What to evaluate: predictions (squad, summarization) or a model "
                    "(finetuned: a fine-tuned model on labelled data of its task, with the "
                    "task's metrics; retrieval: nDCG@10, MRR@10, recall@10/100, MAP@100 on a "
                    "BEIR directory; sts: Spearman of cosine similarities).", positional=True,
                    choices=("squad", "summarization", *_MODEL_MODES))
    predictions: Optional[str] = opt(None, "squad: predictions.json (question id -> answer); "
                                     "summarization: JSON Lines with id and summary (or "
                                     "prediction), or a .txt, one per line. Required by both.")
    data: Optional[str] = opt(None, "squad: the SQuAD dev JSON (v1.1 or v2.0); finetuned: the "
                              "task's labelled file, as `bertforge finetune` reads "
                              "data.validation (SQuAD JSON, GLUE TSV, CSV/JSONL, CoNLL...); "
                              "retrieval: a BEIR directory (corpus.jsonl, queries.jsonl, "
                              "qrels/SPLIT.tsv); sts: GLUE STS-B TSV, or CSV/JSON Lines with "
                              "sentence1, sentence2, score.")
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
    model: Optional[str] = opt(None, "finetuned: a fine-tuned model directory (a `bertforge "
                               "finetune` output); retrieval, sts: the embedding model "
                               "directory (e.g. from `bertforge finetune` with task "
                               "sentence-similarity, or a sentence-transformers directory).")
    task: Optional[str] = opt(None, "finetuned: the task, by a name or alias `bertforge "
                              "finetune --task` takes (default: the model's own, from its "
                              "run's config.yaml, else config.json); with glue also "
                              "--data.task_name=NAME.")
    precision: str = precision_option(
        "finetuned, retrieval, sts: the precision to evaluate the model in (default fp32). ",
        "fp32", " Other than fp32, the model is also evaluated at fp32, and the report holds "
        "both, their difference and each pass's seconds.")
    split: str = opt("test", "retrieval: the qrels split to score (qrels/SPLIT.tsv).")
    batch_size: int = opt(64, "retrieval, sts: texts per forward pass (finetuned: "
                          "--eval.batch_size=N).", minimum=1)
    block_size: int = opt(16384, "retrieval: documents embedded and searched at a time (memory: "
                          "one block of vectors).", minimum=1)
    reranker: Optional[str] = opt(None, "retrieval: a reranker (cross-encoder) directory that "
                                  "re-scores each query's top --rerank-top documents; the "
                                  "metrics are then the reranked list's.")
    rerank_top: int = opt(100, "retrieval: documents per query the reranker re-scores.",
                          minimum=1)
    device: str = opt("auto", "finetuned, retrieval, sts: auto (cuda if available), cpu, cuda, "
                      "cuda:1... (finetuned: cpu or cuda).")
    output: Optional[str] = opt(None, "Also write the metrics to this JSON file (default: print "
                                "only).")
    finetune_overrides: List[str] = opt(
        help="finetuned: fine-tuning config keys of the evaluation, e.g. --eval.batch_size=128 "
             "or --data.max_seq_length=384 (every --key=value that is not an evaluate option).",
        factory=list, cli=False)

    def __post_init__(self) -> None:
        check_fields(self)
        need = {"summarization": ("predictions", "references"), "squad": ("predictions", "data"),
                "finetuned": ("model", "data"), "retrieval": ("model", "data"),
                "sts": ("model", "data")}[self.what]
        for key in need:
            if not getattr(self, key):
                raise ConfigError(f"evaluate {self.what} needs --{key.replace('_', '-')} "
                                  f"({_ROLES[key][self.what]})")
        if self.reranker and self.what != "retrieval":
            raise ConfigError(f"--reranker applies to evaluate retrieval, not {self.what}")
        if self.precision != "fp32" and self.what not in _MODEL_MODES:
            raise ConfigError(f"--precision applies to a model (evaluate finetuned, retrieval "
                              f"or sts); evaluate {self.what} scores a file of predictions")
        if self.task and self.what != "finetuned":
            raise ConfigError(f"--task applies to evaluate finetuned, not {self.what}")
        if self.finetune_overrides and self.what != "finetuned":
            given = self.finetune_overrides[0]
            close = closest_key(EvaluateConfig, given[2:].split("=")[0].replace("-", "_"))
            hint = f"; did you mean {flag(close)}?" if close else ""
            raise ConfigError(f"evaluate {self.what} does not take {given}: fine-tuning "
                              f"--key=value settings are for evaluate finetuned{hint}")


_ROLES = {
    "predictions": {"squad": "the predictions.json to score",
                    "summarization": "the summaries to score"},
    "references": {"summarization": "the reference summaries"},
    "data": {"squad": "the SQuAD dev JSON", "finetuned": "the task's labelled evaluation file",
             "retrieval": "a BEIR dataset directory", "sts": "the STS pairs with gold scores"},
    "model": {"finetuned": "the fine-tuned model directory",
              "retrieval": "the embedding model directory",
              "sts": "the embedding model directory"},
}


@dataclass(frozen=True)
class Pass:
    """One evaluation of a model at one precision."""

    metrics: dict[str, Any]
    seconds: float   # the pass over the data: not loading the model or the guard's probe
    precision: str   # what ran
    reason: str      # why: "auto: avx512_bf16 ...; probe cosine to fp32 0.99998 >= 0.999"
    summary: str     # what was evaluated, one line


def _choice(pipe: Any) -> tuple[str, str]:
    """(precision, why) of an inference pipeline (``pipelines.numerics``)."""
    c = getattr(pipe, "precision_choice", None)
    return (pipe.precision.name, "") if c is None else (c.name, f"{c.asked}: {c.reason}")


def _retrieval(cfg: EvaluateConfig, precisions: list[str]) -> list[Pass]:
    """--model (reranked when asked) on the BEIR directory --data, once per precision."""
    from bertforge.data.beir import read_beir
    from bertforge.inference.embedding import DirectoryEncoder, PairScorer
    from bertforge.metrics.retrieval import retrieval_metrics
    from bertforge.retrieval.evaluate import evaluate_retrieval, rerank

    data, passes = read_beir(cfg.data, cfg.split), []
    for precision in precisions:
        encoder = DirectoryEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size,
                                   precision=precision)
        scorer = (PairScorer(cfg.reranker, device=cfg.device, batch_size=cfg.batch_size,
                             precision=precision)
                  if cfg.reranker else None)  # loaded before the long search: a bad one fails now
        start = time.perf_counter()
        metrics, run = evaluate_retrieval(
            encoder.embed_queries, encoder.embed_documents, data, block_size=cfg.block_size,
            top_k=max(100, cfg.rerank_top if scorer else 0), similarity=encoder.similarity,
            device=encoder.device)
        scored: dict[str, Any] = dict(metrics)
        what, (name, reason) = "retrieval", _choice(encoder.pipeline)
        if scorer is not None:
            reranked = rerank(scorer, data, run, top=cfg.rerank_top)
            scored = {**retrieval_metrics(reranked, data.qrels), "first_stage": metrics}
            what = f"reranked top {cfg.rerank_top}"
            ranker, why = _choice(scorer.pipeline)
            if (ranker, why) != (name, reason):
                name, reason = f"{name}, reranker {ranker}", f"{reason}; reranker {why}"
        summary = (f"nDCG@10 {scored['ndcg@10']:.4f} ({what}; {encoder.similarity} similarity) "
                   f"over {len(data.queries)} queries and {len(data.corpus)} documents of "
                   f"{cfg.data} ({cfg.split})")
        passes.append(Pass(scored, time.perf_counter() - start, name, reason, summary))
    return passes


def _sts(cfg: EvaluateConfig, precisions: list[str]) -> list[Pass]:
    """--model on the STS file --data, once per precision."""
    from bertforge.data.finetuning.glue import read_glue
    from bertforge.inference.embedding import DirectoryEncoder
    from bertforge.retrieval.evaluate import evaluate_sts

    examples, passes = read_glue(cfg.data, "stsb"), []
    for precision in precisions:
        encoder = DirectoryEncoder(cfg.model, device=cfg.device, batch_size=cfg.batch_size,
                                   precision=precision)
        start = time.perf_counter()
        scores = evaluate_sts(encoder.embed, [(e.text_a, e.text_b or "") for e in examples],
                              [float(e.label) for e in examples])
        summary = (f"Spearman {scores['spearman']:.4f} (Pearson {scores['pearson']:.4f}) of "
                   f"cosine similarities over {len(examples)} pairs of {cfg.data}")
        passes.append(Pass(scores, time.perf_counter() - start, *_choice(encoder.pipeline),
                           summary))
    return passes


def _finetuned(cfg: EvaluateConfig, precisions: list[str]) -> list[Pass]:
    """--model on its task's labelled file --data, read once and evaluated once per precision
    as an evaluation-only `bertforge finetune` run evaluates it (nothing is written)."""
    import tempfile

    from bertforge.inference.predict import evaluation_config
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    model = Path(cfg.model)
    if not (model / "config.json").is_file():
        raise ConfigError(f"--model {model} is not a model directory (it has no config.json)")
    with tempfile.TemporaryDirectory(prefix="bertforge-evaluate-") as scratch:
        run = evaluation_config(model, cfg.data, scratch, [
            *([f"--task={cfg.task}"] if cfg.task else []), *cfg.finetune_overrides])
        task = build_task(run, init_distributed(None if cfg.device == "auto" else cfg.device))
        passes = []
        for precision in precisions:
            done = task.evaluate_at(precision)
            c = done.choice
            summary = (f"{task.name} evaluation of {model} on "
                       f"{len(task.examples.evaluation)} examples of {cfg.data}")
            passes.append(Pass(done.metrics, done.seconds, c.name, f"{c.asked}: {c.reason}",
                               summary))
    return passes


_MODES: dict[str, Callable[[EvaluateConfig, list[str]], list[Pass]]] = {
    "finetuned": _finetuned, "retrieval": _retrieval, "sts": _sts}


def difference(value: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """``value - reference`` for every number both hold (nested dicts alike)."""
    out: dict[str, Any] = {}
    for key, v in value.items():
        r = reference.get(key)
        if isinstance(v, dict) and isinstance(r, dict):
            out[key] = difference(v, r)
        elif _number(v) and _number(r):
            out[key] = v - r
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _flat(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in metrics.items():
        out.update(_flat(v, f"{prefix}{key}.") if isinstance(v, dict) else {prefix + key: v})
    return out


def side_by_side(asked: str, fp32: Pass, other: Pass) -> tuple[dict[str, Any], list[str]]:
    """The report of a model at ``asked`` next to fp32 (the JSON printed and written), and its
    table for the terminal: a row per number, then each pass's seconds."""
    report = {"fp32": fp32.metrics, asked: other.metrics,
              "difference": difference(other.metrics, fp32.metrics),
              "seconds": {"fp32": round(fp32.seconds, 3), asked: round(other.seconds, 3)},
              "precision": other.precision, "precision_reason": other.reason}
    at, ref = _flat(other.metrics), _flat(fp32.metrics)

    def shown(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    rows = [("metric", "fp32", asked, "difference")]
    rows += [(k, shown(ref[k]), shown(at[k]), f"{d:+.4f}")
             for k, d in _flat(report["difference"]).items()]
    speed = fp32.seconds / other.seconds if other.seconds > 0 else float("inf")
    rows.append(("seconds", f"{fp32.seconds:.2f}", f"{other.seconds:.2f}",
                 f"{speed:.2f}x fp32's speed"))
    width = max(len(r[0]) for r in rows)
    lines = [f"{r[0]:<{width}}  {r[1]:>10}  {r[2]:>10}  {r[3]:>12}" for r in rows]
    return report, [*lines, f"precision {other.precision} ({other.reason})"]


def _evaluate_model(cfg: EvaluateConfig) -> tuple[dict[str, Any], list[str]]:
    """(report, lines for the terminal) of a model mode: at fp32 its metrics alone; at another
    precision the side-by-side report."""
    if cfg.precision == "fp32":
        only = _MODES[cfg.what](cfg, ["fp32"])[0]
        return only.metrics, [only.summary]
    # P first: its guard's probe ran fp32 and P once, so both passes start warm (the first
    # pass of a process otherwise pays one-time kernel and allocator set-up in its seconds)
    other, fp32 = _MODES[cfg.what](cfg, [cfg.precision, "fp32"])
    report, table = side_by_side(cfg.precision, fp32, other)
    return report, [other.summary, *table]


def run_evaluate(cfg: EvaluateConfig) -> int:
    from bertforge.core.io import check_output_file, write_json_atomic

    if cfg.output:
        check_output_file(cfg.output, "--output")
    lines: list[str] = []
    if cfg.what in _MODEL_MODES:
        scores, lines = _evaluate_model(cfg)
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
    for line in lines:
        print(line, file=sys.stderr)
    if cfg.output:
        write_json_atomic(cfg.output, scores, sort_keys=False)
        print(f"wrote {cfg.output}", file=sys.stderr)
    return 0


EVALUATE = Command("evaluate", "Score predictions (SQuAD v1.1/v2.0 official metrics, ROUGE) or a "
                   "model: a fine-tuned one on labelled data of its task, retrieval on a BEIR "
                   "directory (nDCG@10, optionally reranked) or STS (Spearman); --precision P "
                   "reports a model's metrics at P next to fp32's.", EvaluateConfig,
                   run_evaluate, passthrough="finetune_overrides")
