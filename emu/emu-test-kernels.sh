#!/usr/bin/env bash
# emu-test-kernels.sh DIR — tests/cuda/test_kernels (and, where mpicc is, test_device)
# linked with the CUDA kernels on the CPU emulation of emu/, into DIR: what
# tests/cuda/emulate.sh runs, and what tools/gpu/bundle.sh --emu packs for the device
# plan's rehearsal.  The CPU reference is the CPU kernels (src/cpu*.c) with OpenBLAS.
# Needs only gcc, g++ and python3 (no CUDA toolkit).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
emu=$top/emu
B=${1:?usage: emu-test-kernels.sh DIR}
mkdir -p "$B"
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
for f in cuda/context.c cuda/backend.c emu/sdpa_fake.c tests/cuda/test_kernels.c \
  tests/cuda/kernels_util.c tests/cuda/test_kernels_attention.c; do
  o=$B/host_$(basename "$f" .c).o
  gcc "${CFLAGS[@]}" -c "$top/$f" -o "$o"
  HOST_OBJS+=("$o")
done
wait "$kernels"
DEV_OBJS=("${EMU_OBJS[@]/#/$B/}" "$B/host_dev.o" "$B/host_ops_dev.o" "$B/host_sdpa_fake.o")
g++ -fopenmp -rdynamic -o "$B/test_kernels" "$B/host_test_kernels.o" "$B/host_kernels_util.o" \
  "$B/host_test_kernels_attention.o" \
  "${DEV_OBJS[@]}" "${CPU_OBJS[@]}" "${BLAS_LIB[@]}" -lm
# device selection (cuda/select.c) over MPI ranks on emulated GPUs
if command -v mpicc > /dev/null; then
  mpicc "${CFLAGS[@]}" -c "$top/cuda/select.c" -o "$B/device.o"
  mpicc "${CFLAGS[@]}" -c "$top/tests/cuda/test_device.c" -o "$B/test_device.o"
  mpicc -fopenmp -o "$B/test_device" "$B/test_device.o" "$B/device.o" "${DEV_OBJS[@]}" \
    "${CPU_OBJS[@]}" "${BLAS_LIB[@]}" -lstdc++ -lm
fi
