/* ops_cuda.h — the CUDA backend of the kernel interface (src/ops.h).
 *
 * Every function here mirrors the ops.h function of the same name (tsr_ops_X ->
 * tsr_cuda_X): the same arguments, in the same order, with the same semantics, on DEVICE
 * pointers, plus the stream the work is queued on (last argument).  In particular:
 *  - layouts are those of ops.h (row-major activations [n, width], weights [out, in]);
 *  - forward functions overwrite their outputs; backward functions ACCUMULATE (+=) into
 *    their gradients, except the GEMM's dx and the SwiGLU/GELU input gradients, which
 *    they write (as ops.h says);
 *  - the fp32 functions compute what ops_cpu.c computes to ~1e-6 relative (the summation
 *    order differs; tests/cuda/test_kernels holds them to 1e-5);
 *  - deterministic: no atomics on floating-point data, every reduction has a fixed
 *    order that depends only on the shapes, so a rerun is bitwise identical.
 * Where ops.h returns a value (loss sums, sums of squares, all_finite) the CUDA version
 * writes it to a device pointer given as the first argument instead, so nothing here
 * synchronises with the host.
 *
 * All functions return 0 on success and TSR_ERR (1) after reporting the failing call as
 * "file:line func: call: error".  Kernel faults are asynchronous: they surface at the
 * next checked synchronising call.  Nothing here allocates device memory: the functions
 * that need a temporary (column sums, sort keys, per-row or per-block partials) take a
 * tsr_cuda_scratch, one buffer the caller allocates at setup with the size
 * tsr_cuda_scratch_bytes() gives for its largest shapes.
 *
 * Mixed precision: tsr_bf16 is the raw 16-bit bf16 pattern (the upper half of an fp32).
 * The *_bf16 functions take bf16 storage and compute in fp32 (GEMMs: tensor cores, fp32
 * accumulation), with fp32 side outputs (lse, statistics).  Tests hold them to 1e-2. */
#ifndef TSR_OPS_CUDA_H
#define TSR_OPS_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ops.h" /* tsr_prec */

typedef uint16_t tsr_bf16;
typedef enum { TSR_CUDA_F32 = 0, TSR_CUDA_BF16 = 1 } tsr_cuda_dtype;

/* ---- scratch: device memory for temporaries, allocated once by the caller ----
 * Functions on one stream use it in turn (stream order), so one buffer per stream.  A
 * function whose shapes need more than ws->bytes reports both sizes and returns TSR_ERR
 * without launching anything. */
typedef struct {
  void *base;
  size_t bytes;
} tsr_cuda_scratch;
typedef struct {        /* the largest shapes the caller will pass (0: op not used) */
  long rows;            /* n: rows (tokens) of norms, GEMM biases, cross-entropy, embedding */
  long cols;            /* C: widest norm or GEMM output with a bias/weight gradient */
  long vocab_local;     /* embedding rows held by this rank */
  long attn_bht;        /* B * H * T of the attention backward */
  long sumsq_elems;     /* longest tsr_cuda_sumsq */
  long attn_part;       /* 2 * B * H * T * hd when KV < H (tensor-core attention backward) */
} tsr_cuda_scratch_dims;
/* *bytes: enough scratch for every function below at shapes up to *d. */
int tsr_cuda_scratch_bytes(const tsr_cuda_scratch_dims *d, size_t *bytes);

/* ---- GEMM through cuBLASLt (cuda/gemm.cu) ----
 * A handle plus its workspace; one per stream that issues GEMMs concurrently. */
typedef struct tsr_cuda_blas tsr_cuda_blas;
int tsr_cuda_blas_create(tsr_cuda_blas **blas, size_t workspace_bytes); /* 0 = 32 MiB */
void tsr_cuda_blas_destroy(tsr_cuda_blas **blas);                       /* NULLs it */
/* What the fp32 GEMMs below may round their inputs to (TSR_MATMUL_* of ops.h): fp32
 * (CUBLAS_COMPUTE_32F, the default), bf16 or fp16 (COMPUTE_32F_FAST_16BF / _16F: tensor
 * cores, fp32 accumulation). */
void tsr_cuda_blas_set_inputs(tsr_cuda_blas *blas, int mode);

/* fp32 (true fp32 FMA, no TF32): exactly the semantics of tsr_ops_matmul_fwd/bwd.
 * y[n, out] = x[n, in] @ w[out, in]^T (+ bias[out], as a cuBLASLt epilogue). */
int tsr_cuda_matmul_fwd(tsr_cuda_blas *blas, float *y, const float *x, const float *w,
                        const float *bias, int n, int in, int out, cudaStream_t stream);
/* dx = dy @ w (written);  dw += dy^T @ x;  dbias += column sums of dy.  Any may be NULL. */
int tsr_cuda_matmul_bwd(tsr_cuda_blas *blas, float *dx, float *dw, float *dbias, const float *dy,
                        const float *x, const float *w, int n, int in, int out,
                        const tsr_cuda_scratch *ws, cudaStream_t stream);

/* bf16 inputs, fp32 accumulation, output y in y_type (fp32 or bf16).
 * bias (may be NULL) is in y_type (cuBLASLt's rule for the bias epilogue).
 * act = TSR_CUDA_ACT_GELU: y = gelu_tanh(x w^T + bias), and pre_act [n, out] (y_type)
 * receives x w^T + bias for the backward (fused in the GEMM epilogue when cuBLASLt
 * offers it for the shape, otherwise a separate GELU pass). */
typedef enum { TSR_CUDA_ACT_NONE = 0, TSR_CUDA_ACT_GELU = 1 } tsr_cuda_act;
int tsr_cuda_matmul_fwd_bf16(tsr_cuda_blas *blas, void *y, tsr_cuda_dtype y_type,
                             const tsr_bf16 *x, const tsr_bf16 *w, const void *bias,
                             tsr_cuda_act act, void *pre_act, int n, int in, int out,
                             cudaStream_t stream);
/* dx (dx_type) = dy @ w;  dw (fp32) += dy^T @ x;  dbias (fp32) += column sums of dy.
 * Gradients of weights stay fp32 (they are reduced over dp and fed to AdamW). */
int tsr_cuda_matmul_bwd_bf16(tsr_cuda_blas *blas, void *dx, tsr_cuda_dtype dx_type, float *dw,
                             float *dbias, const tsr_bf16 *dy, const tsr_bf16 *x,
                             const tsr_bf16 *w, int n, int in, int out, const tsr_cuda_scratch *ws, cudaStream_t stream);

/* ---- embedding (cuda/ops_elem.cu) ----
 * The backward sorts the rows by token (CUB radix sort, stable) and sums each token's
 * rows in row order: deterministic, and bitwise what the CPU computes. */
int tsr_cuda_embedding_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int n, int T, int C, int vocab_start, int vocab_local,
                           cudaStream_t stream);
int tsr_cuda_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int n, int T, int C, int vocab_start, int vocab_local,
                           const tsr_cuda_scratch *ws, cudaStream_t stream);

/* ---- norms ---- */
int tsr_cuda_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int n, int C,
                         float eps, cudaStream_t stream);
int tsr_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                         const float *rstd, int n, int C, const tsr_cuda_scratch *ws, cudaStream_t stream);
int tsr_cuda_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int n, int C, float eps, cudaStream_t stream);
int tsr_cuda_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                           const float *w, const float *mean, const float *rstd, int n, int C,
                           const tsr_cuda_scratch *ws, cudaStream_t stream);
/* bf16 activations and weight, fp32 rstd; dw accumulates in fp32. */
int tsr_cuda_rmsnorm_fwd_bf16(tsr_bf16 *out, float *rstd, const tsr_bf16 *x, const tsr_bf16 *w,
                              int n, int C, float eps, cudaStream_t stream);
int tsr_cuda_rmsnorm_bwd_bf16(tsr_bf16 *dx, float *dw, const tsr_bf16 *dout, const tsr_bf16 *x,
                              const tsr_bf16 *w, const float *rstd, int n, int C,
                              const tsr_cuda_scratch *ws, cudaStream_t stream);

/* ---- RoPE (angles formed in double, as on the CPU) ---- */
int tsr_cuda_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride, float theta,
                      cudaStream_t stream);
int tsr_cuda_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride,
                      float theta, cudaStream_t stream);
int tsr_cuda_rope_fwd_bf16(tsr_bf16 *x, int n, int T, int n_heads, int head_dim, int stride,
                           float theta, cudaStream_t stream);
int tsr_cuda_rope_bwd_bf16(tsr_bf16 *dx, int n, int T, int n_heads, int head_dim, int stride,
                           float theta, cudaStream_t stream);

/* ---- causal GQA attention (cuda/attention.cu): flash-style, tiled over keys with an
 * online softmax in shared memory; never stores a T x T matrix.  head_dim <= 128.
 * The backward rebuilds P from lse in two kernels, one owning a block of keys (dk, dv,
 * summing the group's query heads and rows in a fixed order) and one owning a block of
 * queries (dq): no atomics, deterministic.  It uses B*H*T floats of scratch. */
int tsr_cuda_attention_fwd(float *out, float *lse, const float *q, const float *k,
                           const float *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                           cudaStream_t stream);
int tsr_cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v,
                           int B, int T, int H, int KV, int hd, int qkv_stride,
                           const tsr_cuda_scratch *ws, cudaStream_t stream);
/* bf16 storage for q, k, v, out, dout and the gradients, fp32 lse and arithmetic. */
int tsr_cuda_attention_fwd_bf16(tsr_bf16 *out, float *lse, const tsr_bf16 *q, const tsr_bf16 *k,
                                const tsr_bf16 *v, int B, int T, int H, int KV, int hd,
                                int qkv_stride, cudaStream_t stream);
int tsr_cuda_attention_bwd_bf16(tsr_bf16 *dq, tsr_bf16 *dk, tsr_bf16 *dv, const tsr_bf16 *dout,
                                const tsr_bf16 *out, const float *lse, const tsr_bf16 *q,
                                const tsr_bf16 *k, const tsr_bf16 *v, int B, int T, int H,
                                int KV, int hd, int qkv_stride, const tsr_cuda_scratch *ws, cudaStream_t stream);

/* The same on the tensor cores: q, k, v, dout, P and dS rounded to bf16 for the five
 * matrix products (fp32 accumulation, fp32 softmax statistics and outputs), as when
 * the GEMMs take bf16 inputs.  head_dim 32, 64, 96 or 128 only, where the GPU's opt-in
 * shared memory per block holds tsr_cuda_attention_tc_smem (tsr_cuda_attention_tc_supported).  The backward's scratch is tsr_cuda_attention_bwd's
 * plus, under grouped-query attention (KV < H), 2*B*H*T*hd floats of per-query-head
 * dk, dv sums (tsr_cuda_scratch_dims.attn_part), added over each group in order. */
int tsr_cuda_attention_tc_supported(int hd); /* and the current GPU's shared memory suffices */
size_t tsr_cuda_attention_tc_smem(int hd);  /* per block; 0 for another head_dim */
/* Which kernels the tensor-core attention runs (process-wide; the two functions above
 * answer for the current one): WMMA 16x16x16 fragments with the scores through shared
 * memory (the default, checked on an H100), or mma.sync m16n8k16 with every accumulator
 * in registers (FlashAttention-2's layout; checked on the CPU emulation only so far). */
enum { TSR_CUDA_TC_WMMA = 0, TSR_CUDA_TC_MMA = 1 };
void tsr_cuda_attention_tc_use(int kernel);
int tsr_cuda_attention_tc_kernel(void);
int tsr_cuda_attention_tc_fwd(float *out, float *lse, const float *q, const float *k,
                              const float *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                              cudaStream_t stream);
int tsr_cuda_attention_tc_bwd(float *dq, float *dk, float *dv, const float *dout,
                              const float *out, const float *lse, const float *q, const float *k,
                              const float *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                              const tsr_cuda_scratch *ws, cudaStream_t stream);

/* ---- the same attention through cuDNN's fused flash attention (cuda/sdpa_cudnn.cpp; only
 * where configure found cuDNN and its frontend headers: TSR_HAVE_CUDNN).  bf16 copies of
 * q, k, v (and out, dout) in `staging` (tsr_ops_cudnn_attention_staging_elems elements),
 * fp32 accumulation in cuDNN; lse is cuDNN's softmax statistics, so forward and backward
 * must both run here.  prepare builds the shape's graphs (once; host work and cuDNN's
 * heuristics) and returns 0 when they run on this GPU with their workspace in the
 * staging, TSR_CUDA_CUDNN_CANNOT when not (why says what), TSR_ERR on a failure; fwd and
 * bwd report the same as an error.  bwd adds into dq, dk, dv (any may be NULL). */
enum { TSR_CUDA_CUDNN_CANNOT = 2 };
long tsr_cuda_cudnn_attention_version(void); /* cudnnGetVersion() of the library loaded */
int tsr_cuda_cudnn_attention_prepare(int B, int T, int H, int KV, int hd, long staging_elems,
                                     char *why, size_t why_len);
int tsr_cuda_cudnn_attention_fwd(float *out, float *lse, const float *q, const float *k,
                                 const float *v, int B, int T, int H, int KV, int hd,
                                 int qkv_stride, tsr_bf16 *staging, long staging_elems,
                                 cudaStream_t stream);
int tsr_cuda_cudnn_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const float *k, const float *v, int B, int T, int H, int KV,
                                 int hd, int qkv_stride, tsr_bf16 *staging, long staging_elems,
                                 cudaStream_t stream);
void tsr_cuda_cudnn_attention_close(void);
/* Without a GPU: whether cuDNN accepts both graphs for the shape on the GPU device_json
 * describes (cuDNN's device-property JSON; tests/cuda/cudnn_h100.json) with compute
 * capability sm_version (90) and sm_count SMs: validation, cuDNN's heuristics and support
 * checks, all but compiling the kernels (which needs the driver).  Returns as prepare. */
int tsr_cuda_cudnn_attention_check_offline(const char *device_json, int sm_version,
                                           int sm_count, int B, int T, int H, int KV, int hd,
                                           char *why, size_t why_len);

/* ---- SwiGLU, GELU (tanh); the backward writes its input gradient (not accumulated) ---- */
int tsr_cuda_swiglu_fwd(float *out, const float *gate_up, int n, int F, cudaStream_t stream);
int tsr_cuda_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up, int n, int F,
                        cudaStream_t stream);
int tsr_cuda_gelu_fwd(float *out, const float *x, int n_elem, cudaStream_t stream);
int tsr_cuda_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem,
                      cudaStream_t stream);
int tsr_cuda_swiglu_fwd_bf16(tsr_bf16 *out, const tsr_bf16 *gate_up, int n, int F,
                             cudaStream_t stream);
int tsr_cuda_swiglu_bwd_bf16(tsr_bf16 *dgate_up, const tsr_bf16 *dout, const tsr_bf16 *gate_up,
                             int n, int F, cudaStream_t stream);
int tsr_cuda_gelu_fwd_bf16(tsr_bf16 *out, const tsr_bf16 *x, int n_elem, cudaStream_t stream);
int tsr_cuda_gelu_bwd_bf16(tsr_bf16 *dx, const tsr_bf16 *dout, const tsr_bf16 *x, int n_elem,
                           cudaStream_t stream);

/* ---- elementwise ---- */
int tsr_cuda_add(float *out, const float *a, const float *b, long n_elem, cudaStream_t stream);
int tsr_cuda_acc(float *out, const float *a, long n_elem, cudaStream_t stream);
/* out = r(x + r(y)), r rounding to prec (fp32: none): tsr_ops_residual, bitwise */
int tsr_cuda_residual(float *out, const float *x, const float *y, long n_elem, tsr_prec prec,
                      cudaStream_t stream);
int tsr_cuda_scale(float *x, float s, long n_elem, cudaStream_t stream);
int tsr_cuda_add_bf16(tsr_bf16 *out, const tsr_bf16 *a, const tsr_bf16 *b, long n_elem,
                      cudaStream_t stream);
int tsr_cuda_acc_bf16(tsr_bf16 *out, const tsr_bf16 *a, long n_elem, cudaStream_t stream);

/* ---- cross entropy (cuda/xent.cu); *loss_sum is a device double, overwritten ---- */
int tsr_cuda_xent_fwd_bwd(double *loss_sum, float *logits, const int32_t *targets, int n, int V,
                          float dloss, const tsr_cuda_scratch *ws, cudaStream_t stream);
int tsr_cuda_xent_fwd(double *loss_sum, const float *logits, const int32_t *targets, int n,
                      int V, const tsr_cuda_scratch *ws, cudaStream_t stream);
/* vocab-parallel passes, as ops.h describes (row_max, target_logit, sumexp: device
 * doubles [n]; the caller all-reduces them over tp between the passes). */
int tsr_cuda_xent_local_stats(double *row_max, double *target_logit, const float *logits,
                              const int32_t *targets, int n, int V, int vocab_start,
                              cudaStream_t stream);
int tsr_cuda_xent_local_sumexp(double *sumexp, const float *logits, const double *row_max, int n,
                               int V, cudaStream_t stream);
int tsr_cuda_xent_rows(double *loss_sum, const double *row_max, const double *sumexp,
                       const double *target_logit, int n, cudaStream_t stream);
int tsr_cuda_xent_grad(float *logits, const int32_t *targets, const double *row_max,
                       const double *sumexp, int n, int V, int vocab_start, float dloss,
                       cudaStream_t stream);
/* The same on bf16 logits (the LM head's bf16 output; the gradient overwrites it in
 * bf16, ready for the head's backward GEMM).  Statistics stay fp32/double. */
int tsr_cuda_xent_fwd_bwd_bf16(double *loss_sum, tsr_bf16 *logits, const int32_t *targets, int n,
                               int V, float dloss, const tsr_cuda_scratch *ws, cudaStream_t stream);
int tsr_cuda_xent_local_stats_bf16(double *row_max, double *target_logit, const tsr_bf16 *logits,
                                   const int32_t *targets, int n, int V, int vocab_start,
                                   cudaStream_t stream);
int tsr_cuda_xent_local_sumexp_bf16(double *sumexp, const tsr_bf16 *logits,
                                    const double *row_max, int n, int V, cudaStream_t stream);
int tsr_cuda_xent_grad_bf16(tsr_bf16 *logits, const int32_t *targets, const double *row_max,
                            const double *sumexp, int n, int V, int vocab_start, float dloss,
                            cudaStream_t stream);

/* ---- AdamW over a flat fp32 shard (torch.optim.AdamW; scalars formed as on the CPU);
 * out (NULL: none) gets the new p rounded to out_prec, as tsr_ops_adamw's ---- */
int tsr_cuda_adamw(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, long t, float grad_scale,
                   float *out, tsr_prec out_prec, cudaStream_t stream);

/* ---- casts and reductions ---- */
int tsr_cuda_round_bf16(float *dst, const float *src, long n_elem, cudaStream_t stream);
int tsr_cuda_round_fp16(float *dst, const float *src, long n_elem, cudaStream_t stream);
int tsr_cuda_cast_f32_bf16(tsr_bf16 *dst, const float *src, long n_elem, cudaStream_t stream);
int tsr_cuda_cast_bf16_f32(float *dst, const tsr_bf16 *src, long n_elem, cudaStream_t stream);
/* The same between rows x cols of a strided fp32 matrix (row r at r * stride) and a
 * compact bf16 one (row r at r * cols); back to fp32 the values are written, or added
 * when accumulate != 0 (the gradients of cuDNN's attention, which overwrites its own). */
int tsr_cuda_cast_rows_f32_bf16(tsr_bf16 *dst, const float *src, long rows, int cols,
                                long src_stride, cudaStream_t stream);
int tsr_cuda_cast_rows_bf16_f32(float *dst, long dst_stride, const tsr_bf16 *src, long rows,
                                int cols, int accumulate, cudaStream_t stream);
/* *out (device double) = sum of squares: two passes, per-block partials in double, then
 * one block sums them in a fixed order. */
int tsr_cuda_sumsq(double *out, const float *x, long n_elem, const tsr_cuda_scratch *ws, cudaStream_t stream);
int tsr_cuda_all_finite(int *out, const float *x, long n_elem, cudaStream_t stream);
/* *acc += *x / div (device doubles; one thread): a loss summed on the device, so the
 * host fetches it once per step instead of once per micro-batch. */
int tsr_cuda_add_quotient(double *acc, const double *x, double div, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
