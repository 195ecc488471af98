"""The budget recipe on a CPU: held-out MLM loss after a fixed wall-clock budget, on two corpora.

    python benchmarks/budget_bench.py --corpus docstrings            # the corpus it was tuned on
    python benchmarks/budget_bench.py --corpus squad                 # a corpus it never saw
    python benchmarks/budget_bench.py --corpus squad --recipe tiny-cpu --minutes 20   # baseline
    python benchmarks/budget_bench.py --corpus docstrings --minutes 5 --set optim.lr=2e-3  # a probe

For each corpus: a WordPiece vocabulary trained on it (8192 tokens), `bertforge prepare`
(MLM only, 128 tokens, 5% of the documents held out), then `bertforge pretrain --config RECIPE`
with ``train.max_steps`` set so the run fills ``--minutes`` of wall clock on this machine: a short
calibration run measures steps/s first (the recipe's schedule must end with the budget, so the
step count is fixed before the run starts). The result is the run's final validation MLM loss
and accuracy on the held-out documents (``train.eval_batches`` micro-batches, the same at every
evaluation), its loss curve, and the wall clock it took.

Corpora (both built on this machine, nothing downloaded):

* ``docstrings``: the stdlib docstring corpus (``bertforge.demo.corpus.build_sample_corpus``, 3 MB):
  technical English; the recipe was tuned on it.
* ``squad``: the Wikipedia paragraphs of the SQuAD v1.1 dev set part in ``../shared/data``
  (1.05 MB, 32 articles, one document per article): encyclopedic English, never used for tuning.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, write_result  # noqa: E402
from quality_bench import _recipe, run_pretrain as pretrain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
CORPORA = ("docstrings", "squad")


def build_corpus(name: str, directory: Path) -> Path:
    """The corpus text file (sentences or paragraphs format, blank line between documents)."""
    directory.mkdir(parents=True, exist_ok=True)
    if name == "docstrings":
        from bertforge.demo.corpus import build_sample_corpus

        return build_sample_corpus(directory / "docstrings.txt", max_bytes=3_000_000)
    source = SHARED / "squad" / "dev-v1.1-part-a.json"
    if not source.is_file():
        raise SystemExit(f"{source} is missing: the squad corpus needs ../shared/data")
    articles = json.loads(source.read_text(encoding="utf-8"))["data"]
    # one document per article, one paragraph per line (split into sentences by prepare)
    text = "\n\n".join("\n".join(p["context"].strip() for p in a["paragraphs"])
                       for a in articles)
    out = directory / "squad.txt"
    out.write_text(text + "\n", encoding="utf-8")
    return out


def prepare_corpus(corpus: Path, work: Path, seq: int) -> Path:
    from bertforge.data.prepare import prepare
    from bertforge.tokenization.training import train_wordpiece

    vocab = work / "vocab.txt"
    if not vocab.is_file():
        train_wordpiece([corpus], vocab_size=8192, output=vocab, progress=False)
    data = work / f"data-{seq}"
    if not (data / "manifest.json").is_file():
        prepare([corpus], vocab=vocab, output=data, max_seq_length=seq, objective="none",
                validation_fraction=0.05, max_predictions=max(20, round(seq * 0.2)),
                workers=1, progress=False, overwrite=True)
    return data


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=CORPORA, required=True)
    ap.add_argument("--recipe", default="budget-cpu", help="Recipe to run (default budget-cpu).")
    ap.add_argument("--steps", type=int, default=0,
                    help="Optimizer steps to run (default: the recipe's max_steps when --minutes "
                         "is not given).")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="Wall-clock budget: calibrate steps/s first and set max_steps to fill "
                         "it (for probes of other settings; the recipe's own max_steps fills 20 "
                         "minutes on a 2-core AMD EPYC VM).")
    ap.add_argument("--calibration-steps", type=int, default=30)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="Extra recipe overrides, e.g. optim.lr=2e-3 (for probes).")
    ap.add_argument("--workdir", default=str(ROOT / "build" / "budget"))
    ap.add_argument("--output", help="Result JSON (default: benchmarks/results/budget-...).")
    args = ap.parse_args()

    meta = metadata()
    work = Path(args.workdir) / args.corpus
    corpus = build_corpus(args.corpus, work)
    data = prepare_corpus(corpus, work, args.seq)
    overrides = [f"--data.path={data}", "--tensorboard=false", "--resume=none",
                 *[f"--{kv}" for kv in args.set]]
    tag = "-".join([args.recipe, *[kv.replace("=", "").replace(".", "") for kv in args.set]])
    if not args.steps and not args.minutes:
        from bertforge.config import PretrainConfig, load_config
        from bertforge.recipes import resolve_recipe

        recipe = load_config(PretrainConfig, resolve_recipe(args.recipe))
        args.steps = recipe.train.max_steps

    calibration = None
    if args.steps:
        steps = args.steps
    else:
        # Calibrate: steps/s of this recipe here, over all but the first logging window.
        cal = work / f"calibrate-{tag}"
        shutil.rmtree(cal, ignore_errors=True)
        pretrain(["--config", args.recipe, *overrides, f"--output_dir={cal}",
                  f"--train.max_steps={args.calibration_steps}", "--train.eval_every=0",
                  "--train.eval_batches=0", f"--checkpoint.every={args.calibration_steps}",
                  "--train.log_every=10"], work / f"calibrate-{tag}.log")
        rows = [r for r in metrics(cal) if "seq_per_s" in r][1:]
        per_s = sum(r["seq_per_s"] for r in rows) / len(rows)
        steps_per_s = per_s / int(_recipe(cal)["train"]["global_batch_size"])
        # A full run is slower than its calibration (validation passes, the checkpoint, a loader
        # worker sharing two cores): the 5-minute probes ran at 0.8x the calibrated rate.
        steps = max(10, int(args.minutes * 60 * 0.8 * steps_per_s))
        calibration = {"steps": args.calibration_steps, "sequences_per_s": per_s,
                       "steps_per_s": steps_per_s}
        shutil.rmtree(cal, ignore_errors=True)

    run = work / f"run-{tag}-{steps}steps"
    shutil.rmtree(run, ignore_errors=True)
    seconds = pretrain(["--config", args.recipe, *overrides, f"--output_dir={run}",
                        f"--train.max_steps={steps}"], work / f"run-{tag}.log")
    lines = metrics(run)
    val = [r for r in lines if "val_mlm_loss" in r]
    train = [r for r in lines if "mlm_loss" in r and "val_mlm_loss" not in r]
    result = {
        "benchmark": "budget-cpu", **meta,
        "corpus": args.corpus, "corpus_bytes": corpus.stat().st_size,
        "recipe": args.recipe, "overrides": args.set, "budget_minutes": args.minutes or None,
        "calibration": calibration,
        "max_steps": steps, "wall_seconds": round(seconds, 1),
        "final_validation": val[-1] if val else None,
        "validation_curve": [{k: r[k] for k in ("step", "val_mlm_loss", "val_mlm_acc")}
                             for r in val],
        "train_curve": [{k: r.get(k) for k in ("step", "mlm_loss", "mlm_acc", "lr")}
                        for r in train],
    }
    out = result_path(f"budget-{args.corpus}-{tag}", args.output)
    write_result(out, result)
    last = result["final_validation"] or {}
    print(f"{args.corpus} / {args.recipe} {' '.join(args.set)}: {steps} steps in {seconds:.0f} s, "
          f"validation MLM loss {last.get('val_mlm_loss', float('nan')):.4f}, "
          f"accuracy {last.get('val_mlm_acc', float('nan')):.3f} -> {out}")


if __name__ == "__main__":
    main()
