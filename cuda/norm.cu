/* norm.cu — RMSNorm and LayerNorm, forward (with the skip connection's sum before them
 * fused in) and backward, on fp32, bf16 or fp16 storage; the statistics (rstd, mean) and
 * the weight gradients are fp32.
 *
 * One block per row: its sums in double over a fixed split of the columns, reduced by
 * block_sum in a fixed order.  Forward with y: h = x + y is rounded to the storage type
 * and stored first (h may be x: each thread reads and writes only its own columns), then
 * the row is normalised from the stored h, as a separate pass over it would see it.
 * Backward: dx is written, or summed into (accumulate set: the gradient of the stream the
 * norm's input came from); dw and db are column sums over the rows (cuda_common.cuh), in
 * fp32, accumulated.  Deterministic. */
#include "cuda_common.cuh"

extern "C" {
#include "backend.h"
}

#define ROW_THREADS 256 /* one block per row */

/* The norm's input at column c of row r: x + y rounded and stored into h, or x */
template <class T>
__device__ __forceinline__ float norm_input(T *h, const T *x, const T *y, size_t i) {
  if (!y) return to_f32(x[i]);
  const T v = from_f32<T>(to_f32(x[i]) + to_f32(y[i]));
  h[i] = v;
  return to_f32(v);
}

template <class T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, T *h, const T *x, const T *y, const T *w,
                                   int C, float eps) {
  __shared__ double scratch[32];
  const size_t r0 = (size_t)blockIdx.x * C;
  const T *src = y ? h : x; /* the input as stored, once the first pass has written h */
  double ss = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double v = norm_input(h, x, y, r0 + c);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float rs = (float)(1.0 / sqrt(ss / C + (double)eps));
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    out[r0 + c] = from_f32<T>(to_f32(src[r0 + c]) * rs * to_f32(w[c]));
}

/* dx_i (+)= r (w_i g_i - x_i r^2 <g w, x> / C) */
template <class T>
__global__ void rmsnorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd,
                                  int C, int accumulate) {
  __shared__ double scratch[32];
  const size_t r0 = (size_t)blockIdx.x * C;
  double dot = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += (double)to_f32(dout[r0 + c]) * (double)to_f32(w[c]) * (double)to_f32(x[r0 + c]);
  dot = block_sum(dot, scratch);
  const float rs = rstd[blockIdx.x];
  const float k = (float)(dot / C) * rs * rs;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = rs * (to_f32(w[c]) * to_f32(dout[r0 + c]) - to_f32(x[r0 + c]) * k);
    dx[r0 + c] = from_f32<T>(accumulate ? to_f32(dx[r0 + c]) + g : g);
  }
}

template <class T> struct RmsDw {
  const T *g, *x;
  const float *rstd;
  int C;
  __device__ double operator()(int r, int c) const {
    const size_t i = (size_t)r * C + c;
    return (double)(to_f32(g[i]) * to_f32(x[i]) * rstd[r]);
  }
};

template <class T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, T *h, const T *x,
                                     const T *y, const T *w, const T *b, int C, float eps) {
  __shared__ double scratch[32];
  const size_t r0 = (size_t)blockIdx.x * C;
  const T *src = y ? h : x;
  double s = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += norm_input(h, x, y, r0 + c);
  s = block_sum(s, scratch);
  const double mu = s / C;
  double var = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double d = to_f32(src[r0 + c]) - mu;
    var += d * d;
  }
  var = block_sum(var, scratch);
  const float m = (float)mu, rs = (float)(1.0 / sqrt(var / C + (double)eps));
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = rs;
  }
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float o = (to_f32(src[r0 + c]) - m) * rs * to_f32(w[c]);
    out[r0 + c] = from_f32<T>(b ? o + to_f32(b[c]) : o);
  }
}

/* xhat = (x - mean) r;  dx (+)= r (g w - mean(g w) - xhat mean(g w xhat)) */
template <class T>
__global__ void layernorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w,
                                    const float *mean, const float *rstd, int C, int accumulate) {
  __shared__ double scratch[32];
  const size_t r0 = (size_t)blockIdx.x * C;
  const float m = mean[blockIdx.x], rs = rstd[blockIdx.x];
  double sum_gw = 0.0, sum_gwx = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float gw = to_f32(dout[r0 + c]) * to_f32(w[c]);
    sum_gw += gw;
    sum_gwx += (double)gw * ((to_f32(x[r0 + c]) - m) * rs);
  }
  sum_gw = block_sum(sum_gw, scratch);
  sum_gwx = block_sum(sum_gwx, scratch);
  const float a = (float)(sum_gw / C), bb = (float)(sum_gwx / C);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xh = (to_f32(x[r0 + c]) - m) * rs;
    const float g = rs * (to_f32(dout[r0 + c]) * to_f32(w[c]) - a - xh * bb);
    dx[r0 + c] = from_f32<T>(accumulate ? to_f32(dx[r0 + c]) + g : g);
  }
}

template <class T> struct LnDw {
  const T *g, *x;
  const float *mean, *rstd;
  int C;
  __device__ double operator()(int r, int c) const {
    const size_t i = (size_t)r * C + c;
    return (double)(to_f32(g[i]) * ((to_f32(x[i]) - mean[r]) * rstd[r]));
  }
};

extern "C" int tsr_cuda_scratch_norms(const tsr_ops_shapes *s, size_t *bytes) {
  *bytes = col_scratch(s->rows, s->cols);
  return 0;
}

template <class T>
static int rms_forward(T *out, float *rstd, T *h, const T *x, const T *y, const T *w, int n,
                       int C, float eps) {
  if (n <= 0 || C <= 0) return 0;
  TSR_CUDA_ARG(out && rstd && x && w && (!y || h));
  rmsnorm_fwd_kernel<T><<<n, ROW_THREADS, 0, tsr_cuda_ctx.stream>>>(out, rstd, h, x, y, w, C, eps);
  TSR_CUDA_LAUNCHED();
  return 0;
}

template <class T>
static int rms_backward(T *dx, float *dw, const T *dout, const T *x, const T *w, const float *rstd,
                        int n, int C, int accumulate) {
  if (n <= 0 || C <= 0) return 0;
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  if (dx) {
    rmsnorm_dx_kernel<T><<<n, ROW_THREADS, 0, stream>>>(dx, dout, x, w, rstd, C, accumulate);
    TSR_CUDA_LAUNCHED();
  }
  if (dw) TSR_CALL(col_reduce(dw, RmsDw<T>{dout, x, rstd, C}, n, C, stream));
  return 0;
}

template <class T>
static int ln_forward(T *out, float *mean, float *rstd, T *h, const T *x, const T *y, const T *w,
                      const T *b, int n, int C, float eps) {
  if (n <= 0 || C <= 0) return 0;
  TSR_CUDA_ARG(out && mean && rstd && x && w && (!y || h));
  layernorm_fwd_kernel<T><<<n, ROW_THREADS, 0, tsr_cuda_ctx.stream>>>(out, mean, rstd, h, x, y, w,
                                                                      b, C, eps);
  TSR_CUDA_LAUNCHED();
  return 0;
}

template <class T>
static int ln_backward(T *dx, float *dw, float *db, const T *dout, const T *x, const T *w,
                       const float *mean, const float *rstd, int n, int C, int accumulate) {
  if (n <= 0 || C <= 0) return 0;
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  if (dx) {
    layernorm_dx_kernel<T><<<n, ROW_THREADS, 0, stream>>>(dx, dout, x, w, mean, rstd, C,
                                                          accumulate);
    TSR_CUDA_LAUNCHED();
  }
  if (dw) TSR_CALL(col_reduce(dw, LnDw<T>{dout, x, mean, rstd, C}, n, C, stream));
  if (db) TSR_CALL(col_reduce(db, ColumnOf<T>{dout, C}, n, C, stream));
  return 0;
}

extern "C" void tsr_cuda_rmsnorm_fwd(tsr_dtype dt, void *out, float *rstd, void *h, const void *x,
                                    const void *y, const void *w, int n, int C, float eps) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T,
                rms_forward<T>((T *)out, rstd, (T *)h, (const T *)x, (const T *)y, (const T *)w,
                               n, C, eps));
}

extern "C" void tsr_cuda_rmsnorm_bwd(tsr_dtype dt, void *dx, float *dw, const void *dout,
                                    const void *x, const void *w, const float *rstd, int n, int C,
                                    int accumulate) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T,
                rms_backward<T>((T *)dx, dw, (const T *)dout, (const T *)x, (const T *)w, rstd, n,
                                C, accumulate));
}

extern "C" void tsr_cuda_layernorm_fwd(tsr_dtype dt, void *out, float *mean, float *rstd, void *h,
                                      const void *x, const void *y, const void *w, const void *b,
                                      int n, int C, float eps) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T,
                ln_forward<T>((T *)out, mean, rstd, (T *)h, (const T *)x, (const T *)y,
                              (const T *)w, (const T *)b, n, C, eps));
}

extern "C" void tsr_cuda_layernorm_bwd(tsr_dtype dt, void *dx, float *dw, float *db,
                                      const void *dout, const void *x, const void *w,
                                      const float *mean, const float *rstd, int n, int C,
                                      int accumulate) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T,
                ln_backward<T>((T *)dx, dw, db, (const T *)dout, (const T *)x, (const T *)w, mean,
                               rstd, n, C, accumulate));
}
