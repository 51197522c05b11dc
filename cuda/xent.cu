/* xent.cu — cross-entropy on the LM head's logits (fp32, bf16 or fp16), fused with its
 * gradient: the single-rank form, the four vocab-parallel passes of ops_list.h, and
 * xent_head, the single-rank form with the LM head's GEMMs around it per chunk.  One
 * block per row: the row's max in fp32, sums of exp in double, as on the CPU.  The loss
 * is summed into a device double (op memory) on the stream: row losses go to scratch and
 * one block sums them in a fixed order and adds the sum / div, so the host reads the
 * loss once per step and a rerun gives the same bits. */
#include "cuda_common.cuh"

extern "C" {
#include "backend.h"
}

#define XENT_THREADS 512

/* Loss of row r into row_loss[r]; with grad the row is overwritten by
 * dloss * (softmax - onehot).  A target outside [0, V) is ignored: zero loss and a zero
 * gradient row. */
template <class T>
__global__ void xent_row_kernel(double *row_loss, T *logits, const int32_t *targets, int V,
                                float dloss, int grad) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const size_t r = blockIdx.x;
  T *z = logits + r * V;
  const int target = targets[r];
  if (target < 0 || target >= V) {
    if (grad)
      for (int j = threadIdx.x; j < V; j += blockDim.x) z[j] = from_f32<T>(0.0f);
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  const float zt = to_f32(z[target]);
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_f32(z[j]));
  m = block_max(m, fscratch);
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(to_f32(z[j]) - m);
  sum = block_sum(sum, dscratch); /* its barriers also order every read above before the writes */
  if (threadIdx.x == 0) row_loss[r] = log(sum) + (double)m - (double)zt;
  if (grad) {
    const float f = (float)(dloss / sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      float gj = expf(to_f32(z[j]) - m) * f;
      if (j == target) gj -= dloss;
      z[j] = from_f32<T>(gj);
    }
  }
}

extern "C" int tsr_cuda_scratch_crossent(const tsr_ops_shapes *s, size_t *bytes) {
  *bytes = s->rows > 0 ? (size_t)s->rows * sizeof(double) : 0;
  return 0;
}

template <class T>
static int fused(double *loss, double div, T *logits, const int32_t *targets, int n, int V,
                 float dloss, int grad) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(loss && div != 0.0 && V > 0);
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  double *row_loss = NULL;
  TSR_CUDA_SCRATCH(row_loss, (size_t)n * sizeof(double));
  xent_row_kernel<T><<<n, XENT_THREADS, 0, stream>>>(row_loss, logits, targets, V, dloss, grad);
  TSR_CUDA_LAUNCHED();
  sum_doubles_kernel<1><<<1, 1024, 0, stream>>>(loss, row_loss, n, div);
  TSR_CUDA_LAUNCHED();
  return 0;
}

extern "C" void tsr_cuda_xent(tsr_dtype dt, double *loss, double div, void *logits,
                             const int32_t *targets, int n, int V, float dloss, int grad) {
  TSR_CUDA_SKIP();
  tsr_cuda_prof_note(0, "%s %d x %d%s", tsr_dtype_name(dt), n, V, grad ? " +grad" : "");
  TSR_CUDA_DTYPE(dt, T, fused<T>(loss, div, (T *)logits, targets, n, V, dloss, grad));
}

/* ---- vocab-parallel passes ---- */

template <class T>
__global__ void xent_stats_kernel(double *row_max, double *target_logit, const T *logits,
                                  const int32_t *targets, int V, int vocab_start) {
  __shared__ float scratch[32];
  const size_t r = blockIdx.x;
  const T *z = logits + r * V;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, to_f32(z[j]));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) {
    row_max[r] = m;
    const int t = targets[r] - vocab_start;
    target_logit[r] = (t >= 0 && t < V) ? (double)to_f32(z[t]) : 0.0;
  }
}

template <class T>
__global__ void xent_sumexp_kernel(double *sumexp, const T *logits, const double *row_max, int V) {
  __shared__ double scratch[32];
  const size_t r = blockIdx.x;
  const T *z = logits + r * V;
  const float m = (float)row_max[r];
  double sum = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(to_f32(z[j]) - m);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) sumexp[r] = sum;
}

/* loss += (sum over rows of log sumexp + max - target logit) / div, one block */
__global__ void xent_rows_kernel(double *loss, double div, const double *row_max,
                                 const double *sumexp, const double *target_logit, int n) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int r = threadIdx.x; r < n; r += blockDim.x)
    s += log(sumexp[r]) + row_max[r] - target_logit[r];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) loss[0] += s / div;
}

template <class T>
__global__ void xent_grad_kernel(T *logits, const int32_t *targets, const double *row_max,
                                 const double *sumexp, int V, int vocab_start, float dloss) {
  const size_t r = blockIdx.x;
  T *z = logits + r * V;
  const float m = (float)row_max[r];
  const float f = (float)(dloss / sumexp[r]);
  const int t = targets[r] - vocab_start;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float gj = expf(to_f32(z[j]) - m) * f;
    if (j == t) gj -= dloss;
    z[j] = from_f32<T>(gj);
  }
}

template <class T>
static int local_stats(double *row_max, double *target_logit, const T *logits,
                       const int32_t *targets, int n, int V, int vocab_start) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(V > 0);
  xent_stats_kernel<T><<<n, XENT_THREADS, 0, tsr_cuda_ctx.stream>>>(row_max, target_logit, logits,
                                                                   targets, V, vocab_start);
  TSR_CUDA_LAUNCHED();
  return 0;
}
template <class T>
static int local_sumexp(double *sumexp, const T *logits, const double *row_max, int n, int V) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(V > 0);
  xent_sumexp_kernel<T><<<n, XENT_THREADS, 0, tsr_cuda_ctx.stream>>>(sumexp, logits, row_max, V);
  TSR_CUDA_LAUNCHED();
  return 0;
}
static int rows_loss(double *loss, double div, const double *row_max, const double *sumexp,
                     const double *target_logit, int n) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(loss && div != 0.0);
  xent_rows_kernel<<<1, 1024, 0, tsr_cuda_ctx.stream>>>(loss, div, row_max, sumexp, target_logit,
                                                       n);
  TSR_CUDA_LAUNCHED();
  return 0;
}
template <class T>
static int grad_pass(T *logits, const int32_t *targets, const double *row_max,
                     const double *sumexp, int n, int V, int vocab_start, float dloss) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(V > 0);
  xent_grad_kernel<T><<<n, XENT_THREADS, 0, tsr_cuda_ctx.stream>>>(logits, targets, row_max,
                                                                  sumexp, V, vocab_start, dloss);
  TSR_CUDA_LAUNCHED();
  return 0;
}

extern "C" void tsr_cuda_xent_local_stats(tsr_dtype dt, double *row_max, double *target_logit,
                                         const void *logits, const int32_t *targets, int n, int V,
                                         int vocab_start) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T,
                local_stats<T>(row_max, target_logit, (const T *)logits, targets, n, V,
                               vocab_start));
}
extern "C" void tsr_cuda_xent_local_sumexp(tsr_dtype dt, double *sumexp, const void *logits,
                                          const double *row_max, int n, int V) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T, local_sumexp<T>(sumexp, (const T *)logits, row_max, n, V));
}
extern "C" void tsr_cuda_xent_rows(double *loss, double div, const double *row_max,
                                  const double *sumexp, const double *target_logit, int n) {
  TSR_CUDA_SKIP();
  TSR_CUDA_RUN(rows_loss(loss, div, row_max, sumexp, target_logit, n));
}
extern "C" void tsr_cuda_xent_grad(tsr_dtype dt, void *logits, const int32_t *targets,
                                  const double *row_max, const double *sumexp, int n, int V,
                                  int vocab_start, float dloss) {
  TSR_CUDA_SKIP();
  TSR_CUDA_DTYPE(dt, T,
                grad_pass<T>((T *)logits, targets, row_max, sumexp, n, V, vocab_start, dloss));
}

/* ---- xent_head: per chunk of rows, the logits by cuBLASLt (gemm.cu) into the caller's
 * scratch, the rows by xent's kernel (row losses at their rows of the device scratch),
 * the gradient's GEMMs; the loss is then summed as xent sums it, in one block. ---- */

template <class T>
static int head_fused(tsr_dtype dt, double *loss, double div, void *dx, float *dw, const void *x,
                      const void *w, const int32_t *targets, void *scratch, int n, int C, int V,
                      int chunk, float dloss) {
  if (n <= 0) return 0;
  TSR_CUDA_ARG(x && w && targets && scratch && C > 0 && V > 0 && (!loss || div != 0.0));
  if (chunk <= 0 || chunk > n) chunk = n;
  const int grad = dx || dw;
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  double *row_loss = NULL;
  TSR_CUDA_SCRATCH(row_loss, (size_t)n * sizeof(double));
  for (int r0 = 0; r0 < n; r0 += chunk) {
    const int rows = n - r0 < chunk ? n - r0 : chunk;
    const T *xc = (const T *)x + (size_t)r0 * C;
    TSR_CALL(tsr_cuda_linear_fwd(dt, scratch, xc, w, NULL, rows, C, V));
    xent_row_kernel<T><<<rows, XENT_THREADS, 0, stream>>>(row_loss + r0, (T *)scratch,
                                                           targets + r0, V, dloss, grad);
    TSR_CUDA_LAUNCHED();
    if (grad)
      TSR_CALL(tsr_cuda_linear_bwd(dt, dx ? (T *)dx + (size_t)r0 * C : NULL, dw, NULL, scratch,
                                   xc, w, NULL, rows, C, V));
  }
  if (loss) {
    sum_doubles_kernel<1><<<1, 1024, 0, stream>>>(loss, row_loss, n, div);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

extern "C" void tsr_cuda_xent_head(tsr_dtype dt, double *acc, double div, void *dx, float *dw,
                                  const void *x, const void *w, const int32_t *targets,
                                  void *scratch, int n, int C, int V, int chunk, float dloss) {
  TSR_CUDA_SKIP();
  const double flops = (2.0 + (dx ? 2.0 : 0.0) + (dw ? 2.0 : 0.0)) * n * C * V;
  tsr_cuda_prof_note(flops, "%s %d x %d -> %d, chunks of %d%s%s", tsr_dtype_name(dt), n, C, V,
                    chunk, dx ? " +dx" : "", dw ? " +dw" : "");
  TSR_CUDA_DTYPE(dt, T,
                head_fused<T>(dt, acc, div, dx, dw, x, w, targets, scratch, n, C, V, chunk,
                              dloss));
}
