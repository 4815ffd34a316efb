#!/usr/bin/env bash
# The GPU table of docs/performance.md on any CUDA machine: every shard kind (raw HDF5, raw LMDB,
# JPEG HDF5) through both backends (torch, DALI) feeding ResNet-18 and ResNet-50 (bf16,
# channels_last, batch 256), each row against the model's ceiling; the same rows with the
# whole bench confined to 4 host cores; ResNet-18 at 128 px (stored 128, and stored 256 cropped
# to 128); ResNet-50 from sets stored at 512 cropped to 224; the larger model fed with the
# batched TrivialAugment as its batch_transform (benchmarks/gpu/gpu_fed.py); then the tests marked
# gpu. With COMPILE set (a torch.compile backend, e.g. inductor), every bench row again with
# the model compiled, its ceiling too (files named *-compiled), and no tests.
#
#   bash benchmarks/gpu/gpu_table.sh prepare     # once: photos and the three shard sets (minutes)
#   bash benchmarks/gpu/gpu_table.sh run         # the table: one run, under 10 minutes on an H100
#   COMPILE=inductor bash benchmarks/gpu/gpu_table.sh run     # the compiled table, a run of its own
#
# Needs: this repository installed with its `dali` extra in the running Python, a CUDA build of
# torch and a torchvision built for it (the models, and nvJPEG decoding on the torch backend).
# DATA (default /tmp/fastdata-gpu) holds the photos and sets; OUT (default ./gpu-table) gets
# each run's table (.txt), figures (.json: what benchmarks/results/ keeps) and plot (.png).
# PHOTOS_DEB: a local copy of Debian's ukui-wallpapers package, for a machine without apt-get
# (see benchmarks/inputs/make_photos.py).
# For a smoke run without a GPU: DEVICE=cpu MODELS="resnet8 resnet14" BATCH=16 BATCHES=2 CORES=0-1.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-/tmp/fastdata-gpu}
OUT=${OUT:-gpu-table}
DEVICE=${DEVICE:-cuda}
read -r -a MODELS <<< "${MODELS:-resnet18 resnet50}"
BATCH=${BATCH:-256}
BATCHES=${BATCHES:-20}
CORES=${CORES:-0-3}
COMPILE=${COMPILE:-}
PY=${PYTHON:-python3}
FD=("$PY" -m fastdata.cli)

prepare() {
  mkdir -p "$DATA"
  [ -d "$DATA/photos" ] || "$PY" -m benchmarks.inputs.make_photos "$DATA/photos" ${PHOTOS_DEB:+--deb "$PHOTOS_DEB"}
  for kind in raw:hdf5 raw:lmdb jpeg:hdf5; do
    enc=${kind%%:*} fmt=${kind##*:}
    "${FD[@]}" -q convert "$DATA/photos" "$DATA/$enc-$fmt" --container "$fmt" --encoding "$enc" \
      --size 128,256,512 --resume
  done
  "${FD[@]}" info --env
}

# one bench run: the three sets, both backends; extra arguments name the model, sizes, cores
bench() {
  local name=$1${COMPILE:+-compiled}
  shift
  [ -z "$COMPILE" ] || set -- "$@" --compile "$COMPILE"
  echo "== $name: $*"
  "${FD[@]}" -q bench "$DATA/raw-hdf5" "$DATA/raw-lmdb" "$DATA/jpeg-hdf5" --backends torch,dali \
    --batch-size "$BATCH" --batches "$BATCHES" --repeat 2 --device "$DEVICE" \
    --json "$OUT/$name.json" --plot "$OUT/$name.png" "$@" | tee "$OUT/$name.txt"
}

run() {
  mkdir -p "$OUT"
  local t0 small=${MODELS[0]} large=${MODELS[1]:-${MODELS[0]}}
  t0=$(date +%s)
  { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
      --format=csv,noheader; lscpu | grep -E "^Model name|^CPU\(s\)"; git rev-parse HEAD
    "${FD[@]}" info --env; } > "$OUT/machine.txt" 2>&1 || true
  for model in "${MODELS[@]}"; do
    bench "$model-224" --model "$model" --size 256 --crop 224
    bench "$model-224-4cores" --model "$model" --size 256 --crop 224 --cpus "$CORES" --workers 3
  done
  bench "$small-128-stored128" --model "$small" --size 128 --crop 128
  bench "$small-128-stored256" --model "$small" --size 256 --crop 128
  bench "$large-224-stored512" --model "$large" --size 512 --crop 224
  if [ -z "$COMPILE" ]; then
    echo "== $large-224-trivial: batched TrivialAugment as the batch_transform"
    "$PY" -W ignore -m benchmarks.gpu.gpu_fed "$DATA/raw-hdf5" --model "$large" --size 256 \
      --batch "$BATCH" --threads 16 --procs "" --recipes trivial --steps "$BATCHES" \
      --device "$DEVICE" | tee "$OUT/$large-224-trivial.txt"
  fi
  echo "== the table took $(( $(date +%s) - t0 )) s"
  if [ "$DEVICE" = cuda ] && [ -z "$COMPILE" ]; then
    "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rs 2>&1 | tee "$OUT/tests_gpu.txt" | tail -15
  fi
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash benchmarks/gpu/gpu_table.sh prepare|run (see its header)" >&2; exit 2 ;;
esac
