#!/usr/bin/env bash
# emulate.sh — tests/cuda/test_kernels with the CUDA kernels executed on the CPU, for
# machines without a GPU (no CUDA toolkit needed either).
#
# emu/ stands in for the CUDA runtime, cuBLASLt, CUB, the bf16 and fp16 types
# and the tensor-core instructions: every CUDA thread is a fiber, __syncthreads and warp
# shuffles are real barriers (threads waiting at different barriers abort as a deadlock),
# cuBLASLt is a naive loop with the documented semantics, and cuDNN's attention a host
# loop (emu/sdpa_fake.c).  The device backend (cuda/ops_dev.c) runs as in the trainer: its
# table, reserve, scratch, failure flag and attention choice.  It checks the kernels'
# indexing, tiling, causal masks, online softmax, reductions, storage conversions and
# barrier placement against the CPU kernels (src/cpu*.c) in fp32, bf16 and fp16.  It says
# nothing about speed, coalescing, shared-memory limits, races between blocks, FMA
# contraction, or the real cuBLASLt and cuDNN (whose epilogues and graphs only a GPU run
# checks).  Then tests/cuda/test_device checks the device selection of cuda/device.c on 2
# MPI ranks with 0, 1, 2 and 4 emulated GPUs.  A few minutes on 2 cores.
#
#   tests/cuda/emulate.sh                 (TSR_TEST_ONLY=attention,xent  TSR_TEST_SEED=N)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
emu=$top/emu
B=$(mktemp -d "${TMPDIR:-/tmp}/tsr-cuda-emu.XXXXXX")
trap 'rm -rf "$B"' EXIT
CFLAGS=(-std=gnu11 -O2 -g -fopenmp -Wall -I"$emu/include" -I"$top/src" -I"$top/cuda" -I"$top/tests"
  -DTSR_HAVE_CUDNN)
. "$emu/kernels.sh"
emu_kernels "$B" & kernels=$!
BLAS_INC=() BLAS_LIB=(-lopenblas)
if pkg-config --exists openblas 2>/dev/null; then
  read -r -a BLAS_INC <<< "$(pkg-config --cflags openblas)"
  read -r -a BLAS_LIB <<< "$(pkg-config --libs openblas)"
fi
# the CPU kernels (the reference), the backend, the cuDNN stand-in and the test
CPU_OBJS=()
for f in "$top"/src/cpu*.c "$top/src/ops.c" "$top/src/util.c"; do
  o=$B/host_$(basename "$f" .c).o
  gcc "${CFLAGS[@]}" "${BLAS_INC[@]}" -c "$f" -o "$o"
  CPU_OBJS+=("$o")
done
HOST_OBJS=()
for f in cuda/dev.c cuda/ops_dev.c emu/sdpa_fake.c tests/cuda/test_kernels.c \
  tests/cuda/kernels_util.c tests/cuda/test_kernels_attention.c; do
  o=$B/host_$(basename "$f" .c).o
  gcc "${CFLAGS[@]}" -c "$top/$f" -o "$o"
  HOST_OBJS+=("$o")
done
wait "$kernels"
DEV_OBJS=("${EMU_OBJS[@]/#/$B/}" "$B/host_dev.o" "$B/host_ops_dev.o" "$B/host_sdpa_fake.o")
g++ -fopenmp -o "$B/test_kernels" "$B/host_test_kernels.o" "$B/host_kernels_util.o" \
  "$B/host_test_kernels_attention.o" \
  "${DEV_OBJS[@]}" "${CPU_OBJS[@]}" "${BLAS_LIB[@]}" -lm
rc=0
"$B/test_kernels" || rc=$?
# as on an sm_86/89 part (99 KB of shared memory per block): head_dim 96 and 128 get no
# tensor-core kernel, the others still pass
if [ -z "${TSR_TEST_ONLY:-}" ]; then
  echo "--- attention again with 101376 bytes of shared memory per block (sm_86/89)"
  EMU_SMEM_OPTIN=101376 TSR_TEST_ONLY=attention "$B/test_kernels" || rc=$?
fi

# device selection (cuda/device.c) over 2 MPI ranks on emulated GPUs
if command -v mpicc > /dev/null && [ -z "${TSR_TEST_ONLY:-}" ]; then
  mpicc "${CFLAGS[@]}" -c "$top/cuda/device.c" -o "$B/device.o"
  mpicc "${CFLAGS[@]}" -c "$top/tests/cuda/test_device.c" -o "$B/test_device.o"
  mpicc -fopenmp -o "$B/test_device" "$B/test_device.o" "$B/device.o" "${DEV_OBJS[@]}" \
    "${CPU_OBJS[@]}" "${BLAS_LIB[@]}" -lstdc++ -lm
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  ${MPIRUN:-mpirun} -np 2 "$B/test_device" || rc=$?
fi
exit $rc
