"""Beam-search summaries at bf16 and int8 against transformers' ``generate`` in fp32, with ROUGE.

    python benchmarks/summarize_precision.py            # train (or reuse) the model, 50 articles
    python benchmarks/summarize_precision.py --quick    # a ~3 minute check: tiny model, 5 articles
    python benchmarks/summarize_precision.py --retrain  # train the model afresh

Issue 40's goal: bertforge generating at ``precision=auto`` (bf16 on a CPU with a bf16 unit) at
least 2x transformers' ``generate`` in fp32 on the same weights and beam settings, with ROUGE
against the reference highlights within 0.2 points of transformers'; token identity stays the
guarantee of fp32.

**The model.** No pretrained BART weights are available offline, so a small post-LN BART
(4+4 layers x 256, transformers' ``BartForConditionalGeneration`` layout) is trained here: a
copy warm-up on random tokens (:func:`copy_warmup`: from random weights, denoising text stays
on the unigram plateau for longer than this benchmark can spend), then denoising with
``bertforge.commands.train.pretrain`` (text infilling with one ``<mask>`` per masked token,
sentences kept in order) on CNN/DailyMail articles 51-100 of
``../shared/data/summarization/cnndm_test_summeval100.jsonl``, the Wikipedia articles of the
SQuAD dev parts, the news sentences of MRPC and RTE and the standard library's docstrings
(``bertforge.demo.corpus``), with a byte-level BPE trained on the same text. A denoiser
copies: from a clean article, beam search writes its lead, a "lead" summary whose ROUGE
against the references is a real number (lead-3, the classic CNN/DailyMail baseline, is
reported for scale). Articles 1-50 are never trained on: they are the evaluation. The model,
its data and tokenizer are kept under ``--work`` and reused while the training settings are
unchanged.

**The contestants** decode the same padded batches of articles 1-50 (``--articles``), cut to
the pretraining length (``--seq``), longest first, ``--batch`` per call, with the same beam
settings (``GENERATION``): transformers' ``from_pretrained`` model in fp32 (``hf``), and
bertforge's ``generate`` on its own copy of the model loaded as ``bertforge generate`` does, its
precision settled by ``bertforge.runtime.guard.choose_precision`` with the probe
``generate_file`` builds (the first 8 sources, 128 tokens): asked ``fp32``, ``auto``, ``bf16``
and ``int8``. bertforge fp32 must give transformers' tokens (``fp32_token_identical``). For each
contestant: ROUGE-1/2/L/Lsum against the highlights (``bertforge.metrics.rouge``), the
difference to ``hf`` in points, the fraction of outputs token-identical to ``hf``'s, and its
speed: every round runs every contestant over all articles (the order rotating between
rounds, after one untimed batch each), medians over ``--rounds`` and the median of each
round's own ratio ``hf`` seconds / contestant seconds. Results:
``benchmarks/results/summarize-precision-cpu-<date>.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
CNNDM = SHARED / "summarization" / "cnndm_test_summeval100.jsonl"
HELD_OUT = 50  # articles 1-50 are the evaluation; 51-100 may be trained on
GENERATION = dict(num_beams=4, length_penalty=2.0, min_length=30, max_length=80,
                  no_repeat_ngram_size=3, early_stopping=True)
ASKED = ("fp32", "auto", "bf16", "int8")  # bertforge's contestants, by asked precision
GOAL_SPEEDUP, GOAL_ROUGE_POINTS = 2.0, 0.2


# --------------------------------------------------------------------------- the corpus


def _document(sentences: list[str]) -> str:
    """One document in ``bertforge prepare``'s text format: a sentence per line."""
    return "".join(s + "\n" for s in sentences if s.strip())


def _squad_documents() -> list[str]:
    """Each Wikipedia article of the SQuAD dev parts as one document (paragraphs deduplicated)."""
    from bertforge.data.segment import split_sentences

    seen: set[str] = set()
    docs = []
    for name in ("dev-v1.1-part-a.json", "dev-v2.0-part-a.json"):
        for article in json.loads((SHARED / "squad" / name).read_text(encoding="utf-8"))["data"]:
            contexts = [p["context"] for p in article["paragraphs"] if p["context"] not in seen]
            seen.update(contexts)
            if contexts:
                docs.append(_document([s for c in contexts for s in split_sentences(c)]))
    return docs


def _news_sentences() -> list[str]:
    """The distinct news sentences of MRPC (both columns) and RTE (premises), in file order."""
    import csv

    seen: dict[str, None] = {}
    with open(SHARED / "glue" / "MRPC" / "train.tsv", encoding="utf-8-sig", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            seen.update(dict.fromkeys([row["#1 String"], row["#2 String"]]))
    for line in (SHARED / "glue" / "RTE" / "train.jsonl").read_text(encoding="utf-8").splitlines():
        seen.setdefault(json.loads(line)["premise"])
    return list(seen)


def build_corpus(path: Path, articles: list[dict], sample_bytes: int) -> dict[str, int]:
    """The pretraining corpus at ``path`` (documents separated by blank lines): CNN/DailyMail
    articles 51-100, SQuAD's Wikipedia articles, MRPC/RTE news sentences (8 to a document) and
    ``sample_bytes`` of the standard library's docstrings. -> documents per source."""
    from bertforge.core.io import write_text_atomic
    from bertforge.data.segment import split_sentences
    from bertforge.demo.corpus import build_sample_corpus

    parts = {"cnndm_51_100": [_document(split_sentences(a["article"]))
                              for a in articles[HELD_OUT:]],
             "squad_wikipedia": _squad_documents()}
    news = _news_sentences()
    parts["mrpc_rte_news"] = [_document(news[i:i + 8]) for i in range(0, len(news), 8)]
    sample = build_sample_corpus(path.with_suffix(".docstrings.txt"), max_bytes=sample_bytes)
    parts["stdlib_docstrings"] = [d.strip("\n") + "\n" for d in
                                  sample.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    write_text_atomic(path, "\n".join(d for docs in parts.values() for d in docs))
    return {name: len(docs) for name, docs in parts.items()}


def read_articles() -> list[dict]:
    from bertforge.errors import ConfigError

    if not CNNDM.is_file():
        raise ConfigError(f"{CNNDM} is missing: this benchmark needs the shared evaluation data "
                          "(../shared/data/summarization, see its README)")
    return [json.loads(line) for line in CNNDM.read_text(encoding="utf-8").splitlines()]


# --------------------------------------------------------------------------- the model


def train_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the trained model depends on: a cached model is reused only when equal."""
    return {"layers": args.layers, "d_model": args.d_model, "heads": args.heads,
            "vocab_size": args.vocab_size, "seq": args.seq, "steps": args.steps,
            "batch": args.train_batch, "lr": args.lr, "mask": args.mask,
            "sample_bytes": args.sample_bytes, "seed": args.seed, "copy_steps": args.copy_steps,
            "train_precision": args.train_precision, "version": 2}


def _model_config(args: argparse.Namespace, tok: Any) -> Any:
    """A post-LN BART config (transformers' BART layout) with the tokenizer's ids."""
    from bertforge.models.bart import BartConfig

    return BartConfig(
        vocab_size=tok.vocab_size, d_model=args.d_model, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model, max_position_embeddings=512, dropout=0.0,
        pad_token_id=tok.pad_id, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
        decoder_start_token_id=tok.eos_id, forced_bos_token_id=tok.bos_id,
        forced_eos_token_id=tok.eos_id)


def copy_warmup(model: Any, tok: Any, args: argparse.Namespace) -> list[float]:
    """Teach a fresh model to copy before it sees text: ``args.copy_steps`` AdamW steps (lr
    1e-3, constant) on sequences of uniformly random tokens, ``<s> x1..xn </s>`` to itself,
    laid out as a denoising pair (decoder input = the target shifted right behind ``</s>``).
    The first 60% of the steps use 48 tokens, the rest ``args.seq``.

    Why: from random weights, denoising text sits on the unigram plateau while
    cross-attention has not yet found the alignment (measured on this corpus, 4+4 x 256,
    post-LN, 128 tokens: loss 7.2-7.3 after 300-375 steps, masking 10% or nothing; at 48
    tokens the loss fell only as far as a language model gets, 6.2 after 400 steps), and
    random-token copying at 126 tokens had not started after 175 steps. At 48 tokens the same
    copying is learned in ~200 steps (loss 0.8), and from there 126 tokens in ~100 more (0.2).
    Random tokens leave no shortcut but the source. -> the loss every 25 steps.
    """
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0)
    special = max(tok.bos_id, tok.pad_id, tok.eos_id, tok.unk_id, tok.mask_id) + 1
    losses, short = [], int(0.6 * args.copy_steps)
    model.train()
    for step in range(args.copy_steps):
        n = 48 if step < short else args.seq
        body = torch.randint(special, tok.vocab_size, (args.train_batch, n - 2), generator=gen)
        bos, eos = (body.new_full((args.train_batch, 1), i) for i in (tok.bos_id, tok.eos_id))
        target = torch.cat([bos, body, eos], 1)  # (B, n)
        shifted = torch.cat([eos, target[:, :-1]], 1)  # decoder input, (B, n)
        logits = model(target, torch.ones_like(target), shifted).logits  # (B, n, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.copy_steps - 1:
            losses.append(round(loss.item(), 4))
            print(f"copy warm-up: step {step + 1}/{args.copy_steps} ({n} tokens): loss "
                  f"{losses[-1]:.3f}", flush=True)
    return losses


def warm_start(args: argparse.Namespace, tok: Any, out: Path) -> tuple[Path, list[float]]:
    """The model pretraining starts from, saved at ``out``: fresh weights (``--seed``) after
    :func:`copy_warmup`. -> (its directory, the warm-up losses)."""
    from bertforge.models.bart import BartForConditionalGeneration

    torch.manual_seed(args.seed)
    model = BartForConditionalGeneration(_model_config(args, tok))
    losses = copy_warmup(model, tok, args) if args.copy_steps else []
    model.save_pretrained(out, tokenizer=tok)
    return out, losses


def _pretrain(args: argparse.Namespace, data: Path, start: Path, out: Path) -> Any:
    """Denoising pretraining from the weights in ``start``: AdamW, linear decay after 5%
    warm-up, no dropout. Text infilling with one ``<mask>`` per masked token
    (``replace_length=-1``) and sentences kept in order: every token keeps its position, so the
    copying the warm-up taught stays right on text (with one ``<mask>`` per span, the default,
    the source shifts after every span and the loss stayed near 5 for 100 steps), and the
    model copies in order: its output from a clean article is the lead."""
    from bertforge.commands.train import pretrain
    from bertforge.config import PretrainConfig, load_config

    cfg = load_config(PretrainConfig, None, [
        f"--model={start}", f"--init_from={start}", f"--data.path={data}",
        f"--output_dir={out}", "--resume=none",
        f"--train.max_steps={args.steps}", f"--train.global_batch_size={args.train_batch}",
        f"--train.micro_batch_size={args.train_batch}", f"--train.seed={args.seed}",
        f"--train.log_every={max(1, min(25, args.steps // 10))}", "--train.eval_batches=4",
        "--optim.name=adamw", f"--optim.lr={args.lr}", "--optim.warmup=0.05",
        "--optim.schedule=linear", "--optim.weight_decay=0.01", "--optim.betas=[0.9,0.98]",
        f"--precision={args.train_precision}",
        f"--checkpoint.every={max(1, args.steps // 4)}",
        "--checkpoint.keep=1", "--tensorboard=false", "--data.num_workers=0",
        "--data.noise.permute_sentences=0", "--data.noise.replace_length=-1",
        f"--data.noise.mask={args.mask}"])
    return pretrain(cfg)


def trained_model(args: argparse.Namespace, articles: list[dict]) -> tuple[Path, dict]:
    """The model directory under ``--work`` for these settings, trained here unless an earlier
    run left one (``--retrain`` trains anyway). -> (directory, its training record)."""
    from bertforge.core.io import write_json_atomic
    from bertforge.data.prepare import prepare
    from bertforge.tokenization import load_tokenizer
    from bertforge.tokenization.training import train_bpe

    settings = train_settings(args)
    root = Path(args.work) / ("quick" if args.quick else "full")
    record_path, model_dir = root / "trained.json", root / "model"
    if record_path.is_file() and not args.retrain:
        record = json.loads(record_path.read_text())
        if record["settings"] == settings and (model_dir / "config.json").is_file():
            print(f"reusing the model in {model_dir} (--retrain trains it afresh)", flush=True)
            return model_dir, record
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    corpus = root / "corpus.txt"
    documents = build_corpus(corpus, articles, args.sample_bytes)
    train_bpe([corpus], vocab_size=args.vocab_size, output=root / "bpe", progress=False)
    report = prepare([corpus], vocab=root / "bpe", output=root / "data", objective="denoise",
                     max_seq_length=args.seq, validation_fraction=0.02, workers=1,
                     seed=args.seed, progress=False)
    start, copy_losses = warm_start(args, load_tokenizer(root / "bpe"), root / "start")
    result = _pretrain(args, root / "data", start, root / "run")
    shutil.copytree(result.final_checkpoint, model_dir)
    shutil.rmtree(root / "run", ignore_errors=True)
    losses = [row["loss"] for row in result.history if "loss" in row]
    record = {"settings": settings, "documents": documents, "copy_warmup_losses": copy_losses,
              "corpus_bytes": corpus.stat().st_size, "train_tokens": report.totals.get("tokens"),
              "loss_first": losses[0], "loss_last": losses[-1],
              "validation": {k: float(v) for k, v in result.validation.items()},
              "minutes": round((time.perf_counter() - t0) / 60, 1)}
    write_json_atomic(record_path, record)
    return model_dir, record


# --------------------------------------------------------------------------- the contestants


@dataclass
class Contestant:
    """One way of generating: ``run`` maps the batches to output token rows (pads stripped)."""

    name: str
    run: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], list[list[int]]]
    precision: str
    reason: str
    agreement: float | None = None  # the guard's probe cosine to fp32 (None: not probed)
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # this process's CPU time per pass
    rows: list[list[int]] | None = None
    stable: bool = True  # every round gave the same tokens


def _rows(sequences: torch.Tensor, pad_id: int) -> list[list[int]]:
    """(N, L) output ids -> one list per row without its trailing padding."""
    rows = []
    for row in sequences.tolist():
        while row and row[-1] == pad_id:
            row.pop()
        rows.append(row)
    return rows


def batches_of(sources: list[list[int]], batch: int, pad_id: int
               ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
    """Padded (ids, mask) batches of ``sources``, longest first as ``generate_texts`` batches
    them, and the article index of each output row in batch order."""
    from torch.nn.utils.rnn import pad_sequence

    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    out = []
    for start in range(0, len(order), batch):
        rows = [torch.tensor(sources[i]) for i in order[start:start + batch]]
        ids = pad_sequence(rows, batch_first=True, padding_value=pad_id)  # (B, width)
        lengths = torch.tensor([len(r) for r in rows])
        out.append((ids, (torch.arange(ids.shape[1]) < lengths[:, None]).long()))
    return out, order


def probe_of(sources: list[list[int]], pad_id: int) -> Any:
    """The guard's probe as ``bertforge generate`` builds it: the first 8 sources cut to 128
    tokens, padded."""
    from bertforge.runtime.guard import Probe

    rows = [torch.tensor(s[:128]) for s in sources[:8]]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_id)
    mask = (torch.arange(ids.shape[1]) < torch.tensor([len(r) for r in rows])[:, None]).long()
    return Probe({"input_ids": ids, "attention_mask": mask}, mask)


def hf_contestant(model_dir: Path, tok: Any) -> Contestant:
    """transformers' BART from the same directory, fp32, its own ``generate``."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    model, info = transformers.BartForConditionalGeneration.from_pretrained(
        str(model_dir), output_loading_info=True)
    if any(info.values()):
        raise RuntimeError(f"transformers did not load every weight of {model_dir}: {info}")
    model.eval()

    def run(batches):
        rows = []
        with torch.no_grad():
            for ids, mask in batches:
                out = model.generate(input_ids=ids, attention_mask=mask, **GENERATION,
                                     forced_bos_token_id=tok.bos_id)
                rows.extend(_rows(out, tok.pad_id))
        return rows

    return Contestant("hf", run, "fp32", "transformers, fp32")


def bertforge_contestant(model_dir: Path, asked: str, probe: Any, tok: Any) -> Contestant:
    """bertforge's model loaded as ``bertforge generate`` loads it, its precision settled by the
    guard for ``asked``, decoding as ``generate_texts`` does (eager, under the precision's
    autocast)."""
    from bertforge.models.generation import GenerationConfig, generate
    from bertforge.models.loading import load_model, open_model
    from bertforge.runtime.guard import choose_precision

    model = load_model(open_model(model_dir, "--model"), "seq2seq-lm", device="cpu")
    choice, precision = choose_precision(model, torch.device("cpu"), asked, probe,
                                         seq2seq=True, where=f"bertforge-{asked}")
    config = GenerationConfig.from_model_config(model.config, **GENERATION)

    def run(batches):
        rows = []
        with (torch.no_grad(), torch.compiler.set_stance("force_eager"),
              precision.autocast()):
            for ids, mask in batches:
                rows.extend(_rows(generate(model, ids, mask, config), tok.pad_id))
        return rows

    return Contestant(f"bertforge-{asked}", run, choice.name, choice.summary(),
                      choice.agreement)


def time_rounds(contestants: list[Contestant], batches: list, rounds: int) -> None:
    """Every contestant over all ``batches`` once per round, the order rotating between rounds,
    after one untimed batch each (allocator and kernel warm-up). Fills ``seconds`` and
    ``rows`` (and ``stable``: each round's tokens equal the first's)."""
    for c in contestants:
        c.run(batches[:1])
    for r in range(rounds):
        k = r % len(contestants)
        order = contestants[k:] + contestants[:k]
        for c in order:
            t0, p0 = time.perf_counter(), time.process_time()
            rows = c.run(batches)
            c.seconds.append(time.perf_counter() - t0)
            c.cpu_seconds.append(time.process_time() - p0)
            c.stable = c.stable and (c.rows is None or rows == c.rows)
            c.rows = c.rows if c.rows is not None else rows
        print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{c.name} {c.seconds[-1]:.1f} s" for c in contestants), flush=True)


# --------------------------------------------------------------------------- scores and report


def _texts(rows: list[list[int]], order: list[int], tok: Any) -> list[str]:
    """Decoded outputs (special tokens removed) back in article order."""
    texts = [""] * len(rows)
    for pos, text in zip(order, tok.decode_batch(rows, skip_special_tokens=True)):
        texts[pos] = text.strip()
    return texts


def _rouge(texts: list[str], references: list[str]) -> dict[str, float]:
    from bertforge.metrics.rouge import ROUGE_TYPES, rouge_scores

    scores = rouge_scores(texts, references)
    return {name: round(scores[name], 3) for name in ROUGE_TYPES}


def lead3(articles: list[dict]) -> list[str]:
    """The first three sentences of each article: the classic extractive baseline, for scale."""
    from bertforge.data.segment import split_sentences

    return [" ".join(split_sentences(a["article"])[:3]) for a in articles]


def contestant_section(c: Contestant, hf: Contestant, texts: list[str], references: list[str],
                       hf_rouge: dict[str, float]) -> dict[str, Any]:
    """One contestant's result: precision and why, speed, ROUGE and agreement with ``hf``."""
    n = len(texts)
    s = spread([n / t for t in c.seconds])
    per_round = [h / t for h, t in zip(hf.seconds, c.seconds)]  # its speed over hf's
    rouge = _rouge(texts, references)
    new_tokens = sum(len(row) - 1 for row in c.rows)  # the decoder start is no output
    return {
        "precision": c.precision, "reason": c.reason, "probe_cosine": c.agreement,
        "seconds_per_round": [round(t, 3) for t in c.seconds],
        "cpu_seconds_per_round": [round(t, 3) for t in c.cpu_seconds],
        "texts_per_s": round(s["median"], 3), "texts_per_s_min": round(s["min"], 3),
        "texts_per_s_max": round(s["max"], 3), "noise_pct": round(s["noise_pct"], 1),
        "new_tokens_per_s": round(s["median"] * new_tokens / n, 1),
        "mean_output_tokens": round(new_tokens / n, 1),
        "ratio_over_hf_per_round": [round(x, 3) for x in per_round],
        "ratio_over_hf": round(spread(per_round)["median"], 3),
        "rouge": rouge,
        "rouge_minus_hf_points": {k: round(v - hf_rouge[k], 3) for k, v in rouge.items()},
        "identical_to_hf": round(sum(a == b for a, b in zip(c.rows, hf.rows)) / n, 3),
        "same_tokens_every_round": c.stable,
    }


def goal_of(section: dict[str, Any]) -> dict[str, Any]:
    """Issue 40's goal for ``bertforge-auto``: >= 2x hf and every ROUGE within 0.2 points."""
    worst = max(abs(v) for v in section["rouge_minus_hf_points"].values())
    speed_met = section["ratio_over_hf"] >= GOAL_SPEEDUP
    rouge_met = worst <= GOAL_ROUGE_POINTS
    return {"goal": f">= {GOAL_SPEEDUP}x transformers fp32, ROUGE within "
                    f"{GOAL_ROUGE_POINTS} points", "precision": section["precision"],
            "speedup": section["ratio_over_hf"], "worst_rouge_difference": round(worst, 3),
            "speed_met": speed_met, "rouge_met": rouge_met, "met": speed_met and rouge_met}


def report(contestants: list[Contestant], order: list[int], tok: Any,
           held: list[dict]) -> dict[str, Any]:
    """The result sections of every contestant, the lead-3 baseline, the goal and samples."""
    references = [a["highlights_tokenized"] for a in held]
    hf = contestants[0]
    texts = {c.name: _texts(c.rows, order, tok) for c in contestants}
    hf_rouge = _rouge(texts["hf"], references)
    sections = {c.name: contestant_section(c, hf, texts[c.name], references, hf_rouge)
                for c in contestants}
    fp32 = sections["bertforge-fp32"]["identical_to_hf"] == 1.0
    samples = [{"id": a["id"], "reference": references[i],
                **{name: texts[name][i] for name in ("hf", "bertforge-auto", "bertforge-int8")}}
               for i, a in enumerate(held[:2])]
    return {"contestants": sections, "fp32_token_identical": fp32,
            "lead3_rouge": _rouge(lead3(held), references),
            "goal": goal_of(sections["bertforge-auto"]), "samples": samples}


def print_table(result: dict[str, Any]) -> None:
    print(f"{'contestant':<16} {'precision':<9} {'texts/s':>8} {'x hf':>6} "
          f"{'R1':>6} {'R2':>6} {'RL':>6} {'RLsum':>6} {'dR max':>7} {'same':>5}")
    for name, s in result["contestants"].items():
        worst = max(s["rouge_minus_hf_points"].values(), key=abs)
        r = s["rouge"]
        print(f"{name:<16} {s['precision']:<9} {s['texts_per_s']:>8.2f} "
              f"{s['ratio_over_hf']:>6.2f} {r['rouge1']:>6.2f} {r['rouge2']:>6.2f} "
              f"{r['rougeL']:>6.2f} {r['rougeLsum']:>6.2f} {worst:>+7.2f} "
              f"{s['identical_to_hf']:>5.2f}")
    goal = result["goal"]
    print(f"lead-3 ROUGE-1/2/L: {result['lead3_rouge']['rouge1']:.2f}/"
          f"{result['lead3_rouge']['rouge2']:.2f}/{result['lead3_rouge']['rougeL']:.2f}; "
          f"fp32 token-identical to transformers: {result['fp32_token_identical']}; goal "
          f"(auto = {goal['precision']}: {goal['speedup']}x, worst ROUGE difference "
          f"{goal['worst_rouge_difference']}): {'met' if goal['met'] else 'not met'}",
          flush=True)


# --------------------------------------------------------------------------- command line

FULL = dict(articles=HELD_OUT, rounds=3, layers=4, d_model=256, heads=4, vocab_size=8000,
            steps=500, copy_steps=350, sample_bytes=1_000_000)
QUICK = dict(articles=5, rounds=1, layers=2, d_model=128, heads=4, vocab_size=2000,
             steps=30, copy_steps=10, sample_bytes=200_000)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="A check of the machinery in ~3 minutes: " + ", ".join(
                        f"{k} {v}" for k, v in QUICK.items()) + " (its own cached model).")
    ap.add_argument("--work", default=str(ROOT / "build" / "summarize-precision"),
                    help="Where the corpus, tokenizer, data and trained model are kept.")
    ap.add_argument("--retrain", action="store_true", help="Train the model even if cached.")
    ap.add_argument("--articles", type=int, help=f"Held-out articles (1..N, N <= {HELD_OUT}).")
    ap.add_argument("--rounds", type=int, help="Timed rounds.")
    ap.add_argument("--batch", type=int, default=8, help="Articles per generate call.")
    ap.add_argument("--seq", type=int, default=128,
                    help="Pretraining length, and the tokens of each article kept as source.")
    ap.add_argument("--layers", type=int, help="Encoder and decoder layers each.")
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--vocab-size", type=int, help="BPE vocabulary trained on the corpus.")
    ap.add_argument("--steps", type=int, help="Pretraining steps.")
    ap.add_argument("--train-batch", type=int, default=16, help="Documents per training step.")
    ap.add_argument("--copy-steps", type=int,
                    help="Steps of the random-token copy warm-up before denoising (0: none).")
    ap.add_argument("--lr", type=float, default=1e-3, help="Peak AdamW learning rate.")
    ap.add_argument("--mask", type=float, default=0.15,
                    help="Fraction of words masked (one <mask> per token).")
    ap.add_argument("--sample-bytes", type=int,
                    help="Bytes of standard-library docstrings in the corpus.")
    ap.add_argument("--train-precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: "
                                     "results/summarize-precision-cpu-<date>.json).")
    args = ap.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    from bertforge.errors import ConfigError
    from bertforge.tokenization import load_tokenizer

    if not 1 <= args.articles <= HELD_OUT:
        raise ConfigError(f"--articles {args.articles}: give 1..{HELD_OUT} (articles 51-100 are "
                          "training text)")
    torch.set_num_threads(args.threads)
    meta = metadata()
    meta["versions"]["rouge_score"] = importlib.metadata.version("rouge-score")  # no __version__
    articles = read_articles()
    model_dir, training = trained_model(args, articles)
    tok = load_tokenizer(model_dir)
    held = articles[:args.articles]
    sources = tok.encode_truncated([a["article"] for a in held], args.seq)
    batches, order = batches_of(sources, args.batch, tok.pad_id)
    probe = probe_of(sources, tok.pad_id)
    contestants = [hf_contestant(model_dir, tok)] + [
        bertforge_contestant(model_dir, asked, probe, tok) for asked in ASKED]
    t0 = time.perf_counter()
    time_rounds(contestants, batches, args.rounds)
    result = {**meta, "benchmark": "summarize-precision", "device": "cpu",
              "threads": args.threads, "work": str(model_dir), "training": training,
              "generation": {**GENERATION, "batch": args.batch, "source_tokens": args.seq,
                             "articles": f"1-{args.articles} of {CNNDM.name}"},
              "timing_minutes": round((time.perf_counter() - t0) / 60, 1),
              **report(contestants, order, tok, held),
              "load_average_1m_at_end": round(os.getloadavg()[0], 2)}
    print_table(result)
    write_result(result_path("summarize-precision-cpu", args.output), result)


if __name__ == "__main__":
    run_cli(main)
