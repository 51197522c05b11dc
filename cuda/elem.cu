/* elem.cu — the element-wise ops: RoPE, SwiGLU, GELU, the skip connection's sum, the fp32
 * gradient sums and the conversions between storage types.  Each output element is owned
 * by one thread of a grid-stride loop (the result never depends on the grid), computed in
 * fp32 from inputs widened exactly and rounded once as it is stored. */
#include "cuda_common.cuh"

extern "C" {
#include "backend.h"
}

/* --------------------------------------------------------------------- RoPE
 * One thread per (row, pair i): the angle pos * inv_freq(i) (rope.h) and its cos/sin are
 * formed in double (as on the CPU: the phase at long context needs it), then applied to
 * every head of the row.  dir = -1 rotates backwards (the gradient).  The row's position
 * is r % T, less its document's start with documents (ops_list.h). */
template <class T>
__global__ void rope_kernel(T *x, int n, int T_, int n_heads, int head_dim, int stride,
                            tsr_rope rope, int dir, const int32_t *doc) {
  const int half = head_dim / 2;
  GRID_STRIDE_LOOP(idx, (long)n * half) {
    const int r = (int)(idx / half), i = (int)(idx % half);
    const double inv_freq = tsr_rope_inv_freq(rope, i, head_dim);
    double sn_d, cs_d;
    const int pos = doc ? r % T_ - doc[r] : r % T_;
    sincos((double)pos * inv_freq, &sn_d, &cs_d);
    const float cs = (float)cs_d, sn = (float)(dir * sn_d);
    T *row = x + (size_t)r * stride;
    for (int h = 0; h < n_heads; h++) {
      T *a = row + (size_t)h * head_dim, *b = a + half;
      const float xa = to_f32(a[i]), xb = to_f32(b[i]);
      a[i] = from_f32<T>(xa * cs - xb * sn);
      b[i] = from_f32<T>(xa * sn + xb * cs);
    }
  }
}

template <class T>
static int rope(T *x, int n, int T_, int n_heads, int head_dim, int stride, tsr_rope rp, int dir,
                const int32_t *doc) {
  const long work = (long)n * (head_dim / 2);
  if (work <= 0 || n_heads <= 0) return 0;
  TSR_CUDA_ARG(T_ > 0 && stride >= n_heads * head_dim);
  LAUNCH_ELEM(rope_kernel<T>, work, tsr_cuda_ctx.stream, x, n, T_, n_heads, head_dim, stride, rp,
              dir, doc);
  return 0;
}

extern "C" void tsr_cuda_rope_fwd(tsr_dtype dt, void *x, int n, int T, int n_heads, int head_dim,
                                 int stride, tsr_rope rp, const int32_t *doc) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S, rope<S>((S *)x, n, T, n_heads, head_dim, stride, rp, +1, doc));
}
extern "C" void tsr_cuda_rope_bwd(tsr_dtype dt, void *dx, int n, int T, int n_heads, int head_dim,
                                 int stride, tsr_rope rp, const int32_t *doc) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S, rope<S>((S *)dx, n, T, n_heads, head_dim, stride, rp, -1, doc));
}

/* ------------------------------------------------------------ SwiGLU, GELU */

template <class T> __global__ void swiglu_fwd_kernel(T *out, const T *gate_up, int n, int F) {
  GRID_STRIDE_LOOP(i, (long)n * F) {
    const long r = i / F, j = i % F;
    const float g = to_f32(gate_up[r * 2 * F + j]), u = to_f32(gate_up[r * 2 * F + F + j]);
    out[i] = from_f32<T>(g / (1.0f + expf(-g)) * u);
  }
}

/* silu(g) = g s, s = sigmoid(g);  silu'(g) = s (1 + g (1 - s)) */
template <class T>
__global__ void swiglu_bwd_kernel(T *dgate_up, const T *dout, const T *gate_up, int n, int F) {
  GRID_STRIDE_LOOP(i, (long)n * F) {
    const long r = i / F, j = i % F;
    const size_t ig = r * 2 * F + j, iu = ig + F;
    const float g = to_f32(gate_up[ig]), u = to_f32(gate_up[iu]), d = to_f32(dout[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    dgate_up[ig] = from_f32<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dgate_up[iu] = from_f32<T>(d * g * s);
  }
}

#define GELU_C 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

template <class T> __global__ void gelu_fwd_kernel(T *out, const T *x, long n) {
  GRID_STRIDE_LOOP(i, n) {
    const float xi = to_f32(x[i]);
    out[i] = from_f32<T>(0.5f * xi * (1.0f + tanhf(GELU_C * (xi + GELU_A * xi * xi * xi))));
  }
}

template <class T> static int swiglu_forward(T *out, const T *gate_up, int n, int F) {
  LAUNCH_ELEM(swiglu_fwd_kernel<T>, (long)n * F, tsr_cuda_ctx.stream, out, gate_up, n, F);
  return 0;
}
template <class T>
static int swiglu_backward(T *dgate_up, const T *dout, const T *gate_up, int n, int F) {
  LAUNCH_ELEM(swiglu_bwd_kernel<T>, (long)n * F, tsr_cuda_ctx.stream, dgate_up, dout, gate_up, n, F);
  return 0;
}
template <class T> static int gelu_forward(T *out, const T *x, long n) {
  LAUNCH_ELEM(gelu_fwd_kernel<T>, n, tsr_cuda_ctx.stream, out, x, n);
  return 0;
}

extern "C" void tsr_cuda_swiglu_fwd(tsr_dtype dt, void *out, const void *gate_up, int n, int F) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S, swiglu_forward<S>((S *)out, (const S *)gate_up, n, F));
}
extern "C" void tsr_cuda_swiglu_bwd(tsr_dtype dt, void *dgate_up, const void *dout,
                                   const void *gate_up, int n, int F) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S,
                swiglu_backward<S>((S *)dgate_up, (const S *)dout, (const S *)gate_up, n, F));
}
extern "C" void tsr_cuda_gelu_fwd(tsr_dtype dt, void *out, const void *x, long n_elem) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S, gelu_forward<S>((S *)out, (const S *)x, n_elem));
}

/* ------------------------------------------------------------- element-wise sums */

/* out = x + y rounded once (out may be x) */
template <class T> __global__ void skip_sum_kernel(T *out, const T *x, const T *y, long n) {
  GRID_STRIDE_LOOP(i, n) out[i] = from_f32<T>(to_f32(x[i]) + to_f32(y[i]));
}
__global__ void sum2_kernel(float *out, const float *a, const float *b, long n) {
  GRID_STRIDE_LOOP(i, n) out[i] = a[i] + b[i];
}
__global__ void sum_into_kernel(float *out, const float *a, long n) {
  GRID_STRIDE_LOOP(i, n) out[i] += a[i];
}

template <class T> static int skip_sum(T *out, const T *x, const T *y, long n) {
  LAUNCH_ELEM(skip_sum_kernel<T>, n, tsr_cuda_ctx.stream, out, x, y, n);
  return 0;
}

extern "C" void tsr_cuda_residual(tsr_dtype dt, void *out, const void *x, const void *y,
                                 long n_elem) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, S, skip_sum<S>((S *)out, (const S *)x, (const S *)y, n_elem));
}

static int sum2(float *out, const float *a, const float *b, long n) {
  LAUNCH_ELEM(sum2_kernel, n, tsr_cuda_ctx.stream, out, a, b, n);
  return 0;
}
static int sum_into(float *out, const float *a, long n) {
  LAUNCH_ELEM(sum_into_kernel, n, tsr_cuda_ctx.stream, out, a, n);
  return 0;
}
extern "C" void tsr_cuda_add(float *out, const float *a, const float *b, long n_elem) {
  TSR_CUDA_SKIP();
  TSR_CUDA_RUN(sum2(out, a, b, n_elem));
}
extern "C" void tsr_cuda_acc(float *out, const float *a, long n_elem) {
  TSR_CUDA_SKIP();
  TSR_CUDA_RUN(sum_into(out, a, n_elem));
}

/* ------------------------------------------------------------- conversions
 * dst = src widened exactly and rounded to nearest even to dst's type (dtype.h's bits for
 * finite values); the same type is a copy (nothing when in place). */
template <class S, class D> __global__ void convert_kernel(D *dst, const S *src, long n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = from_f32<D>(to_f32(src[i]));
}

template <class D> static int convert_to(D *dst, tsr_dtype src_dt, const void *src, long n) {
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  TSR_DTYPE_SWITCH(src_dt, S,
                   convert_kernel<S, D><<<grid_for(n, TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0,
                                          stream>>>(dst, (const S *)src, n);
                   TSR_CUDA_LAUNCHED());
  return 0;
}

static int convert(tsr_dtype dst_dt, void *dst, tsr_dtype src_dt, const void *src, long n) {
  if (n <= 0) return 0;
  if (dst_dt == src_dt) {
    if (dst != src)
      TSR_CUDA_CALL(cudaMemcpyAsync(dst, src, (size_t)n * tsr_dtype_size(dst_dt),
                                     cudaMemcpyDefault, tsr_cuda_ctx.stream));
    return 0;
  }
  TSR_CUDA_ARG(dst != src);
  TSR_DTYPE_SWITCH(dst_dt, D, return convert_to<D>((D *)dst, src_dt, src, n));
  return 0;
}

static int copy_2d(void *dst, long dst_pitch, const void *src, long src_pitch, long width,
                   long rows) {
  if (rows <= 0 || width <= 0) return 0;
  TSR_CUDA_CALL(cudaMemcpy2DAsync(dst, (size_t)dst_pitch, src, (size_t)src_pitch, (size_t)width,
                                  (size_t)rows, cudaMemcpyDefault, tsr_cuda_ctx.stream));
  return 0;
}

extern "C" void tsr_cuda_copy_2d(void *dst, long dst_pitch, const void *src, long src_pitch,
                                 long width, long rows) {
  TSR_CUDA_SKIP();
  TSR_CUDA_RUN(copy_2d(dst, dst_pitch, src, src_pitch, width, rows));
}

extern "C" void tsr_cuda_cast(tsr_dtype dst_dt, void *dst, tsr_dtype src_dt, const void *src,
                             long n_elem) {
  TSR_CUDA_SKIP();
  TSR_CUDA_RUN(convert(dst_dt, dst, src_dt, src, n_elem));
}
