#!/usr/bin/env bash
# The GPU measurements of benchmarks/RESULTS.md ("GPU"), for an H100/H200 machine image with
# Python 3.12, torch, torchvision, h5py, numpy, Pillow and pytest, and no network.
#
# Here, once:   bash benchmarks/gpu_suite.sh prepare
#   downloads lmdb, simplejpeg, pytest-timeout, ukui-wallpapers and DALI for CUDA 13 with its
#   libraries into the ignored folders .p1 ... .p5 (each under 64 MiB, the most one copy to the
#   GPU machine may take: DALI's 199 MB wheel travels as a tar cut in four).
# There, one run per part, back to back (the machine is released after 30 s idle, and with it
# /tmp): copy .pK over, then run the command `bash benchmarks/gpu_suite.sh K`.
#   1: tests marked gpu, TrainStep vs by hand (ResNet-50), photos, shards, bench ResNet-50
#   2: bench ResNet-18, host syncs, `fastdata train` (bf16, fp16 + accum, torchrun)
#   3: shards at 512 and their bench, gpu_fed.py (ResNet-18), `fastdata demo`
#   4: TrainStep vs by hand (ResNet-18, fp16), gpu_fed.py (ResNet-50), `train --compile`
#   fed (instead of 1, ~4 min): tests marked gpu, photos, raw shards, gpu_fed.py ResNet-18/50
#      (8 and 16 threads), bench torch ResNet-18/50
#   5: DALI installed: its tests, host syncs, bench torch vs dali (ResNet-50/18, 512 px,
#      no model),
#      `train --backend dali`
# The GPU table alone (every loader on one run per model, with its plot), six runs
# (`NOTESTS=1 bash benchmarks/gpu_suite.sh 7a` leaves out the tests, where time is short):
#   7a (carry .p1): tests marked gpu, photos, raw HDF5 / raw LMDB / JPEG HDF5 shards at 256;
#   7b, 7c, 7d (carry .p2, .p3, .p4): DALI's parts only; 7e (carry .p5): DALI installed, bench
#   baseline, torch and dali on the three sets, ResNet-50 (table, JSON, plot); 7f: the same
#   for ResNet-18.
# Figures land in $OUT. Without gpu_fed.py and the no-model row, the five parts held the
# machine 17 minutes (RESULTS.md, "GPU").
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s); T() { echo "== $(( $(date +%s) - t0 ))s $*"; }
FD="python3 -m fastdata.cli"
bench() { $FD -q bench "$@" --batch-size 256 --workers 16 --batches 30 2>&1 \
  | grep -v -E "nvjpeg2k|nvtiff|Failed to load|If using nvImageCodec"; }
train() { $FD train "$@" 2>&1 | grep -v '%|' | tail -12; }
setup() {     # parts 1 and fed: wheels, photos (in the background), tests marked gpu
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    /tmp/pay/lmdb*.whl /tmp/pay/simplejpeg*.whl /tmp/pay/zlib_ng*.whl /tmp/pay/pytest_timeout*.whl
  # fastdata runs from this tree, not installed: its C kernel built in place (CPU augmentation)
  python3 -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))' \
    | { read -r inc ext; cc -O3 -shared -fPIC -I"$inc" fastdata/_native.c -o "fastdata/_native$ext"; }
  $FD info --env
  (python3 benchmarks/make_photos.py /tmp/photos --deb /tmp/pay/ukui-wallpapers_*.deb \
    > /tmp/photos.log 2>&1) &
  [ -n "${NOTESTS:-}" ] && return   # NOTESTS=1: time is short (the table needs none)
  T tests; python3 -m pytest -q -m gpu tests -p no:cacheprovider -rs 2>&1 | tee "$OUT/tests_gpu.txt" | tail -20
}
case "${1:-}" in       # the carried folder of this part: its files go to /tmp/pay
  1|fed|7a) carried=.p1 ;; 2|7b) carried=.p2 ;; 3|7c) carried=.p3 ;; 4|7d) carried=.p4 ;;
  5|7e) carried=.p5 ;; *) carried= ;;
esac
[ -z "$carried" ] || { mkdir -p /tmp/pay && cp "$carried"/* /tmp/pay/; }
case "${1:-}" in 1|fed|7a|prepare) ;; *) [ -d /tmp/raw ] || echo "!! a fresh machine: run part 1 (or 7a) first" ;; esac
install_dali() {
  cat /tmp/pay/dali.part[0-3] > /tmp/dali.tar && md5sum /tmp/dali.tar && tar xf /tmp/dali.tar -C /tmp/pay
  (cd /tmp/pay && python3 -m pip install -q --no-index --no-deps --no-compile nvidia_dali*.whl \
    nvidia_libnvcomp*.whl nvidia_nvimgcodec*.whl nvidia_nvjpeg*.whl astunparse*.whl gast*.whl \
    libcst*.whl makefun*.whl nvtx*.whl optree*.whl)
}
table() {     # the GPU table for one model: every loader on the three sets, one run
  bench /tmp/raw /tmp/lmdb /tmp/jpg --source /tmp/photos --backends baseline,torch,dali \
    --model "resnet$1" --json "$OUT/table$1.json" --plot "$OUT/table$1.png" | tee "$OUT/table$1.txt"
}

case "${1:-}" in
prepare)
  set -e
  pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  mkdir -p .p1 .p2 .p3 .p4 .p5 /tmp/fd-gpu .git/info
  for p in .p1 .p2 .p3 .p4 .p5; do grep -qx "/$p/" .git/info/exclude 2>/dev/null || echo "/$p/" >> .git/info/exclude; done
  "${pip[@]}" -d .p1 lmdb simplejpeg zlib-ng pytest-timeout astunparse==1.6.3 gast==0.6.0 optree nvtx \
    makefun 'libcst~=1.8' 'nvidia-nvjpeg>=13.0,<13.1' 'nvidia-nvimgcodec-cu13>=0.9,<0.10'
  (cd .p1 && apt-get download ukui-wallpapers)
  "${pip[@]}" -d /tmp/fd-gpu nvidia-dali-cuda130==2.4.0 nvidia-libnvcomp-cu13==5.3.0.16
  (cd /tmp/fd-gpu && tar cf ../fd-gpu.tar ./*.whl && split -b 57M -d -a 1 ../fd-gpu.tar part)
  for i in 0 1 2 3; do mv /tmp/fd-gpu/part$i ".p$((i + 2))/dali.part$i"; done
  md5sum /tmp/fd-gpu.tar; du -sh .p? ;;
1)
  setup
  T step; python3 benchmarks/gpu_step.py 2>&1 | tee "$OUT/step50.txt"
  wait; T convert
  $FD -q convert /tmp/photos /tmp/raw --size 256
  $FD -q convert /tmp/photos /tmp/jpg --size 256 --encoding jpeg
  T bench50; bench /tmp/raw /tmp/jpg --source /tmp/photos --backends baseline,torch \
    --model resnet50 --json "$OUT/resnet50.json" | tee "$OUT/resnet50.txt" ;;
fed)
  setup
  wait; T convert
  $FD -q convert /tmp/photos /tmp/raw --size 256
  for m in 18 50; do T "fed resnet$m"; python3 benchmarks/gpu_fed.py /tmp/raw --model resnet$m \
    --threads 8,16 --procs "" $([ $m = 18 ] && echo --profile "$OUT/fed18.json") 2>&1 \
    | tee "$OUT/fed$m.txt"; done
  for m in 18 50; do T "bench resnet$m"; bench /tmp/raw --backends torch --model resnet$m \
    --json "$OUT/torch$m.json" | tee "$OUT/torch$m.txt"; done ;;
2)
  T bench18; bench /tmp/raw /tmp/jpg --source /tmp/photos --backends baseline,torch \
    --model resnet18 --json "$OUT/resnet18.json" | tee "$OUT/resnet18.txt"
  T sync; python3 benchmarks/gpu_sync.py /tmp/raw torch 2>&1 | tee "$OUT/sync.txt"
  T train; train /tmp/raw --val /tmp/jpg --model resnet18 --epochs 3 --batch-size 128 \
    --crop 224 --checkpoint /tmp/ck --log-every 10
  T fp16; train /tmp/raw --model resnet18 --epochs 1 --batch-size 64 --accum 2 \
    --precision fp16 --crop 224 --checkpoint /tmp/ck16
  T ddp; torchrun --nproc-per-node 1 -m fastdata.cli train /tmp/raw --val /tmp/jpg \
    --model resnet18 --epochs 1 --batch-size 128 --accum 2 --crop 224 2>&1 | grep -v '%|' | tail -4 ;;
3)
  T convert512; $FD -q convert /tmp/photos /tmp/raw512 --size 512
  T bench512; bench /tmp/raw512 --backends torch --model resnet50 --crop 224 \
    --json "$OUT/r50_512.json" | tee "$OUT/r50_512.txt"
  T fed; python3 benchmarks/gpu_fed.py /tmp/raw --model resnet18 --profile "$OUT/fed18.json" 2>&1 | tee "$OUT/fed18.txt"
  T demo; timeout 280 $FD demo --dir /tmp/demo 2>&1 | grep -v '%|' | tail -12 ;;
4)
  T step18; python3 benchmarks/gpu_step.py --model resnet18 2>&1 | tee "$OUT/step18.txt"
  T step50fp16; python3 benchmarks/gpu_step.py --precision fp16 2>&1 | tee "$OUT/step50fp16.txt"
  T fed; python3 benchmarks/gpu_fed.py /tmp/raw --model resnet50 2>&1 | tee "$OUT/fed50.txt"
  T compile; timeout 240 $FD train /tmp/raw --model resnet50 --epochs 2 --batch-size 256 \
    --crop 224 --compile --log-every 5 2>&1 | grep -v '%|' | tail -6 ;;
5)
  install_dali
  T dalitests; python3 -m pytest -q tests/test_dali.py -p no:cacheprovider -rs 2>&1 | tee "$OUT/tests_dali.txt" | tail -5
  T dalisync; python3 benchmarks/gpu_sync.py /tmp/raw dali 2>&1 | grep -v -i -E "nvjpeg2k|nvtiff" | tee "$OUT/sync_dali.txt"
  for m in 50 18; do T "benchdali resnet$m"; bench /tmp/raw /tmp/jpg --backends torch,dali \
    --model resnet$m --json "$OUT/dali$m.json" | tee "$OUT/dali$m.txt"; done
  T dali512; bench /tmp/raw512 --backends torch,dali --model resnet50 --crop 224 \
    --json "$OUT/dali512.json" | tee "$OUT/dali512.txt"
  T none; bench /tmp/raw /tmp/jpg --source /tmp/photos --backends baseline,torch,dali \
    --model none --json "$OUT/none.json" | tee "$OUT/none.txt"
  T traindali; train /tmp/jpg --backend dali --val /tmp/raw --model resnet18 --epochs 2 \
    --batch-size 128 --crop 224 ;;
7a)
  setup
  wait; T convert
  $FD -q convert /tmp/photos /tmp/raw --size 256
  $FD -q convert /tmp/photos /tmp/lmdb --size 256 --format lmdb
  $FD -q convert /tmp/photos /tmp/jpg --size 256 --encoding jpeg ;;
7b|7c|7d) ls -l /tmp/pay/dali.part* ;;
7e) install_dali; T table50; table 50 ;;
7f) T table18; table 18 ;;
*) echo "usage: $0 prepare|1|fed|2|3|4|5|7a|7b|7c|7d|7e|7f" >&2; exit 2 ;;
esac
T done
