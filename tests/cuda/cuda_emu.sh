#!/usr/bin/env bash
# cuda_emu.sh — the CUDA backend checked on a machine without a GPU: tests/cuda/emulate.sh
# runs tests/cuda/test_kernels built with every CUDA thread run as a CPU fiber (cuBLASLt and
# cuDNN's attention as plain loops; the build the CUDA tests share, tests/lib.sh emu_build),
# which compares each op of the device backend with its CPU kernel in fp32, bf16 and fp16,
# the attention's head_dim 128 again with an sm_86 part's shared memory, then checks
# cuda/select.c's GPU selection over 2 MPI ranks.  On a GPU machine tests/cuda/test_kernels
# runs the real thing.
. "${top_srcdir:-.}/tests/lib.sh"
emu_build
EMU_BUILD=$EMU_BUILD bash "$top_srcdir/tests/cuda/emulate.sh"
