/* cuda_common.cuh — what every kernel file of the CUDA backend shares: the check macros
 * (check.h: a failed CUDA call is reported as "file:line func: call: error" and the
 * function returns TSR_ERR, which its op turns into the context's failure, context.h), the storage
 * types (float, bf16, fp16: compute is fp32, a value is widened exactly on load and
 * rounded once, to nearest even, on store, the bits of dtype.h's conversions), the switch
 * from a tsr_dtype to the type, deterministic reductions, launch geometry and the column
 * sums of the weight and bias gradients.
 *
 * The check macros are cuda/check.h's.
 *
 * Device code here is C++ (kernels templated on the storage type); what the op files
 * export is extern "C". */
#ifndef TSR_CUDA_COMMON_CUH
#define TSR_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "context.h"

typedef __nv_bfloat16 bf16;
typedef __half f16;

/* ptr = the context's scratch, which must hold `need` bytes (else TSR_ERR, reported). */
#define TSR_CUDA_SCRATCH(ptr, need)                                 \
  do {                                                              \
    void *tsr_s_ = tsr_cuda_scratch((need), __func__);               \
    if (!tsr_s_) return TSR_ERR;                                    \
    (ptr) = (decltype(ptr))tsr_s_;                                  \
  } while (0)

/* Scratch parts start on 256-byte boundaries. */
static inline size_t scratch_round(size_t b) { return (b + 255) / 256 * 256; }

/* ---- storage types ---- */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) { return __float2half_rn(x); }
/* x rounded to T and widened back: the value a store of it keeps */
template <class T> __device__ __forceinline__ float round_as(float x) {
  return to_f32(from_f32<T>(x));
}

/* `...` (statements) with T the storage type of dt; an unknown dt is an argument error. */
#define TSR_DTYPE_SWITCH(dt, T, ...)                                    \
  do {                                                                  \
    switch (dt) {                                                       \
      case TSR_F32: {                                                   \
        typedef float T;                                                \
        __VA_ARGS__;                                                    \
      } break;                                                          \
      case TSR_BF16: {                                                  \
        typedef bf16 T;                                                 \
        __VA_ARGS__;                                                    \
      } break;                                                          \
      case TSR_F16: {                                                   \
        typedef f16 T;                                                  \
        __VA_ARGS__;                                                    \
      } break;                                                          \
      default:                                                          \
        TSR_CUDA_ARG(!"dt is TSR_F32, TSR_BF16 or TSR_F16");            \
    }                                                                   \
  } while (0)

/* In an op (which returns nothing): `...`, a call returning 0 or TSR_ERR, with T the
 * storage type of dt; a failure (or an unknown dt) fails the backend (context.h). */
#define TSR_CUDA_DTYPE(dt, T, ...)                                                    \
  do {                                                                               \
    switch (dt) {                                                                    \
      case TSR_F32: {                                                                \
        typedef float T;                                                             \
        TSR_CUDA_RUN((__VA_ARGS__));                                                  \
      } break;                                                                       \
      case TSR_BF16: {                                                               \
        typedef bf16 T;                                                              \
        TSR_CUDA_RUN((__VA_ARGS__));                                                  \
      } break;                                                                       \
      case TSR_F16: {                                                                \
        typedef f16 T;                                                               \
        TSR_CUDA_RUN((__VA_ARGS__));                                                  \
      } break;                                                                       \
      default:                                                                       \
        tsr_errorf_at(__FILE__, __LINE__, __func__, "%s: storage type %d", __func__, \
                      (int)(dt));                                                    \
        tsr_cuda_ctx.failed = 1;                                                      \
    }                                                                                \
  } while (0)

/* ---- deterministic reductions ----
 * Butterfly (xor) shuffles: every lane ends with the same, bitwise identical value
 * (each step sums the same two numbers on both lanes), and the order depends only on
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
#define GRID_STRIDE_LOOP(i, n)                                                 \
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n);          \
       i += (long)blockDim.x * gridDim.x)

/* A grid-stride kernel over n_items (nothing for none), checked. */
#define LAUNCH_ELEM(kernel, n_items, stream, ...)                                          \
  do {                                                                                     \
    if ((n_items) > 0) {                                                                   \
      kernel<<<grid_for((n_items), TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(__VA_ARGS__); \
      TSR_CUDA_LAUNCHED();                                                                 \
    }                                                                                      \
  } while (0)

/* Opt a kernel into more than 48 KiB of dynamic shared memory when it needs it. */
template <class K> static inline cudaError_t allow_smem(K kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* ---- column sums: dst[c] += sum over rows r of f(r, c), in double ----
 * The weight and bias gradients of the norms and the GEMMs (fp32, accumulated): pass 1
 * gives each chunk of COL_CHUNK rows a partial per column (a fixed split of the rows
 * over the block's threads), pass 2 sums the chunks in order.  Deterministic. */
#define COL_CHUNK 256
#define COL_TX 32
#define COL_TY 8

template <class F>
__global__ void col_partial_kernel(double *partial, F f, int n, int C) {
  __shared__ double s[COL_TY][COL_TX + 1];
  const int c = blockIdx.x * COL_TX + threadIdx.x, chunk = blockIdx.y;
  const int r0 = chunk * COL_CHUNK, r1 = min(n, r0 + COL_CHUNK);
  double sum = 0.0;
  if (c < C)
    for (int r = r0 + threadIdx.y; r < r1; r += COL_TY) sum += f(r, c);
  s[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double t = 0.0;
    for (int y = 0; y < COL_TY; y++) t += s[y][threadIdx.x];
    partial[(size_t)chunk * C + c] = t;
  }
}

template <int UNUSED>
__global__ void col_finish_kernel(float *dst, const double *partial, int n_chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double t = 0.0;
  for (int k = 0; k < n_chunks; k++) t += partial[(size_t)k * C + c];
  dst[c] += (float)t;
}

/* Scratch of col_reduce: a double per column per chunk of rows. */
static inline size_t col_scratch(long n, long C) {
  return n > 0 && C > 0 ? (size_t)((n + COL_CHUNK - 1) / COL_CHUNK) * (size_t)C * sizeof(double)
                        : 0;
}

template <class F>
static int col_reduce(float *dst, F f, int n, int C, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  const int n_chunks = (n + COL_CHUNK - 1) / COL_CHUNK;
  double *partial = NULL;
  TSR_CUDA_SCRATCH(partial, col_scratch(n, C));
  col_partial_kernel<<<dim3((C + COL_TX - 1) / COL_TX, n_chunks), dim3(COL_TX, COL_TY), 0,
                       stream>>>(partial, f, n, C);
  TSR_CUDA_LAUNCHED();
  col_finish_kernel<0><<<(C + 255) / 256, 256, 0, stream>>>(dst, partial, n_chunks, C);
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* The column of a [n, C] matrix in storage type T, widened (the bias gradients). */
template <class T> struct ColumnOf {
  const T *g;
  int C;
  __device__ double operator()(int r, int c) const { return (double)to_f32(g[(size_t)r * C + c]); }
};

/* ---- a sum of n doubles in one block, in a fixed order ----
 * out[0] = the sum (DIV 0), or out[0] += the sum / div (the losses of ops_list.h). */
template <int DIV>
__global__ void sum_doubles_kernel(double *out, const double *x, long n, double div) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (long i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    if (DIV)
      out[0] += s / div;
    else
      out[0] = s;
  }
}

#endif
