/* cuda_common.cuh — what every .cu file of the CUDA backend shares: the checking macros
 * (each failed CUDA/cuBLAS call is reported as "file:line func: call: error" and the
 * function returns TSR_ERR), bf16 <-> fp32 conversions, deterministic block reductions,
 * grid sizing and stream-ordered scratch memory.
 *
 * Device code here is C++ (templates over the storage type: float or __nv_bfloat16);
 * everything exported is extern "C" and declared in ops_cuda.h. */
#ifndef TSR_CUDA_COMMON_CUH
#define TSR_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "ops.h" /* tsr_ops_adamw_scalars */
#include "util.h"
}
#include "ops_cuda.h"

typedef __nv_bfloat16 bf16;

#define TSR_CUDA_CHECK(expr)                                                                  \
  do {                                                                                        \
    cudaError_t tsr_e_ = (expr);                                                              \
    if (tsr_e_ != cudaSuccess) {                                                              \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: %s: CUDA error %s: %s", __FILE__, \
                    __LINE__, __func__, #expr, cudaGetErrorName(tsr_e_),                      \
                    cudaGetErrorString(tsr_e_));                                              \
      return TSR_ERR;                                                                         \
    }                                                                                         \
  } while (0)

/* After a kernel launch: catches bad launch configurations (asynchronous faults show up
 * at the next synchronising call, which is checked as well). */
#define TSR_CUDA_LAUNCHED() TSR_CUDA_CHECK(cudaGetLastError())

/* Argument checks of the exported functions (programming errors of the caller). */
/* ptr = the caller's scratch (ws), which must hold `need` bytes; otherwise an error
 * naming the function and both sizes (nothing is launched). */
#define TSR_CUDA_SCRATCH(ptr, ws, need)                                                     \
  do {                                                                                      \
    const size_t need_ = (need);                                                            \
    if (!(ws) || !(ws)->base || (ws)->bytes < need_) {                                      \
      tsr_errorf_at(__FILE__, __LINE__, __func__,                                           \
                    "%s:%d %s: needs %zu bytes of scratch, the tsr_cuda_scratch given has " \
                    "%zu (size it with tsr_cuda_scratch_bytes for the largest shapes)",     \
                    __FILE__, __LINE__, __func__, need_, (ws) && (ws)->base ? (ws)->bytes : 0); \
      return TSR_ERR;                                                                       \
    }                                                                                       \
    (ptr) = (decltype(ptr))(ws)->base;                                                      \
  } while (0)

/* Scratch parts start on 256-byte boundaries. */
static inline size_t scratch_round(size_t b) { return (b + 255) / 256 * 256; }

#define TSR_CUDA_ARG(cond)                                                                 \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      tsr_errorf_at(__FILE__, __LINE__, __func__, "%s:%d %s: invalid argument: %s", __FILE__, \
                    __LINE__, __func__, #cond);                                            \
      return TSR_ERR;                                                                      \
    }                                                                                      \
  } while (0)

/* ---- storage types: compute is always fp32 ---- */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

/* ---- deterministic reductions ----
 * Butterfly (xor) shuffles: every lane ends with the same, bitwise identical value
 * (each step adds the same two numbers on both lanes), and the order depends only on
 * the block size, so results are reproducible run to run. */
template <class V> __device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
 * result.  `scratch` holds 32 values of V in shared memory; the leading barrier makes it
 * safe to call repeatedly with the same scratch. */
template <class V> __device__ V block_sum(V v, V *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V t = lane < nwarp ? scratch[lane] : (V)0;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarp ? scratch[lane] : -INFINITY;
  return warp_max(t);
}

/* ---- launch geometry ---- */
#define TSR_CUDA_THREADS 256
/* Blocks for a grid-stride loop over n items: enough to fill any current GPU, and the
 * per-item result never depends on the count (each item is owned by one thread). */
static inline unsigned grid_for(long n, int threads) {
  long b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65536L * 8) b = 65536L * 8;
  return (unsigned)b;
}
#define GRID_STRIDE_LOOP(i, n) \
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)blockDim.x * gridDim.x)

/* Opt a kernel into more than 48 KiB of dynamic shared memory when it needs it. */
template <class K> static inline cudaError_t allow_smem(K kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* Deterministic sum of n doubles into *out (overwritten): one block, fixed order. */
int tsr_cuda_sum_doubles_(double *out, const double *x, long n, cudaStream_t stream);

#endif
