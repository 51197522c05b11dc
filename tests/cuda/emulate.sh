#!/usr/bin/env bash
# emulate.sh — tests/cuda/test_kernels with the CUDA kernels executed on the CPU, for
# machines without a GPU (no CUDA toolkit needed either).
#
# tests/cuda/emu/ stands in for the CUDA runtime, cuBLASLt and CUB: every CUDA thread is
# a fiber, __syncthreads and warp shuffles are real barriers (threads waiting at
# different barriers abort as a deadlock), cuBLASLt is a naive loop with the documented
# semantics.  It checks the kernels' indexing, tiling, causal masks, online softmax,
# reductions and barrier placement against ops_cpu.c.  It says nothing about speed,
# coalescing, shared-memory limits, races between blocks, FMA contraction, or the real
# cuBLASLt (whose GELU epilogue only a GPU run checks).  Then tests/cuda/test_device
# checks the device selection of cuda/device.c on 2 MPI ranks with 0, 1, 2 and 4
# emulated GPUs.  About 2 minutes on 2 cores.
#
#   tests/cuda/emulate.sh                 (TSR_TEST_ONLY=attention,xent  TSR_TEST_SEED=N)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
emu=$top/tests/cuda/emu
B=$(mktemp -d "${TMPDIR:-/tmp}/tsr-cuda-emu.XXXXXX")
trap 'rm -rf "$B"' EXIT
CFLAGS=(-std=gnu11 -O2 -g -fopenmp -Wall -I"$emu/include" -I"$top/src" -I"$top/cuda" -I"$top/tests")
. "$emu/kernels.sh"
emu_kernels "$B" & kernels=$!
BLAS_INC=() BLAS_LIB=(-lopenblas)
if pkg-config --exists openblas 2>/dev/null; then
  read -r -a BLAS_INC <<< "$(pkg-config --cflags openblas)"
  read -r -a BLAS_LIB <<< "$(pkg-config --libs openblas)"
fi
gcc "${CFLAGS[@]}" "${BLAS_INC[@]}" -c "$top/src/ops_cpu.c" -o "$B/ops_cpu.o"
gcc "${CFLAGS[@]}" -c "$top/src/util.c" -o "$B/util.o"
gcc "${CFLAGS[@]}" -c "$top/tests/cuda/test_kernels.c" -o "$B/test_kernels.o"
wait "$kernels"
g++ -fopenmp -o "$B/test_kernels" "$B/test_kernels.o" "${EMU_OBJS[@]/#/$B/}" "$B/ops_cpu.o" \
  "$B/util.o" "${BLAS_LIB[@]}" -lm
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
  mpicc -o "$B/test_device" "$B/test_device.o" "$B/device.o" "$B/emu.o" "$B/util.o" -lstdc++ -lm
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  ${MPIRUN:-mpirun} -np 2 "$B/test_device" || rc=$?
fi
exit $rc
