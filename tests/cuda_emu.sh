#!/usr/bin/env bash
# cuda_emu.sh — the CUDA kernels checked on a machine without a GPU: tests/cuda/emulate.sh
# builds tests/cuda/test_kernels with every CUDA thread run as a CPU fiber (cuBLASLt as
# plain loops) and compares each kernel with ops_cpu.c, then checks cuda/device.c's GPU
# selection over 2 MPI ranks.  On a GPU machine tests/cuda/test_kernels runs the real thing.
. "${top_srcdir:-.}/tests/lib.sh"
command -v g++ >/dev/null || skip "no g++"
command -v python3 >/dev/null || skip "no python3"
bash "$top_srcdir/tests/cuda/emulate.sh"
