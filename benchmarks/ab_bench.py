"""Before/after speed of the core paths: the same workloads timed on two source trees of
bertforge, side by side, in alternating fresh processes (these machines are noisy, so only
ratios from the same invocation are quoted).

Made for refactors that must keep every measured speed (issue 39: the model files lost their
speed code, which ``bertforge.speed`` now applies from outside). Each workload builds its model
through the public API and applies the tree's speed options the way its runs do
(``bertforge.speed.apply_speed_options``, or ``bertforge.train.parallelize`` in trees before it):

* ``pretrain``: BERT-mini-shaped pretraining steps (MLM at the masked positions + NSP, dropout
  0.1, unpadded, AdamW), 32 sequences of 20-128 tokens;
* ``finetune``: a MiniLM-L6-shaped classifier's training steps (dropout on), 32 pairs of 40-128;
* ``evaluate``: the same classifier and a QA model evaluated (no grad, unpadded, fp32);
* ``bart``: a 2+2-layer BART's denoising training steps (dropout on), 16 pairs;
* ``modernbert``: a 4-layer ModernBERT's MLM training steps (dropout on), 16 rows of 40-256.

usage: python benchmarks/ab_bench.py --before /path/to/old/tree [--after .] [--rounds 5]
       [--threads 1] [--out benchmarks/results/ab-....json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _common import cpu_model, git_commit


SETUP = r'''
import time, torch
torch.manual_seed(0)
torch.set_num_threads(THREADS)
try:
    from bertforge.speed import apply_speed_options
except ImportError:
    from bertforge.train.parallelize import apply_speed_options
import bertforge.models as M

def lengths(n, lo, hi):
    g = torch.Generator().manual_seed(1)
    return torch.randint(lo, hi + 1, (n,), generator=g)

def rows(n, lo, hi, vocab):
    lens = lengths(n, lo, hi)
    mask = (torch.arange(int(lens.max()))[None] < lens[:, None]).long()
    return torch.randint(5, vocab, mask.shape) * mask, mask

def timed(step, warm, steps):
    for _ in range(warm):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps

def training_steps(model, loss, warm, steps):
    """Seconds per AdamW training step of ``loss()`` (dropout on: train mode)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    return timed(step, warm, steps)
'''

WORKLOADS = {
    "pretrain": r'''
from bertforge.tasks.mlm import pretraining_loss
model = M.BertForPreTraining(M.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4,
    num_attention_heads=4, intermediate_size=1024, max_position_embeddings=512))
apply_speed_options(model, unpad=True)
ids, mask = rows(32, 20, 128, 30522)
labels = torch.full_like(ids, -100)
pick = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.15) & mask.bool()
labels[pick] = ids[pick]
batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
         "mlm_labels": labels, "nsp_labels": torch.randint(0, 2, (32,))}
print(training_steps(model, lambda: pretraining_loss(model, batch).loss, 2, 6))
''',
    "finetune": r'''
model = M.BertForSequenceClassification(M.BertConfig(vocab_size=30522, hidden_size=384,
    num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536), num_labels=2)
apply_speed_options(model, unpad=True)
ids, mask = rows(32, 40, 128, 30522)
y = torch.randint(0, 2, (32,))
print(training_steps(
    model, lambda: torch.nn.functional.cross_entropy(model(ids, mask).logits, y), 2, 5))
''',
    "evaluate": r'''
config = M.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
    num_attention_heads=12, intermediate_size=1536)
models = [M.BertForSequenceClassification(config, num_labels=2), M.BertForQuestionAnswering(config)]
for m in models:
    apply_speed_options(m, unpad=True)
    m.eval()
ids, mask = rows(64, 60, 384, 30522)
def step():
    with torch.no_grad():
        for m in models:
            m(ids, mask)
print(timed(step, 1, 4))
''',
    "bart": r'''
from bertforge.tasks.denoise import seq2seq_loss
model = M.BartForConditionalGeneration(M.BartConfig(vocab_size=8000, d_model=256,
    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=512))
apply_speed_options(model, unpad=True)
src, src_mask = rows(16, 40, 256, 8000)
tgt, tgt_mask = rows(16, 30, 200, 8000)
labels = tgt.masked_fill(tgt_mask == 0, -100)
batch = {"input_ids": src, "attention_mask": src_mask, "labels": labels,
         "decoder_input_ids": torch.roll(tgt, 1, 1), "decoder_attention_mask": tgt_mask}
print(training_steps(model, lambda: seq2seq_loss(model, batch).loss, 2, 6))
''',
    "modernbert": r'''
from bertforge.tasks.mlm import pretraining_loss
model = M.ModernBertForMaskedLM(M.ModernBertConfig(vocab_size=8000, hidden_size=256,
    num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
    max_position_embeddings=512, local_attention=64, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, cls_token_id=1, sep_token_id=2, embedding_dropout=0.1, mlp_dropout=0.1,
    attention_dropout=0.1))
apply_speed_options(model, unpad=True)
ids, mask = rows(16, 40, 256, 8000)
labels = torch.full_like(ids, -100)
pick = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.3) & mask.bool()
labels[pick] = ids[pick]
batch = {"input_ids": ids, "attention_mask": mask, "mlm_labels": labels,
         "nsp_labels": torch.full((16,), -100)}
print(training_steps(model, lambda: pretraining_loss(model, batch).loss, 2, 6))
''',
}


def run_once(tree: Path, workload: str, threads: int) -> float:
    """Seconds per step of ``workload`` in a fresh process importing bertforge from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads)}
    code = SETUP.replace("THREADS", str(threads)) + WORKLOADS[workload]
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"{workload} on {tree} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the reference source tree")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    times: dict[str, dict[str, list[float]]] = {w: {"before": [], "after": []} for w in args.workloads}
    for r in range(args.rounds):
        for workload in args.workloads:
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:  # alternate who goes first: drift hits both sides alike
                times[workload][side].append(run_once(trees[side], workload, args.threads))
    summary = {}
    for workload, t in times.items():
        ratios = [b / a for b, a in zip(t["before"], t["after"])]
        summary[workload] = {
            "before_s_per_step_median": statistics.median(t["before"]),
            "after_s_per_step_median": statistics.median(t["after"]),
            "speed_after_over_before_median_of_rounds": statistics.median(ratios),
            "per_round_ratios": ratios}
        print(f"{workload:11s} before {summary[workload]['before_s_per_step_median']*1e3:8.1f} ms"
              f"  after {summary[workload]['after_s_per_step_median']*1e3:8.1f} ms  "
              f"after speed / before {statistics.median(ratios):.3f}x  "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratios)})")
    if args.out:
        result = {"benchmark": "ab_bench", "machine": cpu_model(),
                  "cpu_count": os.cpu_count(), "threads": args.threads, "rounds": args.rounds,
                  "before": {"tree": str(trees["before"]), "commit": git_commit(trees["before"])},
                  "after": {"tree": str(trees["after"]), "commit": git_commit(trees["after"])},
                  "times_s": times, "summary": summary}
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
