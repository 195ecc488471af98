#!/usr/bin/env bash
# Wheels for the GPU machine: every runtime dependency of bertforge (pyproject.toml) that its
# image lacks, for CPython 3.12 on manylinux x86_64, downloaded into .whl/ at the repository root.
#
#   bash benchmarks/gpu_wheels.sh          # here, with internet access to PyPI
#
# .whl/ is ignored by git (.gitignore and .git/info/exclude) and travels to the GPU machine as a
# carried path; benchmarks/gpu_check.sh installs from it the wheels that machine lacks (or has
# older than a shipped package needs) with `pip install --no-index --no-deps --target`.
#
# The GPU image (Python 3.12, torch 2.11 + CUDA, transformers 5.17, onnx, onnxruntime, tokenizers,
# safetensors, numpy, h5py, matplotlib, tensorboard, tqdm, prometheus-client, httpx, psutil,
# pytest, accelerate, anyio, click, h11, absl-py) lacks omegaconf, blingfire, mwparserfromhell,
# rouge-score (+ nltk), fastapi and uvicorn with their dependencies. The versions below are the
# ones this repository's tests pass with (the development .venv), so they fit each other and
# pydantic >= 2.
#
# Two packages are not a plain download:
# - rouge-score 0.1.2 exists on PyPI only as a source archive: its (pure Python) wheel is built
#   here with `pip wheel`.
# - blingfire's wheel is 42 MB: 36 tokenizer models and Windows/macOS libraries, none of which
#   bertforge uses. bertforge calls only `blingfire.text_to_sentences` (sentence splitting of
#   paragraph input, the sample corpus and ROUGE-Lsum), which needs just the Linux library
#   (1.5 MB). It cannot be left out: bertforge.data.segment imports it at module level and
#   `bertforge vocab` / `prepare` import that module for every input format. So the wheel is
#   rewritten without the unused files (same name and version, RECORD regenerated, a note in
#   its METADATA): `benchmarks/gpu_check.py slim-wheel`.
#
# Also written: .whl/COMMIT, this checkout's commit (`-dirty` with uncommitted changes), which
# gpu_check.sh records when the copied tree has no .git; and .whl/data/, MRPC's train.tsv and
# the SQuAD dev part of ../shared/data, which the fine-tuning epoch benchmarks read.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}
DEST=.whl

# name==version, one per line: what the image lacks, then the small pure-Python (or tiny)
# dependencies whose copy on the image may be missing or older than these packages need.
PINS=(
  omegaconf==2.4.0            # config (needs PyYAML: the image has it via transformers)
  blingfire==0.1.8            # sentence splitting (slimmed below)
  mwparserfromhell==0.7.2     # Wikipedia markup
  nltk==3.10.4                # rouge-score's tokenizer
  fastapi==0.165.0            # bertforge serve
  starlette==1.10.0
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  annotated-doc==0.0.7
  typing-inspection==0.4.5
  opentelemetry-api==1.45.2   # a hard requirement of this fastapi
  uvicorn==0.54.0
  typing-extensions==4.16.0   # pydantic 2.14 needs >= 4.16
  anyio==4.16.0               # starlette/fastapi; the image's may be older
  defusedxml==0.7.1           # nltk
  joblib==1.6.0               # nltk
  regex==2026.11.19           # nltk
  six==1.17.0                 # rouge-score
  pyyaml==6.0.4               # omegaconf (only installed if the image has none)
)
BUILT=(rouge-score==0.1.2)   # source-only on PyPI: built into a py3-none-any wheel here

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bf-wheels.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
shopt -s nocaseglob nullglob
have_wheel() {  # PIN: a wheel of that distribution is in $TMP
  local name=${1%%==*} found
  found=("$TMP/${name//-/_}"-*.whl)
  ((${#found[@]})) || { echo "error: no wheel for $1" >&2; exit 1; }
}

for pin in "${PINS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux1_x86_64 -d "$TMP" "$pin" 2>&1 | grep -v "is ignored: it is neither" || true
  have_wheel "$pin"
done
for pin in "${BUILT[@]}"; do
  "$PY" -m pip wheel -q --no-deps --no-binary "${pin%%==*}" -w "$TMP" "$pin" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  have_wheel "$pin"
done
for whl in "$TMP"/*.whl; do
  case "$whl" in *-none-any.whl|*cp312*manylinux*x86_64*.whl) ;;
    *) echo "error: $(basename "$whl") is not for CPython 3.12 manylinux x86_64" >&2; exit 1 ;;
  esac
done
"$PY" benchmarks/gpu_check.py slim-wheel "$TMP"/blingfire-0.1.8-py3-none-any.whl \
  --keep blingfire/__init__.py blingfire/libblingfiretokdll.so

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
mv "$TMP"/*.whl "$DEST"/
commit=unknown
if git rev-parse HEAD >/dev/null 2>&1; then
  commit=$(git rev-parse HEAD)
  [ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit-dirty"
fi
echo "$commit" >"$DEST/COMMIT"

# The shared data the fine-tuning epoch entries read (4 MB), for the GPU machine, which sees
# nothing outside the repository: gpu_check.sh points BERTFORGE_BENCH_DATA at this copy.
SHARED_DATA=${BERTFORGE_BENCH_DATA:-$REPO/../shared/data}
rm -rf "$DEST/data"
for part in glue/MRPC/train.tsv squad/dev-v1.1-part-a.json; do
  if [ -f "$SHARED_DATA/$part" ]; then
    mkdir -p "$DEST/data/$(dirname "$part")"
    cp "$SHARED_DATA/$part" "$DEST/data/$part"
  else
    echo "note: $SHARED_DATA/$part not found: the GPU suite's fine-tuning epochs will fail" >&2
  fi
done

exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
if [ -n "$exclude" ]; then
  mkdir -p "$(dirname "$exclude")"
  touch "$exclude"
  grep -qxF "/.whl/" "$exclude" || echo "/.whl/" >>"$exclude"
fi

ls -l "$DEST"
bytes=$(du -sb "$DEST" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
wheels=("$DEST"/*.whl)
echo "total: ${#wheels[@]} wheels, $bytes bytes (~$mib MiB) in $DEST/"
if (( bytes > 40 * 1048576 )); then
  echo "error: $DEST/ is over 40 MiB; the carried tree is limited to 64 MiB" >&2
  exit 1
fi
echo "on the GPU machine, with .whl carried: bash benchmarks/gpu_check.sh --out \"\$OUT\""
