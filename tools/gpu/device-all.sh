#!/usr/bin/env bash
# device-all.sh IN OUT [PARTS] — everything to check on a GPU machine (the CUDA toolkit and
# PyTorch, no MPI or HDF5 needed) in one command, each part under its own time limit so that a hang costs that part only:
#   train    tools/gpu/device-train.sh: the trainer on the GPU against its CPU backend
#   kernels  tools/gpu/device-test.sh bench: kernel tests and bench/cuda_kernels
#   torch    bench/torch_gpu_llama.py: PyTorch's throughput for llama1b, the reference
#            (eager, then torch.compile)
#   profile  llama1b (4 steps; again with TSR_CUDA_ATTENTION=mma, =cudnn) and the tiny deck (20
#            steps) with TSR_CUDA_PROFILE=1: time per op (cuda/ops_dev.c)
#   sanitize only device-train.sh's compute-sanitizer checks (d), into train.log
#   ksanitize compute-sanitizer over the kernel tests (device-test.sh sanitize: memcheck
#            over all, racecheck over attention), into ksanitize.log
# PARTS: a comma-separated subset, default all four in that order.
# IN holds bundle.tar.xz (tools/device-bundle.sh's folder, packed with tar cJf) and
# data/ (token shards, e.g. tests/corpus-fortunes' train_000.bin and valid_000.bin); copy
# ext/ over as well (tools/fetch-cudnn-frontend.sh) for cuDNN attention in the kernel tests.  Logs
# go to OUT: gpu.txt, train.log, train.tgz (every run's
# output and metrics), kernels.log, torch.log, profile.log.  Part limits: TRAIN_S,
# KERNELS_S, TORCH_S (eager), TORCH_COMPILE_S, PROFILE_S, KSANITIZE_S.
set -u
C=$(cd "${1:?usage: device-all.sh IN OUT [PARTS]}" && pwd)
OUT=${2:?usage: device-all.sh IN OUT [PARTS]}
PARTS=,${3:-train,kernels,torch,profile},
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm --format=csv
  nvcc --version | tail -2
  command -v compute-sanitizer || echo "no compute-sanitizer"
} >"$OUT/gpu.txt" 2>&1
# NCCL, cuBLAS, cuDNN and NVRTC of the machine: in CUDA_HOME or in Python wheels
TSR_EXTRA_LIBS=$(find /usr/local /opt /usr/lib -xdev \( -name libnccl.so.2 -o -name \
  libcublasLt.so.13 -o -name libcudnn.so.9 -o -name libnvrtc.so.13 \) 2>/dev/null |
  xargs -r -n1 dirname | sort -u | paste -sd:)
export TSR_EXTRA_LIBS
echo "extra library folders: $TSR_EXTRA_LIBS" >>"$OUT/gpu.txt"

if [[ $PARTS == *,train,* || $PARTS == *,profile,* || $PARTS == *,sanitize,* ]]; then
  rm -rf /tmp/tsr-bundle /tmp/tsr-work && mkdir -p /tmp/tsr-bundle /tmp/tsr-work
  tar xJf "$C/bundle.tar.xz" -C /tmp/tsr-bundle --strip-components=1
fi
if [[ $PARTS == *,train,* ]]; then
  TMPDIR=/tmp/tsr-work timeout "${TRAIN_S:-330}" bash tools/gpu/device-train.sh /tmp/tsr-bundle \
    "$C/data" >"$OUT/train.log" 2>&1
  echo "device-train exit $?" >>"$OUT/train.log"
  (cd /tmp/tsr-work && find . \( -name '*.out' -o -name metrics.jsonl \) -print0 |
    tar czf "$OUT/train.tgz" --null -T -)
fi
if [[ $PARTS == *,sanitize,* && $PARTS != *,train,* ]]; then
  TMPDIR=/tmp/tsr-work DEVICE_TRAIN_ONLY=d timeout "${TRAIN_S:-330}" bash \
    tools/gpu/device-train.sh /tmp/tsr-bundle "$C/data" >"$OUT/train.log" 2>&1
  echo "device-train (sanitize) exit $?" >>"$OUT/train.log"
fi
if [[ $PARTS == *,kernels,* ]]; then
  # (cuDNN compiles its runtime attention engines with NVRTC at the first call of each
  # test shape: time not measured yet, hence the longer default)
  timeout "${KERNELS_S:-300}" bash tools/gpu/device-test.sh bench >"$OUT/kernels.log" 2>&1
  echo "device-test exit $?" >>"$OUT/kernels.log"
fi
if [[ $PARTS == *,ksanitize,* ]]; then
  timeout "${KSANITIZE_S:-400}" bash tools/gpu/device-test.sh sanitize >"$OUT/ksanitize.log" 2>&1
  echo "device-test sanitize exit $?" >>"$OUT/ksanitize.log"
fi
if [[ $PARTS == *,torch,* ]]; then
  PYTHONUNBUFFERED=1 timeout "${TORCH_S:-90}" python3 bench/torch_gpu_llama.py 10 3 \
    >"$OUT/torch.log" 2>&1
  echo "torch exit $?" >>"$OUT/torch.log"
  # the issue's reference is torch.compile: compilation takes the first steps' time
  PYTHONUNBUFFERED=1 timeout "${TORCH_COMPILE_S:-240}" python3 bench/torch_gpu_llama.py 10 5 \
    --compile >>"$OUT/torch.log" 2>&1
  echo "torch --compile exit $?" >>"$OUT/torch.log"
fi
if [[ $PARTS == *,profile,* ]]; then
  P=(/tmp/tsr-bundle/run.sh tessera "data.train=$C/data/train_*.bin" "data.valid=$C/data/valid_*.bin"
    checkpoint.every_steps=0 checkpoint.resume=none run.eval_every=0 run.device=cuda)
  (
    export TSR_CUDA_PROFILE=1
    for a in wmma mma cudnn; do
      TSR_CUDA_ATTENTION=$a timeout "${PROFILE_S:-120}" "${P[@]::2}" input/llama1b.nml \
        "${P[@]:2}" run.max_steps=4 run.log_every=1 parallel.tp=1 parallel.pp=1 \
        parallel.zero_stage=0 train.micro_batch=1 train.global_batch=1 train.precision=bf16 \
        run.out_dir=/tmp/tsr-work/prof-llama1b-$a
    done
    timeout 60 "${P[@]::2}" input/tiny.nml "${P[@]:2}" run.max_steps=20 train.precision=bf16 \
      run.out_dir=/tmp/tsr-work/prof-tiny
  ) >"$OUT/profile.log" 2>&1
fi
for f in "$OUT"/*.log; do echo "== $f"; tail -25 "$f"; done
