"""ModernBERT MLM train step: bertforge's ``ModernBertForMaskedLM`` against transformers', one run.

    python benchmarks/modernbert_bench.py                     # CPU: 6 layers x 256, batch 4
    python benchmarks/modernbert_bench.py --preset modernbert-base --rounds 2   # base shape (slow)
    python benchmarks/modernbert_bench.py --device cuda --precision bf16 --preset modernbert-base \
        --batch 32 --rounds 10 --steps-per-round 5 \
        --variants bertforge bertforge-compiled hf hf-compiled

Both models hold the same weights (bertforge's ``save_pretrained`` -> transformers'
``ModernBertForMaskedLM.from_pretrained`` with its default attention implementation: SDPA on a
padded batch with a full mask for global layers and a banded one for sliding-window layers; no
unpadding, which transformers 5 only does through flash-attn) and see the same batches:

* sequences of lengths drawn uniformly from ``--min-len`` .. ``--max-len`` (seeded), random
  ids of the ModernBERT vocabulary between [CLS] and [SEP]; ``--mask-prob`` (30%, ModernBERT's
  recipe) of the tokens between them are predicted (80% [MASK], 10% random, 10% kept);
  collated by bertforge's loader code (``collate_rows``: padded to the batch's longest, a
  multiple of 8, with the unpadded layout and the masked positions precomputed, as the loader
  ships them). transformers gets the same ``input_ids``, ``attention_mask`` and ``labels``.
* ``bertforge``: unpadded execution (``apply_speed_options(unpad=True)``: global layers
  varlen attention, sliding-window layers the blocked window kernel on CPU or flash-attn's
  window on a GPU), MLM head and decoder only at the masked positions, cross-entropy there.
* ``hf``: its forward with ``labels`` (loss inside; by default logits at every position).
  ``hf-sparse``: the same with ``sparse_prediction=True`` (transformers' option to project only
  the labelled positions) for reference.
* ``bertforge-padded``: bertforge on the padded rows (band mask in local layers), sparse head.
* ``-compiled``: bertforge's regional ``torch.compile`` (``train.compile``), or
  ``torch.compile`` of the whole transformers model; the compile time is reported on its own.

Every contestant runs one ``bertforge.train.loop.train_step`` per batch (forward, loss, backward,
clip 1.0, torch AdamW). Before timing, the losses on the first batch must agree (fp32, full
precision matmuls, eval mode, same weights): to 1e-5 relative or the run stops. Rounds are
interleaved after a warm-up (compiled variants step once on every batch there); the median of
the per-round rates is reported with min/max, and the bertforge/hf ratio as the median of the
per-round ratios. Model FLOPs (``bertforge.train.flops``): each sequence at its real length, the
sliding-window layers per window, the MLM head at the masked positions; ``mfu`` on a GPU with a
known peak. Results: ``benchmarks/results/modernbert-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402
from bertforge.data.batch import IGNORE_INDEX, LossOutput  # noqa: E402

VARIANTS = ("bertforge", "hf", "hf-sparse", "bertforge-compiled", "hf-compiled",
            "bertforge-padded")
MASK_ID = 50284  # [MASK] in ModernBERT's tokenizer (answerdotai/ModernBERT-base)


# --- data ----------------------------------------------------------------------------------------


def make_batches(args: argparse.Namespace, cfg: Any) -> list[dict]:
    """``--num-batches`` collated MLM micro-batches of random-length sequences (module doc)."""
    from bertforge.data.collate.mlm import collate_rows

    rng = np.random.default_rng(args.seed)
    first_special = min(cfg.cls_token_id, cfg.sep_token_id, cfg.pad_token_id, MASK_ID)
    batches = []
    for _ in range(args.num_batches):
        rows = []
        for length in rng.integers(args.min_len, args.max_len + 1, size=args.batch):
            ids = rng.integers(0, first_special, size=int(length))
            ids[0], ids[-1] = cfg.cls_token_id, cfg.sep_token_id
            inner = np.arange(1, length - 1)
            picked = rng.choice(inner, size=round(args.mask_prob * len(inner)), replace=False)
            labels = np.full(int(length), IGNORE_INDEX, dtype=np.int64)
            labels[picked] = ids[picked]
            roll = rng.random(len(picked))
            ids[picked[roll < 0.8]] = MASK_ID
            swap = picked[(roll >= 0.8) & (roll < 0.9)]
            ids[swap] = rng.integers(0, first_special, size=len(swap))
            rows.append((ids, np.zeros_like(ids), labels, -1))
        batches.append(collate_rows(rows, pad_id=cfg.pad_token_id, pad_to_multiple_of=8))
    return batches


def batch_facts(batches: list[dict]) -> dict[str, Any]:
    lengths = torch.cat([b["attention_mask"].sum(1) for b in batches]).tolist()
    masked = sum(int(b["mlm_labels"].ne(IGNORE_INDEX).sum()) for b in batches)
    return {"sequences": len(lengths), "real_tokens_per_seq": {
                "mean": round(statistics.mean(lengths), 1), "min": min(lengths),
                "max": max(lengths)},
            "padded_width": [int(b["input_ids"].shape[1]) for b in batches],
            "real_token_fraction_of_padded": round(
                sum(lengths) / sum(b["input_ids"].numel() for b in batches), 3),
            "masked_fraction_of_real": round(masked / sum(lengths), 3)}


# --- models and losses ---------------------------------------------------------------------------


def build_config(args: argparse.Namespace):
    from bertforge.models.modernbert_config import ModernBertConfig

    if args.preset:
        return ModernBertConfig.from_preset(args.preset)
    return ModernBertConfig(num_hidden_layers=args.layers, hidden_size=args.hidden,
                            num_attention_heads=args.heads, intermediate_size=args.intermediate,
                            local_attention=args.local_attention)


def build_models(cfg: Any, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """name -> model, all with the weights of one seeded bertforge model."""
    import transformers

    from bertforge.models.modernbert import ModernBertForMaskedLM
    from bertforge.speed import apply_speed_options

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(args.seed)
    ours = ModernBertForMaskedLM(cfg)
    models: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="modernbert-bench-"))
    try:
        ours.save_pretrained(tmp / "model")
        for name in names:
            if not name.startswith("hf"):
                continue
            extra = {"sparse_prediction": True} if name == "hf-sparse" else {}
            hf, info = transformers.ModernBertForMaskedLM.from_pretrained(
                str(tmp / "model"), output_loading_info=True, **extra)
            if any(info.values()):
                raise RuntimeError(f"transformers did not load every weight: {info}")
            models[name] = hf
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name in names:
        if name.startswith("bertforge"):
            model = ours if name == "bertforge" else copy.deepcopy(ours)
            apply_speed_options(model, unpad=name != "bertforge-padded",
                                attention_backend=args.backend,
                                compile=name.endswith("-compiled"))
            models[name] = model
    if "hf-compiled" in models:
        models["hf-compiled"].compile()
    return models


def bertforge_loss(model, batch: dict) -> LossOutput:
    """Cross-entropy at the masked positions: the decoder runs there only."""
    from bertforge.ops.unpad import layout_from_batch

    masked = batch["mlm_positions"]                                   # (N,) flat row * S + col
    target = batch["mlm_labels"].reshape(-1).index_select(0, masked)  # (N,)
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                masked_positions=masked, layout=layout_from_batch(batch))
    loss = F.cross_entropy(out.logits.float(), target)
    return LossOutput(loss, {"loss": loss.detach()}, sequences=batch["input_ids"].shape[0],
                      tokens=batch["attention_mask"].sum())


def hf_loss(model, batch: dict) -> LossOutput:
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                labels=batch["mlm_labels"])
    return LossOutput(out.loss, {"loss": out.loss.detach()},
                      sequences=batch["input_ids"].shape[0], tokens=batch["attention_mask"].sum())


def loss_fn(name: str) -> Callable:
    return bertforge_loss if name.startswith("bertforge") else hf_loss


def check_losses(models: dict[str, Any], batch: dict) -> dict[str, Any]:
    """Eval losses on one batch in full fp32 (no TF32): every contestant must give bertforge's
    unpadded loss to 1e-5 relative, or the timings would not compare the same work."""
    from bertforge.runtime.precision import float32_matmul

    values, seconds = {}, {}
    with torch.no_grad(), float32_matmul("highest"):
        for name, model in models.items():
            model.eval()
            t0 = time.perf_counter()
            values[name] = float(loss_fn(name)(model, batch).loss)
            seconds[name] = time.perf_counter() - t0
            model.train()
    reference = values["bertforge"] if "bertforge" in values else next(iter(values.values()))
    check = {name: {"loss": v, "abs_diff": abs(v - reference),
                    "rel_diff": abs(v - reference) / abs(reference)} for name, v in values.items()}
    for name, c in check.items():
        print(f"loss check {name}: {c['loss']:.7f} (rel diff {c['rel_diff']:.2e})", flush=True)
        if c["rel_diff"] > 1e-5:
            raise RuntimeError(f"{name}: loss {c['loss']:.7f} != bertforge's {reference:.7f} "
                               "(same weights, same batch, fp32): the runs would not be comparable")
    return {"losses": check, "seconds": seconds}


# --- timing --------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Contestant:
    """One model with its loss, AdamW, precision and timings, stepped by bertforge's train_step."""

    def __init__(self, name: str, model, args: argparse.Namespace) -> None:
        from bertforge.optim import build_optimizer, build_scheduler
        from bertforge.runtime.precision import build_precision

        self.name, self.model, self.loss_fn = name, model, loss_fn(name)
        self.optimizer = build_optimizer(model, "adamw", lr=1e-4, weight_decay=0.01,
                                         max_grad_norm=1.0)
        self.scheduler = build_scheduler(self.optimizer, "constant", total_steps=10**9, warmup=0.0)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.precision = build_precision(args.precision, next(model.parameters()).device)
        self.tokens_per_s: list[float] = []
        self.warmup_seconds = 0.0
        self.peak_gib = 0.0

    def steps(self, batches: list[dict]) -> None:
        from bertforge.train.loop import train_step

        with self.precision.scope():  # the run's numerics (TF32 on a GPU), for this call only
            for batch in batches:
                train_step(self.model, [batch], self.loss_fn, self.optimizer, self.scheduler,
                           self.precision, self.params, 1.0)


def run_rounds(contestants: list[Contestant], batches: list[dict], args: argparse.Namespace,
               device: torch.device) -> None:
    """Warm-up (compiled variants: every batch once), then interleaved timed rounds."""
    n = len(batches)
    for c in contestants:
        warm = max(args.warmup, n if c.name.endswith("-compiled") else 0)
        _sync(device)
        t0 = time.perf_counter()
        c.steps([batches[i % n] for i in range(warm)])
        _sync(device)
        c.warmup_seconds = time.perf_counter() - t0
        print(f"warm-up {c.name}: {warm} steps in {c.warmup_seconds:.1f} s", flush=True)
    spr = args.steps_per_round
    for r in range(args.rounds):
        picked = [batches[(r * spr + j) % n] for j in range(spr)]
        tokens = sum(int(b["attention_mask"].sum()) for b in picked)
        for c in contestants:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t0 = time.perf_counter()
            c.steps(picked)
            _sync(device)
            c.tokens_per_s.append(tokens / (time.perf_counter() - t0))
            if device.type == "cuda":
                c.peak_gib = max(c.peak_gib, torch.cuda.max_memory_allocated(device) / 2**30)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{c.name} {c.tokens_per_s[-1]:.0f} tokens/s" for c in contestants), flush=True)


# --- results -------------------------------------------------------------------------------------


def work_per_token(cfg: Any, batches: list[dict]) -> dict[str, float]:
    """Model training FLOPs per real token: ``windowed`` (sliding-window layers per window: the
    work the model needs) and ``dense_local`` (those layers at S^2, as a masked dense kernel
    computes them)."""
    from bertforge.train.flops import batch_train_flops

    tokens = sum(float(b["attention_mask"].sum()) for b in batches)
    out = {}
    for key, windowed in (("windowed", True), ("dense_local", False)):
        out[key] = sum(batch_train_flops(cfg, b["attention_mask"],
                                         b["mlm_labels"].ne(IGNORE_INDEX), windowed=windowed)
                       for b in batches) / tokens
    return out


def summarize(contestants: list[Contestant], cfg: Any, batches: list[dict],
              device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    from bertforge.train.flops import peak_flops

    work = work_per_token(cfg, batches)
    peak = peak_flops(device, args.precision)
    seqs_per_token = len(batches) * args.batch / sum(float(b["attention_mask"].sum())
                                                     for b in batches)
    results = {}
    for c in contestants:
        s = spread(c.tokens_per_s)
        r = {"tokens_per_s": round(s["median"], 1), "tokens_per_s_min": round(s["min"], 1),
             "tokens_per_s_max": round(s["max"], 1), "noise_pct": round(s["noise_pct"], 1),
             "seq_per_s": round(s["median"] * seqs_per_token, 3),
             "model_tflops_per_s": round(s["median"] * work["windowed"] / 1e12, 4),
             "mfu": round(s["median"] * work["windowed"] / peak, 4) if peak else None,
             "mfu_dense_local_attention": (round(s["median"] * work["dense_local"] / peak, 4)
                                           if peak else None),
             "warmup_seconds": round(c.warmup_seconds, 1)}
        if device.type == "cuda":
            r["peak_gib"] = round(c.peak_gib, 2)
        results[c.name] = r
    ratios = {}
    by_name = {c.name: c for c in contestants}
    for name, c in by_name.items():
        for ref in ("hf", "hf-sparse", "hf-compiled"):
            if name.startswith("bertforge") and ref in by_name:
                per_round = [a / b for a, b in zip(c.tokens_per_s, by_name[ref].tokens_per_s)]
                ratios[f"{name}/{ref}_median_of_rounds"] = round(statistics.median(per_round), 3)
                ratios[f"{name}/{ref}_range"] = [round(min(per_round), 3), round(max(per_round), 3)]
    return {"results": results, "ratios": ratios,
            "flops_per_real_token": {k: round(v) for k, v in work.items()},
            "peak_flops": peak}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu).")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--preset", help="A ModernBERT preset (modernbert-base, modernbert-large, "
                                     "modernbert-tiny); default: the shape options below.")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=384,
                    help="GeGLU width (base: 1152 for 768, the same 1.5x ratio).")
    ap.add_argument("--local-attention", type=int, default=128, help="Sliding window width.")
    ap.add_argument("--batch", type=int, default=4, help="Sequences per train step.")
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--mask-prob", type=float, default=0.3)
    ap.add_argument("--num-batches", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="Untimed train steps per contestant.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-per-round", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=["bertforge", "hf", "hf-sparse"],
                    choices=VARIANTS)
    ap.add_argument("--backend", default="auto", help="Attention kernel of unpadded tokens "
                                                      "(train.attention_backend).")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: results/modernbert-<device>-<date>.json).")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    from bertforge.data.batch import to_device
    from bertforge.errors import ConfigError

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible")
    if not 8 <= args.min_len <= args.max_len:
        raise ConfigError("--min-len must be at least 8 and at most --max-len")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    meta = metadata()
    cfg = build_config(args)
    names = list(dict.fromkeys(args.variants))
    batches = make_batches(args, cfg)
    models = {name: m.to(device) for name, m in build_models(cfg, names, args).items()}
    models = {name: models[name] for name in names}
    batches_dev = [to_device(b, device) for b in batches]
    check = check_losses(models, batches_dev[0])
    contestants = [Contestant(name, model, args) for name, model in models.items()]
    run_rounds(contestants, batches_dev, args, device)
    summary = summarize(contestants, cfg, batches, device, args)
    hf_impl = {name: m.config._attn_implementation for name, m in models.items()
               if name.startswith("hf")}
    result = {
        **meta, "benchmark": "modernbert",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
        "model": {"shape": cfg.shape_summary(), "preset": args.preset,
                  "local_attention": cfg.local_attention,
                  "layer_types": cfg.resolved_layer_types(),
                  "parameters": cfg.num_parameters(), "hf_attn_implementation": hf_impl},
        "batches": batch_facts(batches), "loss_check": check, **summary,
    }
    for name, r in summary["results"].items():
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""
        print(f"{name}: {r['tokens_per_s']:.0f} tokens/s ({r['tokens_per_s_min']:.0f}-"
              f"{r['tokens_per_s_max']:.0f}), {r['model_tflops_per_s']:.3f} TFLOP/s{mfu}")
    for key, value in summary["ratios"].items():
        if key.endswith("_median_of_rounds"):
            print(f"{key.removesuffix('_median_of_rounds')}: {value}x")
    write_result(result_path(f"modernbert-{device.type}", args.output), result)


if __name__ == "__main__":
    run_cli(main)
