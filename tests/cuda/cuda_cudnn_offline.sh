#!/usr/bin/env bash
# cuda_cudnn_offline.sh — tests/cuda/cudnn_offline (cuDNN attention's graphs accepted by
# cuDNN for an H100, without a GPU) with the CUDA toolkit's stub libcuda.so as the driver
# library: cuDNN only loads it (the stub's functions are never called before the kernels'
# compilation, which the test leaves out).  Skips where the toolkit has no stub.
set -u
. "${top_srcdir:-.}/tests/lib.sh"
prog=${top_builddir:-.}/tests/cuda/cudnn_offline
[ -x "$prog" ] || skip "no $prog (a build without cuDNN attention)"
cudart=$(ldd "$prog" | awk '$1 ~ /^libcudart/ {print $3}')
stub=$(dirname "${cudart:-/nonexistent/x}")/stubs/libcuda.so
[ -f "$stub" ] || skip "no stub libcuda.so beside $cudart"
scratch
mkdir -p "$SCRATCH/driver"
ln -sf "$stub" "$SCRATCH/driver/libcuda.so.1"
LD_LIBRARY_PATH=$SCRATCH/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  "$prog" "$top_srcdir/tests/cuda/cudnn_h100.json"
