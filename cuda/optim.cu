/* optim.cu — the optimizer's ops: AdamW over an fp32 shard (refreshing the compute copy in
 * the same pass, stored as its type), and the sums of squares of the gradient clipping.
 *
 * Sums of squares: per range, in the order of ops/sumsq_order.h (the CPU's and the host's
 * too, so the gradient norm has the same bits everywhere).  Every range lands in its own
 * scalar; the host fetches TSR_CUDA_RESULTS of them at once and adds them in range order,
 * as the CPU does. */
#include "cuda_common.cuh"
#include "ops/sumsq_order.h"

extern "C" {
#include "backend.h"
}

/* -------------------------------------------------------------------- AdamW */

/* O: the type the refreshed compute copy out[] is stored as (out NULL: none). */
template <class O>
__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, long n, float beta1,
                             float beta2, float eps, float decay, float step_size, float bc2_sqrt,
                             float one_m_b1, float one_m_b2, float grad_scale, O *out) {
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
    if (out) out[i] = from_f32<O>(pn);
  }
}

template <class O>
static int adamw_run(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, long t, float grad_scale, O *out) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(p && m && v && g && t >= 1);
  const tsr_adamw_scalars s = tsr_ops_adamw_scalars(lr, beta1, beta2, weight_decay, t);
  LAUNCH_ELEM(adamw_kernel<O>, n, tsr_cuda_ctx.stream, p, m, v, g, n, beta1, beta2, eps, s.decay,
              s.step_size, s.bc2_sqrt, s.one_m_b1, s.one_m_b2, grad_scale, out);
  return 0;
}

extern "C" void tsr_cuda_adamw(float *p, float *m, float *v, const float *g, long n, float lr,
                              float beta1, float beta2, float eps, float weight_decay, long t,
                              float grad_scale, void *out, tsr_dtype out_dt) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(out ? out_dt : TSR_F32, O,
                adamw_run<O>(p, m, v, g, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                             (O *)out));
}

/* ---------------------------------------------------------- sums of squares */

/* The order of ops/sumsq_order.h: a block of TSR_SUMSQ_LANES threads per chunk, thread t
 * the lane t, the lanes combined by the stated tree in shared memory; the chunks' sums are
 * summed again the same way, level after level, until one is left. */
__device__ __forceinline__ double sumsq_term(float v) { return (double)v * (double)v; }
__device__ __forceinline__ double sumsq_term(double v) { return v; }

template <class T>
__global__ void sumsq_chunk_kernel(double *out, const T *x, long n) {
  __shared__ double acc[TSR_SUMSQ_LANES];
  const long i0 = (long)blockIdx.x * TSR_SUMSQ_CHUNK;
  const long k = n - i0 < TSR_SUMSQ_CHUNK ? n - i0 : TSR_SUMSQ_CHUNK;
  const int t = threadIdx.x;
  double s = 0.0;
  for (long j = t; j < k; j += TSR_SUMSQ_LANES) s += sumsq_term(x[i0 + j]);
  acc[t] = s;
  __syncthreads();
  for (int h = TSR_SUMSQ_LANES / 2; h >= 1; h /= 2) {
    if (t < h) acc[t] += acc[t + h];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = acc[0];
}

static long sumsq_chunks(long n) { return (n + TSR_SUMSQ_CHUNK - 1) / TSR_SUMSQ_CHUNK; }

/* Doubles of scratch for a range of n: the chunk sums of every level but the last. */
static long sumsq_scratch(long n) {
  long total = 0;
  for (long m = sumsq_chunks(n); m > 1; m = sumsq_chunks(m)) total += m;
  return total;
}

extern "C" int tsr_cuda_scratch_optim(const tsr_ops_shapes *s, size_t *bytes) {
  *bytes = s->sumsq_elems > 0 ? (size_t)sumsq_scratch(s->sumsq_elems) * sizeof(double) : 0;
  return 0;
}

/* *out (a device double) = the sum of squares of x[0, n) */
static int sumsq_into(double *out, const float *x, long n) {
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  if (n <= 0) {
    TSR_CUDA_CALL(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return 0;
  }
  long m = sumsq_chunks(n);
  if (m == 1) {
    sumsq_chunk_kernel<float><<<1, TSR_SUMSQ_LANES, 0, stream>>>(out, x, n);
    TSR_CUDA_LAUNCHED();
    return 0;
  }
  double *level = NULL;
  TSR_CUDA_SCRATCH(level, (size_t)sumsq_scratch(n) * sizeof(double));
  sumsq_chunk_kernel<float><<<(unsigned)m, TSR_SUMSQ_LANES, 0, stream>>>(level, x, n);
  TSR_CUDA_LAUNCHED();
  for (long next; m > 1; level += m, m = next) { /* the level's m sums into the next's */
    next = sumsq_chunks(m);
    sumsq_chunk_kernel<double><<<(unsigned)next, TSR_SUMSQ_LANES, 0, stream>>>(
        next == 1 ? out : level + m, level, m);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

/* The ranges k0 .. k0 + k - 1 into the result scalars, fetched: the host's k doubles */
static int sumsq_batch(double *host, const float *x, const int64_t *r, int k) {
  tsr_cuda_context *c = &tsr_cuda_ctx;
  for (int i = 0; i < k; i++) {
    TSR_CUDA_ARG(r[2 * i] <= r[2 * i + 1]);
    TSR_CALL(sumsq_into(c->result + i, x + r[2 * i], (long)(r[2 * i + 1] - r[2 * i])));
  }
  TSR_CUDA_CALL(cudaMemcpyAsync(host, c->result, (size_t)k * sizeof(double),
                                 cudaMemcpyDeviceToHost, c->stream));
  TSR_CUDA_CALL(cudaStreamSynchronize(c->stream));
  return 0;
}

extern "C" double tsr_cuda_sumsq_ranges(const float *x, const int64_t *r, int n_ranges) {
  if (tsr_cuda_ctx.failed) return NAN;
  double s = 0.0, h[TSR_CUDA_RESULTS];
  for (int k0 = 0; k0 < n_ranges; k0 += TSR_CUDA_RESULTS) {
    const int k = n_ranges - k0 < TSR_CUDA_RESULTS ? n_ranges - k0 : TSR_CUDA_RESULTS;
    TSR_CUDA_RUN(sumsq_batch(h, x, r + 2 * k0, k));
    if (tsr_cuda_ctx.failed) return NAN;
    for (int i = 0; i < k; i++) s += h[i];
  }
  return s;
}
