#!/usr/bin/env bash
# emulate.sh — tests/cuda/test_kernels with the CUDA kernels executed on the CPU, for
# machines without a GPU (no CUDA toolkit needed either).
#
# emu/ stands in for the CUDA runtime, cuBLASLt, CUB, the bf16 and fp16 types
# and the tensor-core instructions: every CUDA thread is a fiber, __syncthreads and warp
# shuffles are real barriers (threads waiting at different barriers abort as a deadlock),
# cuBLASLt is a naive loop with the documented semantics, and cuDNN's attention a host
# loop (emu/sdpa_fake.c).  The device backend (cuda/backend.c) runs as in the trainer: its
# table, reserve, scratch, failure flag and attention choice.  It checks the kernels'
# indexing, tiling, causal masks, online softmax, reductions, storage conversions and
# barrier placement against the CPU kernels (src/cpu*.c) in fp32, bf16 and fp16.  It says
# nothing about speed, coalescing, shared-memory limits, races between blocks, FMA
# contraction, or the real cuBLASLt and cuDNN (whose epilogues and graphs only a GPU run
# checks).  Then tests/cuda/test_device checks the device selection of cuda/select.c on 2
# MPI ranks with 0, 1, 2 and 4 emulated GPUs.  About a minute and a half on 2 cores.
#
#   tests/cuda/emulate.sh                 (TSR_TEST_ONLY=attention,xent  TSR_TEST_SEED=N)
#
# EMU_BUILD=DIR runs the programs that emu/emu-test-kernels.sh DIR built before from the
# same sources (tests/lib.sh emu_build) instead of building them again.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
emu=$top/emu
if [ -n "${EMU_BUILD:-}" ]; then
  B=$EMU_BUILD
else
  B=$(mktemp -d "${TMPDIR:-/tmp}/tsr-cuda-emu.XXXXXX")
  trap 'rm -rf "$B"' EXIT
  bash "$emu/emu-test-kernels.sh" "$B"
fi
rc=0
"$B/test_kernels" || rc=$?
# as on an sm_86/89 part (99 KB of shared memory per block): head_dim 128 gets no
# tensor-core kernel (the mma.sync backward needs 107008 bytes) and its shapes pass on the
# fp32-arithmetic kernel instead; the table of which head_dim takes which kernel is checked
# again, and the other head dims, whose kernels stay the same, are not run twice
if [ -z "${TSR_TEST_ONLY:-}" ]; then
  echo "--- attention again with 101376 bytes of shared memory per block (sm_86/89), head_dim 128"
  EMU_SMEM_OPTIN=101376 TSR_TEST_ONLY=attention TSR_TEST_HEAD_DIM=128 "$B/test_kernels" || rc=$?
fi

# device selection (cuda/select.c) over 2 MPI ranks on emulated GPUs
if [ -x "$B/test_device" ] && [ -z "${TSR_TEST_ONLY:-}" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  ${MPIRUN:-mpirun} -np 2 "$B/test_device" || rc=$?
fi
exit $rc
