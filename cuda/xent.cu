/* xent.cu — cross entropy on the LM head's logits, fused with its gradient: the single-
 * rank form (tsr_ops_xent_fwd_bwd) and the four vocab-parallel passes of ops.h, on fp32
 * or bf16 logits.  One block per row; the row's max in fp32, sums of exp in double, as
 * on the CPU.  Row losses go to scratch and one block sums them in a fixed order. */
#include "cuda_common.cuh"

#define XENT_THREADS 512

/* Loss of row r into row_loss[r]; with GRAD the row is overwritten by
 * dloss * (softmax - onehot).  A target outside [0, V) (ignore index) gives zero loss
 * and a zero gradient row. */
template <class T, bool GRAD>
__global__ void xent_row_kernel(double *row_loss, T *logits, const int32_t *targets, int V,
                                float dloss) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const size_t r = blockIdx.x;
  T *z = logits + r * V;
  const int target = targets[r];
  if (target < 0 || target >= V) {
    if (GRAD)
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
  if (GRAD) {
    const float f = (float)(dloss / sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      float gj = expf(to_f32(z[j]) - m) * f;
      if (j == target) gj -= dloss;
      z[j] = from_f32<T>(gj);
    }
  }
}

size_t tsr_cuda_xent_scratch_(long n) { return n > 0 ? (size_t)n * sizeof(double) : 0; }

template <class T, bool GRAD>
static int xent(double *loss_sum, T *logits, const int32_t *targets, int n, int V, float dloss,
                const tsr_cuda_scratch *ws, cudaStream_t stream) {
  if (n <= 0) {
    TSR_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(double), stream));
    return 0;
  }
  double *row_loss = NULL;
  TSR_CUDA_SCRATCH(row_loss, ws, (size_t)n * sizeof(double));
  xent_row_kernel<T, GRAD><<<n, XENT_THREADS, 0, stream>>>(row_loss, logits, targets, V, dloss);
  TSR_CUDA_LAUNCHED();
  TSR_CALL(tsr_cuda_sum_doubles_(loss_sum, row_loss, n, stream));
  return 0;
}

extern "C" int tsr_cuda_xent_fwd_bwd(double *loss_sum, float *logits, const int32_t *targets,
                                     int n, int V, float dloss, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  return xent<float, true>(loss_sum, logits, targets, n, V, dloss, ws, stream);
}
extern "C" int tsr_cuda_xent_fwd(double *loss_sum, const float *logits, const int32_t *targets,
                                 int n, int V, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  /* GRAD=false never writes the logits */
  return xent<float, false>(loss_sum, (float *)logits, targets, n, V, 0.0f, ws, stream);
}
extern "C" int tsr_cuda_xent_fwd_bwd_bf16(double *loss_sum, tsr_bf16 *logits,
                                          const int32_t *targets, int n, int V, float dloss,
                                          const tsr_cuda_scratch *ws, cudaStream_t stream) {
  return xent<bf16, true>(loss_sum, (bf16 *)logits, targets, n, V, dloss, ws, stream);
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

__global__ void xent_rows_kernel(double *loss_sum, const double *row_max, const double *sumexp,
                                 const double *target_logit, int n) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int r = threadIdx.x; r < n; r += blockDim.x)
    acc += log(sumexp[r]) + row_max[r] - target_logit[r];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *loss_sum = acc;
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
static int xent_local_stats(double *row_max, double *target_logit, const T *logits,
                            const int32_t *targets, int n, int V, int vocab_start,
                            cudaStream_t stream) {
  if (n <= 0) return 0;
  xent_stats_kernel<T><<<n, XENT_THREADS, 0, stream>>>(row_max, target_logit, logits, targets, V,
                                                       vocab_start);
  TSR_CUDA_LAUNCHED();
  return 0;
}
template <class T>
static int xent_local_sumexp(double *sumexp, const T *logits, const double *row_max, int n, int V,
                             cudaStream_t stream) {
  if (n <= 0) return 0;
  xent_sumexp_kernel<T><<<n, XENT_THREADS, 0, stream>>>(sumexp, logits, row_max, V);
  TSR_CUDA_LAUNCHED();
  return 0;
}
template <class T>
static int xent_grad(T *logits, const int32_t *targets, const double *row_max,
                     const double *sumexp, int n, int V, int vocab_start, float dloss,
                     cudaStream_t stream) {
  if (n <= 0) return 0;
  xent_grad_kernel<T><<<n, XENT_THREADS, 0, stream>>>(logits, targets, row_max, sumexp, V,
                                                      vocab_start, dloss);
  TSR_CUDA_LAUNCHED();
  return 0;
}

extern "C" int tsr_cuda_xent_local_stats(double *row_max, double *target_logit,
                                         const float *logits, const int32_t *targets, int n,
                                         int V, int vocab_start, cudaStream_t stream) {
  return xent_local_stats<float>(row_max, target_logit, logits, targets, n, V, vocab_start, stream);
}
extern "C" int tsr_cuda_xent_local_sumexp(double *sumexp, const float *logits,
                                          const double *row_max, int n, int V,
                                          cudaStream_t stream) {
  return xent_local_sumexp<float>(sumexp, logits, row_max, n, V, stream);
}
extern "C" int tsr_cuda_xent_rows(double *loss_sum, const double *row_max, const double *sumexp,
                                  const double *target_logit, int n, cudaStream_t stream) {
  xent_rows_kernel<<<1, 1024, 0, stream>>>(loss_sum, row_max, sumexp, target_logit, n);
  TSR_CUDA_LAUNCHED();
  return 0;
}
extern "C" int tsr_cuda_xent_grad(float *logits, const int32_t *targets, const double *row_max,
                                  const double *sumexp, int n, int V, int vocab_start,
                                  float dloss, cudaStream_t stream) {
  return xent_grad<float>(logits, targets, row_max, sumexp, n, V, vocab_start, dloss, stream);
}
extern "C" int tsr_cuda_xent_local_stats_bf16(double *row_max, double *target_logit,
                                              const tsr_bf16 *logits, const int32_t *targets,
                                              int n, int V, int vocab_start,
                                              cudaStream_t stream) {
  return xent_local_stats<bf16>(row_max, target_logit, (const bf16 *)logits, targets, n, V,
                                vocab_start, stream);
}
extern "C" int tsr_cuda_xent_local_sumexp_bf16(double *sumexp, const tsr_bf16 *logits,
                                               const double *row_max, int n, int V,
                                               cudaStream_t stream) {
  return xent_local_sumexp<bf16>(sumexp, (const bf16 *)logits, row_max, n, V, stream);
}
extern "C" int tsr_cuda_xent_grad_bf16(tsr_bf16 *logits, const int32_t *targets,
                                       const double *row_max, const double *sumexp, int n, int V,
                                       int vocab_start, float dloss, cudaStream_t stream) {
  return xent_grad<bf16>((bf16 *)logits, targets, row_max, sumexp, n, V, vocab_start, dloss,
                         stream);
}
