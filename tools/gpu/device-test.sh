#!/usr/bin/env bash
# device-test.sh — build and run the CUDA kernel tests (and the kernel benchmark) on a
# GPU machine without autotools, MPI or HDF5: only nvcc, gcc and cuBLAS are needed.
# The CPU reference is the CPU kernels (src/cpu*.c); where no BLAS is installed it links
# the naive sgemm in tests/cuda/standalone/.  The device side is the backend itself
# (cuda/ops_dev.c and the kernel files), opened without MPI.
#
#   tools/gpu/device-test.sh            build, run the tests
#   tools/gpu/device-test.sh bench      build, run the tests, then bench/cuda_kernels
#   tools/gpu/device-test.sh sanitize   build, run the tests under compute-sanitizer:
#                                        memcheck over all of them, racecheck (shared
#                                        memory) over the attention group
# cuDNN attention (cuda/sdpa_cudnn.cpp) is built and tested too where the frontend headers
# are in ext/cudnn-frontend (tools/fetch-cudnn-frontend.sh; copy `ext` over) and the machine
# has cuDNN 9 (cudnn.h and libcudnn.so.9, in CUDA_HOME or a Python wheel) and NVRTC.
# Environment: CUDA_ARCH (default -arch=native: the GPU present), BUILD (build folder,
# default $TMPDIR/tsr-cuda-standalone), TSR_TEST_SEED / TSR_TEST_ONLY (see test_kernels.c).
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
ARCH=${CUDA_ARCH:--arch=native}
B=${BUILD:-${TMPDIR:-/tmp}/tsr-cuda-standalone}
mkdir -p "$B"

BLAS_INC=() BLAS_LIB=()
if pkg-config --exists openblas 2>/dev/null; then
  read -r -a BLAS_INC <<< "$(pkg-config --cflags openblas)"
  read -r -a BLAS_LIB <<< "$(pkg-config --libs openblas)"
else
  echo "device-test: no OpenBLAS, using tests/cuda/standalone/naive_cblas.c"
  BLAS_INC=(-Itests/cuda/standalone)
  gcc -std=gnu11 -O2 -fopenmp -Itests/cuda/standalone -c tests/cuda/standalone/naive_cblas.c -o "$B/naive_cblas.o"
  BLAS_LIB=("$B/naive_cblas.o")
fi
CFLAGS=(-std=gnu11 -O2 -fopenmp -Wall -Isrc -Icuda -Itests -I"$CUDA_HOME/include")
NVFLAGS=(-O3 -lineinfo $ARCH -Isrc -Icuda)
pids=()
# cuDNN: headers and libraries of this machine (the CUDA toolkit's, or a wheel's)
first() { find "$CUDA_HOME" /usr/local /usr/lib /opt -xdev -name "$1" 2>/dev/null | head -1; }
CUDNN_OBJ=() CUDNN_LIB=()
cudnn_h=$(first cudnn_version.h) libcudnn=$(first libcudnn.so.9) libnvrtc=$(first 'libnvrtc.so.1[0-9]')
if [ -f ext/cudnn-frontend/include/cudnn_frontend.h ] && [ -n "$cudnn_h" ] && [ -n "$libcudnn" ] &&
   [ -n "$libnvrtc" ]; then
  echo "device-test: cuDNN attention with $(dirname "$cudnn_h"), $libcudnn, $libnvrtc"
  CFLAGS+=(-DTSR_HAVE_CUDNN -I"$(dirname "$cudnn_h")")
  NVFLAGS+=(-DTSR_HAVE_CUDNN)
  g++ -std=c++17 -O2 -DTSR_HAVE_CUDNN -Isrc -Icuda -I"$CUDA_HOME/include" -I"$(dirname "$cudnn_h")" \
    -isystem ext/cudnn-frontend/include -c cuda/sdpa_cudnn.cpp -o "$B/sdpa_cudnn.o" & pids+=($!)
  CUDNN_OBJ=("$B/sdpa_cudnn.o")
  CUDNN_LIB=("$libcudnn" "$libnvrtc" -Wl,-rpath,"$(dirname "$libcudnn")" -Wl,-rpath,"$(dirname "$libnvrtc")")
else
  echo "device-test: no cuDNN attention (frontend in ext/: $([ -d ext/cudnn-frontend ] && echo yes || echo no); cudnn_version.h: ${cudnn_h:-none}; libcudnn.so.9: ${libcudnn:-none}; libnvrtc: ${libnvrtc:-none})"
fi
KERNELS=(gemm embed norm elem xent optim attention attn_f32 attn_wmma attn_mma)
for f in "${KERNELS[@]}"; do
  "$NVCC" "${NVFLAGS[@]}" -c "cuda/$f.cu" -o "$B/$f.o" & pids+=($!)
done
HOST_OBJS=()
for f in src/cpu*.c src/ops.c src/util.c cuda/dev.c cuda/ops_dev.c; do
  gcc "${CFLAGS[@]}" "${BLAS_INC[@]}" -c "$f" -o "$B/host_$(basename "$f" .c).o"
  HOST_OBJS+=("$B/host_$(basename "$f" .c).o")
done
for f in tests/cuda/test_kernels.c tests/cuda/kernels_util.c tests/cuda/test_kernels_attention.c \
  bench/cuda_kernels.c; do
  gcc "${CFLAGS[@]}" -c "$f" -o "$B/$(basename "$f" .c).o"
done
for p in "${pids[@]}"; do wait "$p"; done
LIBS=(-L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -Wl,-rpath,"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib"
      "${CUDNN_LIB[@]}" -lcublasLt -lcublas -lcudart -lstdc++ -lm)
CUDA_OBJS=("${KERNELS[@]/#/$B/}")
CUDA_OBJS=("${CUDA_OBJS[@]/%/.o}" "${CUDNN_OBJ[@]}" "${HOST_OBJS[@]}")
gcc -fopenmp -o "$B/test_kernels" "$B/test_kernels.o" "$B/kernels_util.o" "$B/test_kernels_attention.o" \
  "${CUDA_OBJS[@]}" "${BLAS_LIB[@]}" "${LIBS[@]}"
gcc -fopenmp -o "$B/cuda_kernels" "$B/cuda_kernels.o" "${CUDA_OBJS[@]}" "${BLAS_LIB[@]}" "${LIBS[@]}"
rc=0
if [ "${1:-}" = sanitize ]; then
  SAN=${SANITIZER:-$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")}
  # over our kernels (cuDNN's own are not ours to check: TSR_TEST_NO_CUDNN)
  export TSR_TEST_NO_CUDNN=1
  "$SAN" --tool memcheck --error-exitcode 9 "$B/test_kernels" >"$B/memcheck.log" 2>&1 || rc=$?
  grep -h "^test_kernels:\|ERROR SUMMARY\|^FAIL" "$B/memcheck.log" | tail -20
  echo "memcheck over test_kernels: exit $rc"
  r2=0
  TSR_TEST_ONLY=attention "$SAN" --tool racecheck --error-exitcode 9 "$B/test_kernels" \
    >"$B/racecheck.log" 2>&1 || r2=$?
  grep -h "^test_kernels:\|RACECHECK SUMMARY\|^FAIL" "$B/racecheck.log" | tail -20
  echo "racecheck over test_kernels (attention): exit $r2"
  [ $rc -eq 0 ] && rc=$r2
  exit $rc
fi
"$B/test_kernels" || rc=$?
if [ "${1:-}" = bench ] && [ $rc -ne 77 ]; then "$B/cuda_kernels" || rc=$?; fi
exit $rc
