/* ops_elem.cu — the CUDA kernels of ops.h other than GEMMs, attention and cross entropy:
 * embedding, RMSNorm, LayerNorm, RoPE, SwiGLU, GELU, residual adds, AdamW, casts and
 * reductions.  Each mirrors the CPU function of the same name in src/ops_cpu.c.
 *
 * Determinism: every output element has one owning thread; reductions over rows
 * (dw, db, dwpe, dwte) are split over columns, or into per-chunk partials that one
 * thread per column then sums in chunk order, never with floating-point atomics. */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

#define ROW_THREADS 256 /* one block per row for the row-wise kernels */

/* ------------------------------------------------------- column reductions
 * dst[c] += sum over rows r of f(r, c), in double: pass 1 gives each chunk of
 * COL_CHUNK rows a partial per column, pass 2 adds the chunks in order. */
#define COL_CHUNK 256
#define COL_TX 32
#define COL_TY 8

template <class F>
__global__ void col_partial_kernel(double *partial, F f, int n, int C) {
  __shared__ double s[COL_TY][COL_TX + 1];
  const int c = blockIdx.x * COL_TX + threadIdx.x, chunk = blockIdx.y;
  const int r0 = chunk * COL_CHUNK, r1 = min(n, r0 + COL_CHUNK);
  double acc = 0.0;
  if (c < C)
    for (int r = r0 + threadIdx.y; r < r1; r += COL_TY) acc += f(r, c);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double t = 0.0;
    for (int y = 0; y < COL_TY; y++) t += s[y][threadIdx.x];
    partial[(size_t)chunk * C + c] = t;
  }
}

__global__ void col_finish_kernel(float *dst, const double *partial, int n_chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double t = 0.0;
  for (int k = 0; k < n_chunks; k++) t += partial[(size_t)k * C + c];
  dst[c] += (float)t;
}

/* Scratch of col_reduce: a double per column per chunk of rows. */
static size_t col_scratch(long n, long C) {
  return n > 0 && C > 0 ? (size_t)((n + COL_CHUNK - 1) / COL_CHUNK) * (size_t)C * sizeof(double)
                        : 0;
}

template <class F>
static int col_reduce(float *dst, F f, int n, int C, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  const int n_chunks = (n + COL_CHUNK - 1) / COL_CHUNK;
  double *partial = NULL;
  TSR_CUDA_SCRATCH(partial, ws, col_scratch(n, C));
  col_partial_kernel<<<dim3((C + COL_TX - 1) / COL_TX, n_chunks), dim3(COL_TX, COL_TY), 0, stream>>>(
      partial, f, n, C);
  TSR_CUDA_LAUNCHED();
  col_finish_kernel<<<(C + 255) / 256, 256, 0, stream>>>(dst, partial, n_chunks, C);
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* ---------------------------------------------------------------- embedding */

__global__ void embedding_fwd_kernel(float *out, const int32_t *tokens, const float *wte,
                                     const float *wpe, int n, int T, int C, int vocab_start,
                                     int vocab_local) {
  GRID_STRIDE_LOOP(i, (long)n * C) {
    const int r = (int)(i / C), c = (int)(i % C);
    const int tok = tokens[r] - vocab_start;
    float o = (tok >= 0 && tok < vocab_local) ? wte[(size_t)tok * C + c] : 0.0f;
    if (wpe) o += wpe[(size_t)(r % T) * C + c];
    out[i] = o;
  }
}

extern "C" int tsr_cuda_embedding_fwd(float *out, const int32_t *tokens, const float *wte,
                                      const float *wpe, int n, int T, int C, int vocab_start,
                                      int vocab_local, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  embedding_fwd_kernel<<<grid_for((long)n * C, TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(
      out, tokens, wte, wpe, n, T, C, vocab_start, vocab_local);
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* Sort key of a row: its local token, or vocab_local (sorted last, skipped) when the
 * token belongs to another rank's vocabulary slice. */
__global__ void embedding_keys_kernel(int *keys, int *rows, const int32_t *tokens, int n,
                                      int vocab_start, int vocab_local) {
  GRID_STRIDE_LOOP(r, n) {
    const int tok = tokens[r] - vocab_start;
    keys[r] = (tok >= 0 && tok < vocab_local) ? tok : vocab_local;
    rows[r] = (int)r;
  }
}

/* Block x = a position in the sorted order; only the first position of each token's run
 * works: it walks the run (rows in increasing order, the sort is stable) and adds each
 * row into dwte, the same additions in the same order as the CPU loop. */
__global__ void embedding_dwte_kernel(float *dwte, const float *dout, const int *keys,
                                      const int *rows, int n, int C, int vocab_local) {
  const int i = blockIdx.x;
  const int key = keys[i];
  if (key == vocab_local || (i > 0 && keys[i - 1] == key)) return;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = dwte[(size_t)key * C + c];
  for (int j = i; j < n && keys[j] == key; j++) acc += dout[(size_t)rows[j] * C + c];
  dwte[(size_t)key * C + c] = acc;
}

__global__ void embedding_dwpe_kernel(float *dwpe, const float *dout, int n, int T, int C) {
  const int npos = n < T ? n : T;
  GRID_STRIDE_LOOP(i, (long)npos * C) {
    const int t = (int)(i / C), c = (int)(i % C);
    float acc = dwpe[i];
    for (int r = t; r < n; r += T) acc += dout[(size_t)r * C + c];
    dwpe[i] = acc;
  }
}

/* Radix-sort key bits for token ids in [0, vocab_local]. */
static int key_bits(long vocab_local) {
  int bits = 1;
  while (bits < 31 && (1L << bits) <= vocab_local) bits++;
  return bits;
}

/* Scratch of the embedding backward: keys and rows, sorted copies, CUB's temporary. */
static int embedding_scratch(long n, long vocab_local, size_t *need, size_t *sort_bytes) {
  *need = *sort_bytes = 0;
  if (n <= 0 || vocab_local <= 0) return 0;
  TSR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, *sort_bytes, (const int *)NULL,
                                                 (int *)NULL, (const int *)NULL, (int *)NULL,
                                                 (int)n, 0, key_bits(vocab_local), (cudaStream_t)0));
  *need = 4 * scratch_round((size_t)n * sizeof(int)) + *sort_bytes;
  return 0;
}

extern "C" int tsr_cuda_embedding_bwd(float *dwte, float *dwpe, const float *dout,
                                      const int32_t *tokens, int n, int T, int C,
                                      int vocab_start, int vocab_local, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  TSR_CUDA_ARG(C <= 65535 * 256);
  if (dwte && vocab_local > 0) {
    const int bits = key_bits(vocab_local);
    size_t sort_bytes = 0, need = 0;
    TSR_CALL(embedding_scratch(n, vocab_local, &need, &sort_bytes));
    const size_t idx_bytes = scratch_round((size_t)n * sizeof(int));
    char *scratch = NULL;
    TSR_CUDA_SCRATCH(scratch, ws, need);
    int *keys = (int *)scratch, *rows = (int *)(scratch + idx_bytes);
    int *keys_sorted = (int *)(scratch + 2 * idx_bytes), *rows_sorted = (int *)(scratch + 3 * idx_bytes);
    embedding_keys_kernel<<<grid_for(n, TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(
        keys, rows, tokens, n, vocab_start, vocab_local);
    TSR_CUDA_LAUNCHED();
    TSR_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch + 4 * idx_bytes, sort_bytes, keys,
                                                   keys_sorted, rows, rows_sorted, n, 0, bits,
                                                   stream));
    embedding_dwte_kernel<<<dim3(n, (C + 255) / 256), 256, 0, stream>>>(
        dwte, dout, keys_sorted, rows_sorted, n, C, vocab_local);
    TSR_CUDA_LAUNCHED();
  }
  if (dwpe) {
    const long npos = n < T ? n : T;
    embedding_dwpe_kernel<<<grid_for(npos * C, TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(
        dwpe, dout, n, T, C);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

/* ------------------------------------------------------------------ RMSNorm */

template <class T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w, int C,
                                   float eps) {
  __shared__ double scratch[32];
  const size_t r = blockIdx.x;
  const T *xr = x + r * C;
  double ss = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double v = to_f32(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float rs = (float)(1.0 / sqrt(ss / C + (double)eps));
  if (threadIdx.x == 0) rstd[r] = rs;
  T *o = out + r * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_f32<T>(to_f32(xr[c]) * rs * to_f32(w[c]));
}

/* dx_i += r (w_i g_i - x_i r^2 <g w, x> / C) */
template <class T>
__global__ void rmsnorm_dx_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd,
                                  int C) {
  __shared__ double scratch[32];
  const size_t r = blockIdx.x;
  const T *xr = x + r * C, *g = dout + r * C;
  double dot = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    dot += (double)to_f32(g[c]) * (double)to_f32(w[c]) * (double)to_f32(xr[c]);
  dot = block_sum(dot, scratch);
  const float rs = rstd[r];
  const float k = (float)(dot / C) * rs * rs;
  T *d = dx + r * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    d[c] = from_f32<T>(to_f32(d[c]) + rs * (to_f32(w[c]) * to_f32(g[c]) - to_f32(xr[c]) * k));
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
static int rmsnorm_fwd(T *out, float *rstd, const T *x, const T *w, int n, int C, float eps,
                       cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  rmsnorm_fwd_kernel<T><<<n, ROW_THREADS, 0, stream>>>(out, rstd, x, w, C, eps);
  TSR_CUDA_LAUNCHED();
  return 0;
}

template <class T>
static int rmsnorm_bwd(T *dx, float *dw, const T *dout, const T *x, const T *w, const float *rstd,
                       int n, int C, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  if (dx) {
    rmsnorm_dx_kernel<T><<<n, ROW_THREADS, 0, stream>>>(dx, dout, x, w, rstd, C);
    TSR_CUDA_LAUNCHED();
  }
  if (dw) TSR_CALL(col_reduce(dw, RmsDw<T>{dout, x, rstd, C}, n, C, ws, stream));
  return 0;
}

extern "C" int tsr_cuda_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w,
                                    int n, int C, float eps, cudaStream_t stream) {
  return rmsnorm_fwd<float>(out, rstd, x, w, n, C, eps, stream);
}
extern "C" int tsr_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                                    const float *w, const float *rstd, int n, int C,
                                    const tsr_cuda_scratch *ws, cudaStream_t stream) {
  return rmsnorm_bwd<float>(dx, dw, dout, x, w, rstd, n, C, ws, stream);
}
extern "C" int tsr_cuda_rmsnorm_fwd_bf16(tsr_bf16 *out, float *rstd, const tsr_bf16 *x,
                                         const tsr_bf16 *w, int n, int C, float eps,
                                         cudaStream_t stream) {
  return rmsnorm_fwd<bf16>((bf16 *)out, rstd, (const bf16 *)x, (const bf16 *)w, n, C, eps, stream);
}
extern "C" int tsr_cuda_rmsnorm_bwd_bf16(tsr_bf16 *dx, float *dw, const tsr_bf16 *dout,
                                         const tsr_bf16 *x, const tsr_bf16 *w, const float *rstd,
                                         int n, int C, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  return rmsnorm_bwd<bf16>((bf16 *)dx, dw, (const bf16 *)dout, (const bf16 *)x, (const bf16 *)w,
                           rstd, n, C, ws, stream);
}

/* ---------------------------------------------------------------- LayerNorm */

__global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd, const float *x,
                                     const float *w, const float *b, int C, float eps) {
  __shared__ double scratch[32];
  const size_t r = blockIdx.x;
  const float *xr = x + r * C;
  double s = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
  s = block_sum(s, scratch);
  const double mu = s / C;
  double var = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double d = xr[c] - mu;
    var += d * d;
  }
  var = block_sum(var, scratch);
  const float m = (float)mu, rs = (float)(1.0 / sqrt(var / C + (double)eps));
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  float *o = out + r * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (xr[c] - m) * rs * w[c] + b[c];
}

/* xhat = (x - mean) r;  dx += r (g w - mean(g w) - xhat mean(g w xhat)) */
__global__ void layernorm_dx_kernel(float *dx, const float *dout, const float *x, const float *w,
                                    const float *mean, const float *rstd, int C) {
  __shared__ double scratch[32];
  const size_t r = blockIdx.x;
  const float *xr = x + r * C, *g = dout + r * C;
  const float m = mean[r], rs = rstd[r];
  double sum_gw = 0.0, sum_gwx = 0.0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float gw = g[c] * w[c];
    sum_gw += gw;
    sum_gwx += (double)gw * ((xr[c] - m) * rs);
  }
  sum_gw = block_sum(sum_gw, scratch);
  sum_gwx = block_sum(sum_gwx, scratch);
  const float a = (float)(sum_gw / C), bb = (float)(sum_gwx / C);
  float *d = dx + r * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    d[c] += rs * (g[c] * w[c] - a - (xr[c] - m) * rs * bb);
}

struct LnDw {
  const float *g, *x, *mean, *rstd;
  int C;
  __device__ double operator()(int r, int c) const {
    const size_t i = (size_t)r * C + c;
    return (double)(g[i] * ((x[i] - mean[r]) * rstd[r]));
  }
};
template <class T> struct ColumnOf {
  const T *g;
  int C;
  __device__ double operator()(int r, int c) const { return (double)to_f32(g[(size_t)r * C + c]); }
};

extern "C" int tsr_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *x,
                                      const float *w, const float *b, int n, int C, float eps,
                                      cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  layernorm_fwd_kernel<<<n, ROW_THREADS, 0, stream>>>(out, mean, rstd, x, w, b, C, eps);
  TSR_CUDA_LAUNCHED();
  return 0;
}

extern "C" int tsr_cuda_layernorm_bwd(float *dx, float *dw, float *db, const float *dout,
                                      const float *x, const float *w, const float *mean,
                                      const float *rstd, int n, int C, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return 0;
  if (dx) {
    layernorm_dx_kernel<<<n, ROW_THREADS, 0, stream>>>(dx, dout, x, w, mean, rstd, C);
    TSR_CUDA_LAUNCHED();
  }
  if (dw) TSR_CALL(col_reduce(dw, LnDw{dout, x, mean, rstd, C}, n, C, ws, stream));
  if (db) TSR_CALL(col_reduce(db, ColumnOf<float>{dout, C}, n, C, ws, stream));
  return 0;
}

/* Column sums for the bias gradient of the GEMMs (gemm.cu). */
int tsr_cuda_colsum_(float *dst, const void *src, tsr_cuda_dtype type, int n, int C,
                     const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (type == TSR_CUDA_BF16) return col_reduce(dst, ColumnOf<bf16>{(const bf16 *)src, C}, n, C, ws, stream);
  return col_reduce(dst, ColumnOf<float>{(const float *)src, C}, n, C, ws, stream);
}

/* --------------------------------------------------------------------- RoPE
 * One thread per (row, pair i): the angle pos * theta^(-2i/hd) and its cos/sin are
 * formed in double (as on the CPU: the phase at long context needs it), then applied to
 * every head of the row.  dir = -1 rotates backwards (the gradient). */
template <class T>
__global__ void rope_kernel(T *x, int n, int T_, int n_heads, int head_dim, int stride,
                            float theta, int dir) {
  const int half = head_dim / 2;
  GRID_STRIDE_LOOP(idx, (long)n * half) {
    const int r = (int)(idx / half), i = (int)(idx % half);
    const double inv_freq = pow((double)theta, -2.0 * i / head_dim);
    double sn_d, cs_d;
    sincos((double)(r % T_) * inv_freq, &sn_d, &cs_d);
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
static int rope(T *x, int n, int T_, int n_heads, int head_dim, int stride, float theta, int dir,
                cudaStream_t stream) {
  const long work = (long)n * (head_dim / 2);
  if (work <= 0 || n_heads <= 0) return 0;
  rope_kernel<T><<<grid_for(work, TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(
      x, n, T_, n_heads, head_dim, stride, theta, dir);
  TSR_CUDA_LAUNCHED();
  return 0;
}

extern "C" int tsr_cuda_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride,
                                 float theta, cudaStream_t stream) {
  return rope<float>(x, n, T, n_heads, head_dim, stride, theta, +1, stream);
}
extern "C" int tsr_cuda_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride,
                                 float theta, cudaStream_t stream) {
  return rope<float>(dx, n, T, n_heads, head_dim, stride, theta, -1, stream);
}
extern "C" int tsr_cuda_rope_fwd_bf16(tsr_bf16 *x, int n, int T, int n_heads, int head_dim,
                                      int stride, float theta, cudaStream_t stream) {
  return rope<bf16>((bf16 *)x, n, T, n_heads, head_dim, stride, theta, +1, stream);
}
extern "C" int tsr_cuda_rope_bwd_bf16(tsr_bf16 *dx, int n, int T, int n_heads, int head_dim,
                                      int stride, float theta, cudaStream_t stream) {
  return rope<bf16>((bf16 *)dx, n, T, n_heads, head_dim, stride, theta, -1, stream);
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

template <class T> __global__ void gelu_bwd_kernel(T *dx, const T *dout, const T *x, long n) {
  GRID_STRIDE_LOOP(i, n) {
    const float xi = to_f32(x[i]);
    const float th = tanhf(GELU_C * (xi + GELU_A * xi * xi * xi));
    const float du = GELU_C * (1.0f + 3.0f * GELU_A * xi * xi);
    dx[i] = from_f32<T>(to_f32(dout[i]) * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du));
  }
}

#define LAUNCH_ELEM(kernel, n_items, ...)                                                   \
  do {                                                                                      \
    if ((n_items) <= 0) return 0;                                                           \
    kernel<<<grid_for((n_items), TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(__VA_ARGS__); \
    TSR_CUDA_LAUNCHED();                                                                    \
    return 0;                                                                               \
  } while (0)

extern "C" int tsr_cuda_swiglu_fwd(float *out, const float *gate_up, int n, int F,
                                   cudaStream_t stream) {
  LAUNCH_ELEM(swiglu_fwd_kernel<float>, (long)n * F, out, gate_up, n, F);
}
extern "C" int tsr_cuda_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up,
                                   int n, int F, cudaStream_t stream) {
  LAUNCH_ELEM(swiglu_bwd_kernel<float>, (long)n * F, dgate_up, dout, gate_up, n, F);
}
extern "C" int tsr_cuda_gelu_fwd(float *out, const float *x, int n_elem, cudaStream_t stream) {
  LAUNCH_ELEM(gelu_fwd_kernel<float>, (long)n_elem, out, x, (long)n_elem);
}
extern "C" int tsr_cuda_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem,
                                 cudaStream_t stream) {
  LAUNCH_ELEM(gelu_bwd_kernel<float>, (long)n_elem, dx, dout, x, (long)n_elem);
}
extern "C" int tsr_cuda_swiglu_fwd_bf16(tsr_bf16 *out, const tsr_bf16 *gate_up, int n, int F,
                                        cudaStream_t stream) {
  LAUNCH_ELEM(swiglu_fwd_kernel<bf16>, (long)n * F, (bf16 *)out, (const bf16 *)gate_up, n, F);
}
extern "C" int tsr_cuda_swiglu_bwd_bf16(tsr_bf16 *dgate_up, const tsr_bf16 *dout,
                                        const tsr_bf16 *gate_up, int n, int F,
                                        cudaStream_t stream) {
  LAUNCH_ELEM(swiglu_bwd_kernel<bf16>, (long)n * F, (bf16 *)dgate_up, (const bf16 *)dout,
              (const bf16 *)gate_up, n, F);
}
extern "C" int tsr_cuda_gelu_fwd_bf16(tsr_bf16 *out, const tsr_bf16 *x, int n_elem,
                                      cudaStream_t stream) {
  LAUNCH_ELEM(gelu_fwd_kernel<bf16>, (long)n_elem, (bf16 *)out, (const bf16 *)x, (long)n_elem);
}
extern "C" int tsr_cuda_gelu_bwd_bf16(tsr_bf16 *dx, const tsr_bf16 *dout, const tsr_bf16 *x,
                                      int n_elem, cudaStream_t stream) {
  LAUNCH_ELEM(gelu_bwd_kernel<bf16>, (long)n_elem, (bf16 *)dx, (const bf16 *)dout,
              (const bf16 *)x, (long)n_elem);
}

/* GELU of a buffer in either storage type (the unfused path of the bf16 GEMM). */
int tsr_cuda_gelu_any_(void *out, const void *x, tsr_cuda_dtype type, long n,
                       cudaStream_t stream) {
  if (type == TSR_CUDA_BF16)
    LAUNCH_ELEM(gelu_fwd_kernel<bf16>, n, (bf16 *)out, (const bf16 *)x, n);
  LAUNCH_ELEM(gelu_fwd_kernel<float>, n, (float *)out, (const float *)x, n);
}

/* ------------------------------------------------------------- elementwise */

template <class T> __global__ void add_kernel(T *out, const T *a, const T *b, long n) {
  GRID_STRIDE_LOOP(i, n) out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}
template <class T> __global__ void acc_kernel(T *out, const T *a, long n) {
  GRID_STRIDE_LOOP(i, n) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(a[i]));
}
/* x rounded to the storage precision P (TSR_PREC_*; fp32 leaves it as it is) */
template <int P> __device__ __forceinline__ float round_to(float x) {
  return P == TSR_PREC_BF16 ? tsr_round_bf16(x) : P == TSR_PREC_FP16 ? tsr_round_fp16(x) : x;
}
/* out = r(x + r(y)), r = round_to<P> */
template <int P> __global__ void residual_kernel(float *out, const float *x, const float *y, long n) {
  GRID_STRIDE_LOOP(i, n) out[i] = round_to<P>(x[i] + round_to<P>(y[i]));
}
__global__ void scale_kernel(float *x, float s, long n) {
  GRID_STRIDE_LOOP(i, n) x[i] *= s;
}

extern "C" int tsr_cuda_add(float *out, const float *a, const float *b, long n_elem,
                            cudaStream_t stream) {
  LAUNCH_ELEM(add_kernel<float>, n_elem, out, a, b, n_elem);
}
extern "C" int tsr_cuda_acc(float *out, const float *a, long n_elem, cudaStream_t stream) {
  LAUNCH_ELEM(acc_kernel<float>, n_elem, out, a, n_elem);
}
extern "C" int tsr_cuda_residual(float *out, const float *x, const float *y, long n_elem,
                                 tsr_prec prec, cudaStream_t stream) {
  TSR_CUDA_ARG(prec == TSR_PREC_FP32 || prec == TSR_PREC_BF16 || prec == TSR_PREC_FP16);
  if (prec == TSR_PREC_BF16) LAUNCH_ELEM(residual_kernel<TSR_PREC_BF16>, n_elem, out, x, y, n_elem);
  if (prec == TSR_PREC_FP16) LAUNCH_ELEM(residual_kernel<TSR_PREC_FP16>, n_elem, out, x, y, n_elem);
  LAUNCH_ELEM(residual_kernel<TSR_PREC_FP32>, n_elem, out, x, y, n_elem);
}
extern "C" int tsr_cuda_scale(float *x, float s, long n_elem, cudaStream_t stream) {
  LAUNCH_ELEM(scale_kernel, n_elem, x, s, n_elem);
}
extern "C" int tsr_cuda_add_bf16(tsr_bf16 *out, const tsr_bf16 *a, const tsr_bf16 *b,
                                 long n_elem, cudaStream_t stream) {
  LAUNCH_ELEM(add_kernel<bf16>, n_elem, (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n_elem);
}
extern "C" int tsr_cuda_acc_bf16(tsr_bf16 *out, const tsr_bf16 *a, long n_elem,
                                 cudaStream_t stream) {
  LAUNCH_ELEM(acc_kernel<bf16>, n_elem, (bf16 *)out, (const bf16 *)a, n_elem);
}

/* -------------------------------------------------------------------- AdamW */

/* OUT: what the refreshed compute copy out[] gets (TSR_PREC_*; -1: no out). */
template <int OUT>
__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, long n, float beta1,
                             float beta2, float eps, float decay, float step_size, float bc2_sqrt,
                             float one_m_b1, float one_m_b2, float grad_scale, float *out) {
  GRID_STRIDE_LOOP(i, n) {
    const float gi = g[i] * grad_scale;
    const float pi = p[i] * decay;
    const float mi = m[i] * beta1 + one_m_b1 * gi;
    const float vi = v[i] * beta2 + one_m_b2 * gi * gi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    const float pn = pi - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = pn;
    if (OUT >= 0) out[i] = round_to<OUT>(pn);
  }
}

extern "C" int tsr_cuda_adamw(float *p, float *m, float *v, const float *g, long n, float lr,
                              float beta1, float beta2, float eps, float weight_decay, long t,
                              float grad_scale, float *out, tsr_prec out_prec,
                              cudaStream_t stream) {
  const tsr_adamw_scalars s = tsr_ops_adamw_scalars(lr, beta1, beta2, weight_decay, t);
#define ADAMW_ARGS                                                                             \
  p, m, v, g, n, beta1, beta2, eps, s.decay, s.step_size, s.bc2_sqrt, s.one_m_b1, s.one_m_b2, \
      grad_scale, out
  if (!out) LAUNCH_ELEM(adamw_kernel<-1>, n, ADAMW_ARGS);
  TSR_CUDA_ARG(out_prec == TSR_PREC_FP32 || out_prec == TSR_PREC_BF16 ||
               out_prec == TSR_PREC_FP16);
  if (out_prec == TSR_PREC_BF16) LAUNCH_ELEM(adamw_kernel<TSR_PREC_BF16>, n, ADAMW_ARGS);
  if (out_prec == TSR_PREC_FP16) LAUNCH_ELEM(adamw_kernel<TSR_PREC_FP16>, n, ADAMW_ARGS);
  LAUNCH_ELEM(adamw_kernel<TSR_PREC_FP32>, n, ADAMW_ARGS);
#undef ADAMW_ARGS
}

/* ------------------------------------------------------ casts, reductions */

__global__ void round_bf16_kernel(float *dst, const float *src, long n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = tsr_round_bf16(src[i]);
}
__global__ void round_fp16_kernel(float *dst, const float *src, long n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = tsr_round_fp16(src[i]);
}
__global__ void cast_f32_bf16_kernel(uint16_t *dst, const float *src, long n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = (uint16_t)(__float_as_uint(tsr_round_bf16(src[i])) >> 16);
}
__global__ void cast_bf16_f32_kernel(float *dst, const uint16_t *src, long n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

/* Item i of a rows x cols matrix: row i / cols, column i % cols (one thread each). */
__global__ void cast_rows_f32_bf16_kernel(uint16_t *dst, const float *src, long rows, int cols,
                                          long src_stride) {
  GRID_STRIDE_LOOP(i, rows * cols) {
    const long r = i / cols, c = i - r * cols;
    dst[i] = (uint16_t)(__float_as_uint(tsr_round_bf16(src[r * src_stride + c])) >> 16);
  }
}
__global__ void cast_rows_bf16_f32_kernel(float *dst, long dst_stride, const uint16_t *src,
                                          long rows, int cols, int accumulate) {
  GRID_STRIDE_LOOP(i, rows * cols) {
    const long r = i / cols, c = i - r * cols;
    const float x = __uint_as_float((uint32_t)src[i] << 16);
    float *d = dst + r * dst_stride + c;
    *d = accumulate ? *d + x : x;
  }
}

extern "C" int tsr_cuda_round_bf16(float *dst, const float *src, long n_elem,
                                   cudaStream_t stream) {
  LAUNCH_ELEM(round_bf16_kernel, n_elem, dst, src, n_elem);
}
extern "C" int tsr_cuda_round_fp16(float *dst, const float *src, long n_elem,
                                   cudaStream_t stream) {
  LAUNCH_ELEM(round_fp16_kernel, n_elem, dst, src, n_elem);
}
extern "C" int tsr_cuda_cast_f32_bf16(tsr_bf16 *dst, const float *src, long n_elem,
                                      cudaStream_t stream) {
  LAUNCH_ELEM(cast_f32_bf16_kernel, n_elem, dst, src, n_elem);
}
extern "C" int tsr_cuda_cast_bf16_f32(float *dst, const tsr_bf16 *src, long n_elem,
                                      cudaStream_t stream) {
  LAUNCH_ELEM(cast_bf16_f32_kernel, n_elem, dst, src, n_elem);
}
extern "C" int tsr_cuda_cast_rows_f32_bf16(tsr_bf16 *dst, const float *src, long rows, int cols,
                                           long src_stride, cudaStream_t stream) {
  TSR_CUDA_ARG(cols >= 0 && src_stride >= cols);
  LAUNCH_ELEM(cast_rows_f32_bf16_kernel, rows * cols, dst, src, rows, cols, src_stride);
}
extern "C" int tsr_cuda_cast_rows_bf16_f32(float *dst, long dst_stride, const tsr_bf16 *src,
                                           long rows, int cols, int accumulate,
                                           cudaStream_t stream) {
  TSR_CUDA_ARG(cols >= 0 && dst_stride >= cols);
  LAUNCH_ELEM(cast_rows_bf16_f32_kernel, rows * cols, dst, dst_stride, src, rows, cols,
              accumulate);
}

/* Sum of squares: block b owns the contiguous chunk [b*chunk, (b+1)*chunk); the block
 * count depends on n only (so the result does not depend on the GPU model). */
#define SUMSQ_MAX_BLOCKS 1024
#define SUMSQ_MIN_CHUNK 8192

__global__ void sumsq_partial_kernel(double *partial, const float *x, long n, long chunk) {
  __shared__ double scratch[32];
  const long i0 = blockIdx.x * chunk, i1 = min(n, i0 + chunk);
  double acc = 0.0;
  for (long i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc += (double)x[i] * x[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_doubles_kernel(double *out, const double *x, long n) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (long i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}

int tsr_cuda_sum_doubles_(double *out, const double *x, long n, cudaStream_t stream) {
  sum_doubles_kernel<<<1, 1024, 0, stream>>>(out, x, n);
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* Scratch of tsr_cuda_sumsq: a double per block. */
static size_t sumsq_scratch(long n_elem) {
  if (n_elem <= 0) return 0;
  long blocks = (n_elem + SUMSQ_MIN_CHUNK - 1) / SUMSQ_MIN_CHUNK;
  if (blocks > SUMSQ_MAX_BLOCKS) blocks = SUMSQ_MAX_BLOCKS;
  return (size_t)blocks * sizeof(double);
}

extern "C" int tsr_cuda_sumsq(double *out, const float *x, long n_elem, const tsr_cuda_scratch *ws,
                              cudaStream_t stream) {
  if (n_elem <= 0) {
    TSR_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return 0;
  }
  const long blocks = (long)(sumsq_scratch(n_elem) / sizeof(double));
  const long chunk = (n_elem + blocks - 1) / blocks;
  double *partial = NULL;
  TSR_CUDA_SCRATCH(partial, ws, sumsq_scratch(n_elem));
  sumsq_partial_kernel<<<(unsigned)blocks, TSR_CUDA_THREADS, 0, stream>>>(partial, x, n_elem, chunk);
  TSR_CUDA_LAUNCHED();
  TSR_CALL(tsr_cuda_sum_doubles_(out, partial, blocks, stream));
  return 0;
}

__global__ void set_int_kernel(int *out, int v) { *out = v; }
__global__ void all_finite_kernel(int *out, const float *x, long n) {
  GRID_STRIDE_LOOP(i, n) {
    if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) *out = 0; /* benign race: all write 0 */
  }
}

extern "C" int tsr_cuda_all_finite(int *out, const float *x, long n_elem, cudaStream_t stream) {
  set_int_kernel<<<1, 1, 0, stream>>>(out, 1);
  TSR_CUDA_LAUNCHED();
  if (n_elem <= 0) return 0;
  all_finite_kernel<<<grid_for(n_elem, TSR_CUDA_THREADS), TSR_CUDA_THREADS, 0, stream>>>(out, x, n_elem);
  TSR_CUDA_LAUNCHED();
  return 0;
}

__global__ void add_quotient_kernel(double *acc, const double *x, double div) { *acc += *x / div; }

extern "C" int tsr_cuda_add_quotient(double *acc, const double *x, double div,
                                     cudaStream_t stream) {
  TSR_CUDA_ARG(acc && x && div != 0.0);
  add_quotient_kernel<<<1, 1, 0, stream>>>(acc, x, div);
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* ---- scratch sizes ---- */

size_t tsr_cuda_xent_scratch_(long n);          /* xent.cu */
size_t tsr_cuda_attention_scratch_(long bht, long part); /* attention.cu */

extern "C" int tsr_cuda_scratch_bytes(const tsr_cuda_scratch_dims *d, size_t *bytes) {
  TSR_CUDA_ARG(d && bytes && d->rows >= 0 && d->cols >= 0 && d->vocab_local >= 0 &&
               d->attn_bht >= 0 && d->sumsq_elems >= 0 && d->attn_part >= 0);
  size_t emb = 0, sort_bytes = 0;
  TSR_CALL(embedding_scratch(d->rows, d->vocab_local, &emb, &sort_bytes));
  const size_t need[] = {col_scratch(d->rows, d->cols), emb, tsr_cuda_xent_scratch_(d->rows),
                         tsr_cuda_attention_scratch_(d->attn_bht, d->attn_part), sumsq_scratch(d->sumsq_elems)};
  *bytes = 0;
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
    if (need[i] > *bytes) *bytes = need[i];
  return 0;
}
