"""BART train-step and generation throughput: bertforge against transformers' BART, one run.

    python benchmarks/bart_bench.py                                 # CPU, 4+4 x 256 BART, batch 16
    python benchmarks/bart_bench.py --rounds 2 --gen-texts 4        # a quick check
    python benchmarks/bart_bench.py --generation-only --threads 1   # generation only
    python benchmarks/bart_bench.py --skip-generation --lengths random  # train step, mixed lengths
    python benchmarks/bart_bench.py --device cuda --precision bf16 --preset bart-base --batch 64

Both models hold the same weights (bertforge's ``save_pretrained`` -> transformers'
``BartForConditionalGeneration.from_pretrained``, SDPA attention) and see the same inputs:

* **train step**: real denoising batches (the stdlib docstring sample corpus, byte-level BPE,
  ``prepare --objective denoise``, noised by bertforge's loader with the default recipe; the
  longest documents, or ``--lengths random`` for variable-length pairs), one ``train_step`` of
  bertforge's loop each (forward, loss, backward, clip, AdamW); bertforge's loss is
  ``seq2seq_loss``, on the unpadded path pretraining runs by default (``train.unpad``; padded
  rows with ``--no-unpad``), transformers' is its own forward with ``labels``. Before timing,
  both losses on one batch must agree (fp32, dropout off), on the padded and on the trained
  path; both models then train with the same dropout (``--train-dropout``, default the
  config's: BART's 0.1). The first contestant alternates between rounds, and the median of
  each round's own ratio is reported beside the ratio of the median speeds.
* **generation**: beam search (4 beams, length penalty 2.0, 20 to 60 tokens, no repeated
  trigram, early stopping) and greedy search (the same lengths and trigram ban) on
  ``--gen-texts`` sources of the same batches, bertforge's ``generate`` against transformers'
  ``generate``; the outputs must be token-identical (a difference stops the run), so both did
  the same work. Besides the ratio of the median speeds, the median of each round's own ratio
  is reported (both sides moments apart: steadier on a shared machine).

Variants run in interleaved rounds after a warm-up; the median over rounds is reported with
min/max as the noise. ``--compile`` adds bertforge with its layers compiled (``train.compile``,
the GPU default) as a third contestant on the same weights; model FLOP/s counts each pair at its
real lengths, and on a GPU with a known peak ``mfu`` divides by it. Results:
``benchmarks/results/bart-<device>-<date>.json``
(``--generation-only``: ``bart-<device>-generation-<date>.json``).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402
from bertforge.data.batch import IGNORE_INDEX, LossOutput  # noqa: E402

GENERATION = dict(num_beams=4, length_penalty=2.0, min_length=20, max_length=60,
                  no_repeat_ngram_size=3, early_stopping=True)
# Greedy search on the same sources: the same lengths and n-gram ban (beam-only settings left
# out, which transformers would warn about).
GREEDY = dict(num_beams=1, min_length=20, max_length=60, no_repeat_ngram_size=3)
CONTESTANTS = ("bertforge", "hf")


def bench_generation(args: argparse.Namespace, ours, hf, tok, src: torch.Tensor,
                     mask: torch.Tensor, autocast, device: torch.device) -> dict:
    """Beam search (``GENERATION``) and greedy search (``GREEDY``): bertforge's ``generate``
    against transformers' on the same sources. Each search must give the same tokens on both
    sides in full fp32 (no TF32) before any timing; the timed rounds run as a user's
    --precision would, interleaved (beam and greedy, both contestants, the first contestant
    alternating), after one warm-up round. Returns the result sections ``generation`` (beam,
    the key earlier results use) and ``generation_greedy``."""
    from bertforge.models.generation import GenerationConfig, generate
    from bertforge.runtime.precision import float32_matmul

    searches = {"generation": GENERATION, "generation_greedy": GREEDY}
    configs = {key: GenerationConfig.from_model_config(ours.config, **settings)
               for key, settings in searches.items()}

    def run(key: str, name: str) -> torch.Tensor:
        if name == "bertforge":
            return generate(ours, src, mask, configs[key])
        return hf.generate(input_ids=src, attention_mask=mask, **searches[key],
                           forced_bos_token_id=tok.bos_id)

    with torch.no_grad(), float32_matmul("highest"):
        for key in searches:
            exact = {name: run(key, name).cpu() for name in CONTESTANTS}
            if args.precision == "fp32" and exact["bertforge"].tolist() != exact["hf"].tolist():
                raise RuntimeError(f"{key}: bertforge and transformers generated different "
                                   "tokens in fp32")
    times = {key: {name: [] for name in CONTESTANTS} for key in searches}
    outputs: dict[tuple[str, str], torch.Tensor] = {}
    for r in range(args.rounds + 1):
        for key in searches:
            for name in (CONTESTANTS if r % 2 else CONTESTANTS[::-1]):
                _sync(device)
                t0 = time.perf_counter()
                with torch.no_grad(), autocast():
                    out = run(key, name)
                _sync(device)
                if r:  # round 0 warms up
                    times[key][name].append(time.perf_counter() - t0)
                outputs[key, name] = out.cpu()
    result = {}
    for key, settings in searches.items():
        seconds = times[key]
        new_tokens = int((outputs[key, "bertforge"][:, 1:] != tok.pad_id).sum())
        section: dict = {}
        for name in CONTESTANTS:
            s = spread([len(src) / t for t in seconds[name]])
            section[name] = {
                "texts_per_s": round(s["median"], 3), "texts_per_s_min": round(s["min"], 3),
                "texts_per_s_max": round(s["max"], 3), "noise_pct": round(s["noise_pct"], 1),
                "new_tokens_per_s": round(s["median"] * new_tokens / len(src), 1)}
        # Each round's own ratio (both sides measured moments apart), then their median: less
        # exposed to load that changes between rounds than the ratio of the medians.
        per_round = [h / b for b, h in zip(seconds["bertforge"], seconds["hf"])]
        section.update({
            "settings": settings, "texts": len(src), "new_tokens": new_tokens,
            "identical_tokens": outputs[key, "bertforge"].tolist() == outputs[key, "hf"].tolist(),
            "ratio_bertforge_over_hf": round(section["bertforge"]["texts_per_s"]
                                             / section["hf"]["texts_per_s"], 3),
            "ratio_per_round": [round(x, 3) for x in per_round],
            "ratio_median_of_rounds": round(spread(per_round)["median"], 3)})
        result[key] = section
        print(f"{key}: " + ", ".join(f"{name} {section[name]['texts_per_s']:.2f} texts/s"
                                      for name in CONTESTANTS)
              + f"; bertforge/hf {section['ratio_bertforge_over_hf']}x (median of rounds "
              f"{section['ratio_median_of_rounds']}x, identical tokens: "
              f"{section['identical_tokens']})", flush=True)
    result["load_average_1m_after_generation"] = round(os.getloadavg()[0], 2)
    return result


def real_batches(args: argparse.Namespace, tmp: Path) -> tuple[list[dict], object]:
    """``args.num_batches`` noised denoising micro-batches of the sample corpus; the tokenizer."""
    from bertforge.config import NoiseConfig
    from bertforge.data.native import NativeDataset
    from bertforge.data.prepare import prepare
    from bertforge.demo.corpus import build_sample_corpus
    from bertforge.data.collate.seq2seq import DenoisingBatchMaker
    from bertforge.data.noising import noise_vocab
    from bertforge.tokenization import load_tokenizer
    from bertforge.tokenization.training import train_bpe

    corpus = build_sample_corpus(tmp / "corpus.txt")
    train_bpe([corpus], vocab_size=args.vocab_size, output=tmp / "bpe", progress=False)
    prepare([corpus], vocab=tmp / "bpe", output=tmp / "data", objective="denoise",
            max_seq_length=args.seq, validation_fraction=0.0, workers=1, seed=args.seed,
            progress=False)
    tok = load_tokenizer(tmp / "bpe")
    data = NativeDataset(tmp / "data", "train")
    maker = DenoisingBatchMaker(data, seed=args.seed, spec=NoiseConfig().spec(),
                                vocab=noise_vocab(tok),
                                pad_id=tok.pad_id, max_source_length=args.seq + 16)
    n = args.batch * args.num_batches
    if getattr(args, "lengths", "longest") == "random":  # variable-length pairs
        picked = np.random.default_rng(args.seed).permutation(len(data.lengths))[:n]
    else:  # full-length documents, as a phase-1 batch would be after length binning
        picked = np.argsort(-data.lengths, kind="stable")[:n]
    return [maker[(0, picked[i::args.num_batches])] for i in range(args.num_batches)], tok


def build_models(args: argparse.Namespace, tok: object, tmp: Path):
    import transformers

    from bertforge.models.bart import BartConfig, BartForConditionalGeneration

    ids = dict(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id,
               eos_token_id=tok.eos_id, decoder_start_token_id=tok.eos_id,
               forced_bos_token_id=tok.bos_id, forced_eos_token_id=tok.eos_id)
    if args.preset:
        cfg = BartConfig.from_preset(args.preset, **ids)
    else:
        cfg = BartConfig(d_model=args.d_model, encoder_layers=args.layers,
                         decoder_layers=args.layers, encoder_attention_heads=args.heads,
                         decoder_attention_heads=args.heads, encoder_ffn_dim=4 * args.d_model,
                         decoder_ffn_dim=4 * args.d_model, max_position_embeddings=512, **ids)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(args.seed)
    ours = BartForConditionalGeneration(cfg)
    ours.save_pretrained(tmp / "model")
    hf, info = transformers.BartForConditionalGeneration.from_pretrained(
        str(tmp / "model"), attn_implementation="sdpa", output_loading_info=True)
    if any(info.values()):
        raise RuntimeError(f"transformers did not load every weight: {info}")
    return ours, hf


def hf_loss(model, batch: dict) -> LossOutput:
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"], labels=batch["labels"])
    return LossOutput(out.loss, {"loss": out.loss.detach()}, sequences=batch["labels"].shape[0],
                      tokens=batch["attention_mask"].sum())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """One contestant's model, loss, AdamW and precision for bertforge's ``train_step``."""

    def __init__(self, name: str, model, loss_fn, args: argparse.Namespace) -> None:
        from bertforge.optim import build_optimizer, build_scheduler
        from bertforge.runtime.precision import build_precision

        self.name, self.model, self.loss_fn = name, model, loss_fn
        self.optimizer = build_optimizer(model, "adamw", lr=1e-4, weight_decay=0.01,
                                         max_grad_norm=1.0)
        self.scheduler = build_scheduler(self.optimizer, "constant", total_steps=10**9, warmup=0.0)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.precision = build_precision(args.precision, next(model.parameters()).device)
        self.seq_per_s: list[float] = []
        self.warmup_seconds = 0.0

    def steps(self, batches: list[dict]) -> None:
        from bertforge.train.loop import train_step

        with self.precision.scope():  # the run's numerics (TF32 on a GPU), for this call only
            for batch in batches:
                train_step(self.model, [batch], self.loss_fn, self.optimizer, self.scheduler,
                           self.precision, self.params, 1.0)


def set_train_dropout(ours, hf, p: float) -> None:
    """Residual and embedding dropout ``p`` in both models (the loss check zeroed bertforge's
    nn.Dropout modules, which transformers' BART does not use: it reads float attributes)."""
    for name, module in ours.named_modules():
        if name.rsplit(".", 1)[-1] == "dropout" and isinstance(module, torch.nn.Dropout):
            module.p = p
    for module in hf.modules():
        if type(module).__name__ in ("BartEncoder", "BartDecoder", "BartEncoderLayer",
                                     "BartDecoderLayer"):
            module.dropout = p


def bench_train_step(args: argparse.Namespace, ours, hf, batches: list[dict],
                     device: torch.device, hf_check: float) -> tuple[dict, dict]:
    """bertforge's ``train_step`` against transformers' on the same batches: bertforge unpadded
    (``apply_speed_options``: pretraining's train.unpad default and the CPU dropout kernel) unless --no-unpad, its loss checked
    against ``hf_check`` on that path first; both with --train-dropout. Interleaved rounds, the
    first contestant alternating. -> (the ``train_step`` section, other result entries)."""
    from bertforge.tasks.denoise import seq2seq_loss
    from bertforge.train.flops import peak_flops, seq2seq_train_flops
    from bertforge.speed import apply_speed_options

    apply_speed_options(ours, unpad=not args.no_unpad)
    with torch.no_grad():
        ours.eval()
        checked = float(seq2seq_loss(ours, batches[0]).loss)
    if abs(checked - hf_check) > 1e-4 * max(1.0, abs(hf_check)):
        raise RuntimeError(f"bertforge loss {checked:.6f} (unpad={not args.no_unpad}) != "
                           f"transformers loss {hf_check:.6f}")
    # The config's dropout: main() zeroed the configs, not transformers' float attributes.
    dropout = hf.model.encoder.dropout if args.train_dropout is None else args.train_dropout
    set_train_dropout(ours, hf, dropout)
    ours.train(), hf.train()
    trainers = [Trainer("bertforge", ours, seq2seq_loss, args), Trainer("hf", hf, hf_loss, args)]
    if args.compile:  # the same weights, layers compiled as train.compile does (GPU default)
        from bertforge.speed import compile_layers

        compiled = copy.deepcopy(ours)
        compile_layers(compiled)
        trainers.append(Trainer("bertforge-compiled", compiled, seq2seq_loss, args))
    for t in trainers:  # compiled: every batch once, so no compile lands in a timed round
        warm = max(args.warmup, len(batches) if t.name.endswith("-compiled") else 0)
        t0 = time.perf_counter()
        t.steps([batches[i % len(batches)] for i in range(warm)])
        _sync(device)
        t.warmup_seconds = time.perf_counter() - t0
    spr, ratios = args.steps_per_round, []
    for r in range(args.rounds):
        picked = [batches[(r * spr + j) % len(batches)] for j in range(spr)]
        seqs = sum(int(b["input_ids"].shape[0]) for b in picked)
        for t in (trainers if r % 2 == 0 else trainers[::-1]):
            _sync(device)
            t0 = time.perf_counter()
            t.steps(picked)
            _sync(device)
            t.seq_per_s.append(seqs / (time.perf_counter() - t0))
        ratios.append(trainers[0].seq_per_s[-1] / trainers[1].seq_per_s[-1])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{t.name} {t.seq_per_s[-1]:.1f} seq/s" for t in trainers), flush=True)

    n_seqs = sum(b["input_ids"].shape[0] for b in batches)
    flops = sum(seq2seq_train_flops(ours.config, b["attention_mask"].sum(1).cpu(),
                                    b["labels"].ne(IGNORE_INDEX).sum(1).cpu())
                for b in batches) / n_seqs
    tokens = sum(float(b["attention_mask"].sum() + b["labels"].ne(IGNORE_INDEX).sum())
                 for b in batches) / n_seqs
    padded = sum(b["input_ids"].numel() + b["labels"].numel() for b in batches) / n_seqs
    peak = peak_flops(device, args.precision)
    train = {}
    for t in trainers:
        s = spread(t.seq_per_s)
        train[t.name] = {"seq_per_s": round(s["median"], 2), "seq_per_s_min": round(s["min"], 2),
                         "seq_per_s_max": round(s["max"], 2), "noise_pct": round(s["noise_pct"], 1),
                         "tokens_per_s": round(s["median"] * tokens),
                         "model_tflops_per_s": round(s["median"] * flops / 1e12, 4),
                         "mfu": round(s["median"] * flops / peak, 4) if peak else None,
                         "warmup_seconds": round(t.warmup_seconds, 1)}
    train["ratio_bertforge_over_hf"] = round(
        train["bertforge"]["seq_per_s"] / train["hf"]["seq_per_s"], 3)
    if "bertforge-compiled" in train:
        train["ratio_compiled_over_hf"] = round(
            train["bertforge-compiled"]["seq_per_s"] / train["hf"]["seq_per_s"], 3)
    train["ratio_median_of_rounds"] = round(float(np.median(ratios)), 3)
    extra = {"lengths": args.lengths, "unpad": not args.no_unpad, "train_dropout": dropout,
             "mean_tokens_per_pair": round(tokens, 1),
             "mean_padded_tokens_per_pair": round(padded, 1),
             "loss_check": {"bertforge_train_path": checked}}
    return train, extra


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu).")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--preset", help="A BART preset (bart-base, bart-large, ...); default: the "
                                     "shape options below.")
    ap.add_argument("--layers", type=int, default=4, help="Encoder and decoder layers each.")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary trained on the sample.")
    ap.add_argument("--batch", type=int, default=16, help="Documents per train step.")
    ap.add_argument("--seq", type=int, default=128, help="Document length when preparing.")
    ap.add_argument("--num-batches", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2, help="Untimed train steps per model.")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps-per-round", type=int, default=2)
    ap.add_argument("--gen-texts", type=int, default=8, help="Sources per generation round.")
    ap.add_argument("--generation-only", action="store_true",
                    help="Measure generation (beam and greedy) only, not the train step.")
    ap.add_argument("--skip-generation", action="store_true",
                    help="Measure the train step only, not generation.")
    ap.add_argument("--lengths", default="longest", choices=["longest", "random"],
                    help="Documents of the batches: the longest (full-length pairs, as after "
                         "length binning; the default) or drawn at random (variable-length "
                         "source/target pairs, as without binning).")
    ap.add_argument("--no-unpad", action="store_true",
                    help="Train bertforge on padded rows (train.unpad=false); default: "
                         "unpadded, pretraining's default.")
    ap.add_argument("--train-dropout", type=float, default=None,
                    help="Dropout of both models in the timed train steps (residual and "
                         "embedding dropout; attention and activation dropout stay 0); "
                         "default: the model config's (BART's 0.1 for the default shape).")
    ap.add_argument("--compile", action="store_true",
                    help="Also time bertforge with its layers compiled (train.compile, the GPU "
                         "default), the same weights: a third contestant, bertforge-compiled.")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: results/bart-<device>-<date>.json).")
    return ap.parse_args()


def main() -> None:
    args = parse_args()

    from bertforge.errors import ConfigError
    from bertforge.tasks.denoise import seq2seq_loss
    from bertforge.data.batch import to_device

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible")
    if args.skip_generation and args.generation_only:
        raise ConfigError("--skip-generation and --generation-only exclude each other")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    meta = metadata()
    tmp = Path(tempfile.mkdtemp(prefix="bart-bench-"))
    try:
        batches, tok = real_batches(args, tmp)
        ours, hf = build_models(args, tok, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    batches = [to_device(b, device) for b in batches]
    ours, hf = ours.to(device), hf.to(device)
    for m in (ours, hf):  # dropout off: the loss check and generation compare exact numbers
        m.config.dropout = 0.0
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0

    with torch.no_grad():
        ours.eval(), hf.eval()
        a = float(seq2seq_loss(ours, batches[0]).loss)
        b = float(hf_loss(hf, batches[0]).loss)
    if abs(a - b) > 1e-4 * max(1.0, abs(b)):
        raise RuntimeError(f"bertforge loss {a:.6f} != transformers loss {b:.6f}")

    # --- generation (before training changes the weights; both still identical) -------------
    first = batches[0]
    src, mask = first["input_ids"][: args.gen_texts], first["attention_mask"][: args.gen_texts]
    autocast = Trainer("probe", ours, None, args).precision.autocast
    generation = ({} if args.skip_generation
                  else bench_generation(args, ours, hf, tok, src, mask, autocast, device))
    if args.generation_only:
        write_result(result_path(f"bart-{device.type}-generation", args.output), {
            **meta, "benchmark": "bart",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": args.precision, "threads": args.threads,
            "model": {"shape": ours.config.shape_summary(),
                      "parameters": ours.config.num_parameters()}, **generation})
        return

    # --- train step -----------------------------------------------------------------------------
    train, extra = bench_train_step(args, ours, hf, batches, device, b)
    checked = extra.pop("loss_check")
    result = {
        **meta,
        "benchmark": "bart",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": args.precision, "threads": args.threads,
        "model": {"shape": ours.config.shape_summary(),
                  "parameters": ours.config.num_parameters()},
        "batch": args.batch, "seq": args.seq, **extra,
        "loss_check": {"bertforge": a, "hf": b, **checked},
        "train_step": train,
        **generation,
    }
    line = f"train step: bertforge/hf = {train['ratio_bertforge_over_hf']}x"
    if "ratio_compiled_over_hf" in train:
        line += f", compiled/hf = {train['ratio_compiled_over_hf']}x"
    if generation:
        line += (f"; generation: beam {result['generation']['ratio_bertforge_over_hf']}x, "
                 f"greedy {result['generation_greedy']['ratio_bertforge_over_hf']}x")
    print(line)
    write_result(result_path(f"bart-{device.type}", args.output), result)


if __name__ == "__main__":
    run_cli(main)
