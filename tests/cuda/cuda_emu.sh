#!/usr/bin/env bash
# cuda_emu.sh — the CUDA backend checked on a machine without a GPU: tests/cuda/emulate.sh
# builds tests/cuda/test_kernels with every CUDA thread run as a CPU fiber (cuBLASLt and
# cuDNN's attention as plain loops) and compares each op of the device backend with its CPU
# kernel in fp32, bf16 and fp16, the attention's head_dim 128 again with an sm_86 part's
# shared memory, then checks cuda/select.c's GPU selection over 2 MPI ranks.  On a GPU
# machine tests/cuda/test_kernels runs the real thing.
. "${top_srcdir:-.}/tests/lib.sh"
command -v g++ >/dev/null || skip "no g++"
command -v python3 >/dev/null || skip "no python3"
bash "$top_srcdir/tests/cuda/emulate.sh"
