/* ops.h — the kernel interface.  The model calls only these; each backend
 * (ops_cpu.c here, cuda/ops_cuda.cu later) implements the same signatures.
 *
 * Conventions for every function below:
 *  - Activations are row-major [n_rows, width] float arrays; n_rows = B*T tokens,
 *    token index r = b*T + t.  Weight matrices are [out, in] row-major (PyTorch).
 *  - Forward functions overwrite their outputs.
 *  - Backward functions ACCUMULATE (+=) into their gradient outputs (dw, db, the norms'
 *    and attention's dx, ...); callers zero what must start at zero.  This makes gradient
 *    accumulation and residual branches free.  Two exceptions, said where they are: the
 *    GEMM's dx and the activations' (SwiGLU, GELU) input gradients are WRITTEN, since
 *    their buffers hold nothing else (no zeroing pass, no read of the old value).
 *  - Compute is fp32.  Mixed precision is done by the caller: bf16 storage is
 *    emulated on the CPU by rounding values to bf16 (tsr_ops_round_bf16), which
 *    gives bit-identical values to bf16 storage.
 *  - Deterministic: the same inputs give bitwise the same outputs (no racy sums). */
#ifndef TSR_OPS_H
#define TSR_OPS_H

#include <stddef.h>
#include <stdint.h>

/* One-time backend setup (threads).  n_threads <= 0 = backend default. */
void tsr_ops_init(int n_threads);

/* ---- the memory the ops work on ----
 * Every buffer an op reads or writes comes from tsr_ops_alloc (model parameters,
 * gradients and activations, ZeRO's master weights and Adam moments, pipeline buffers).
 * With the CPU backend that is host memory (tsr_calloc).  With a device backend
 * (ops_backend.h; CUDA: cuda/ops_dev.c) it is memory the device computes in, and the
 * ops are queued on the device in call order: the host may read or write such memory
 * only after tsr_ops_sync() (comm.c syncs before every transfer, so MPI may be given
 * it).  Copies and fills of it go through tsr_ops_copy / tsr_ops_zero, which are
 * queued in order with the kernels; either side of a copy may also be host memory
 * (the copy then completes before it returns when the source is host memory). */
void *tsr_ops_alloc(size_t count, size_t size); /* zeroed; NULL (reported) on failure */
void tsr_ops_free_(void **p);                   /* NULLs *p */
#define tsr_ops_free(pp) tsr_ops_free_((void **)(pp))
void tsr_ops_copy(void *dst, const void *src, size_t bytes);
void tsr_ops_zero(void *dst, size_t bytes);
void tsr_ops_sync(void);
/* 0, or TSR_ERR once a device call has failed (reported when it happened; sticky): the
 * trainer checks it once per step. */
int tsr_ops_status(void);
/* Bytes of op memory allocated now / at most (CPU: every tsr_calloc of the process). */
size_t tsr_ops_mem_bytes(void);
size_t tsr_ops_mem_peak_bytes(void);

/* What the GEMMs of tsr_ops_matmul_fwd/bwd may round their inputs to.  TSR_MATMUL_FP32
 * (the default, and all the CPU backend does): true fp32.  TSR_MATMUL_BF16 / _FP16: a
 * device may feed its tensor cores 16-bit inputs, accumulating in fp32 (bf16: bf16
 * copies of the inputs, tsr_ops_staging_elems below; fp16: cuBLASLt's
 * COMPUTE_32F_FAST_16F).  In bf16 (fp16) training the forward GEMMs' inputs are
 * already bf16 (fp16) values, so only the backward GEMMs' gradients are rounded: the
 * device then differs from the CPU reference by bf16 (fp16) rounding, not more. */
enum { TSR_MATMUL_FP32 = 0, TSR_MATMUL_BF16 = 1, TSR_MATMUL_FP16 = 2 };
/* The precision values are stored in (fp32 containers holding bf16 or fp16 values). */
typedef enum { TSR_PREC_FP32 = 0, TSR_PREC_BF16 = 1, TSR_PREC_FP16 = 2 } tsr_prec;
void tsr_ops_set_matmul_inputs(int mode);
void tsr_ops_mem_reset_peak(void); /* device: the peak restarts from what is in use */
int tsr_ops_on_device(void);

/* The largest shapes the ops will be called with (a device backend sizes its scratch
 * memory from them at setup, so no op allocates; the CPU backend needs none). */
typedef struct {
  long rows;         /* tokens of a micro-batch (norms, biases, cross-entropy, embedding) */
  long cols;         /* widest norm or GEMM output whose weight/bias gradient is summed */
  long vocab_local;  /* embedding rows held by this rank */
  long attn_bht;     /* B * H * T of the attention */
  long sumsq_elems;  /* longest tsr_ops_sumsq / tsr_ops_all_finite */
  long attn_part;    /* grouped-query attention (KV < H): 2 * B * H * T * hd, else 0 */
  long weight_elems; /* largest matmul weight out * in (bf16 GEMM staging) */
  long attn_io;      /* B * T * (H + KV) * hd: the attention's q-sized plus k-sized elements */
  long attn_t;       /* T of the attention (cuDNN's deterministic backward's workspace) */
} tsr_ops_shapes;
int tsr_ops_reserve(const tsr_ops_shapes *s);
/* In TSR_MATMUL_BF16 mode a device backend (cuda/ops_dev.c) copies a GEMM's fp32 inputs
 * to bf16 and runs a bf16-storage GEMM (on an H100 bf16-storage GEMMs ran at 2-4x the
 * rate of cuBLASLt rounding fp32 inputs, bench/RESULTS.md; the copies' cost is not
 * measured yet).  The copies go into one staging buffer reserved with the scratch: x and
 * dy of up to rows x cols each and the largest weight, each part starting on a 256-byte
 * boundary (tsr_ops_staging_part elements).  A product whose copies do not fit runs on
 * the fp32 storage as before.  tessera plan counts the staging (src/plan.c). */
static inline long tsr_ops_staging_part(long elems) { return (elems + 127) / 128 * 128; }
static inline long tsr_ops_staging_elems(const tsr_ops_shapes *s) {
  return 2 * tsr_ops_staging_part(s->rows * s->cols) + tsr_ops_staging_part(s->weight_elems);
}
/* cuDNN's attention (TSR_CUDA_ATTENTION=cudnn, cuda/sdpa_cudnn.cpp) uses the same staging
 * for its bf16 copies of q, k, v, out, dout and of its own dq, dk, dv (4 * attn_io
 * elements, each part on a 256-byte boundary), then its workspace.  The workspace is
 * cuDNN's to say once it has built its plans on the GPU.  Counted here: its deterministic
 * backward on Hopper with cuDNN before 9.25 keeps dP, bf16 [B, H, T, T] with T padded to
 * 128 (the cuDNN frontend's sdpa backward), plus an fp32 dq accumulator and two floats per
 * query row (2 * attn_io + 4 * attn_bht elements; an estimate not yet checked on a GPU).
 * Where the deterministic backward asks for more, the non-deterministic one is taken
 * (said in the log); where that does not fit either, attention.cu's kernels. */
static inline long tsr_ops_cudnn_attention_staging_elems(const tsr_ops_shapes *s) {
  if (s->attn_io <= 0 || s->attn_t <= 0) return 0;
  const long tp = (s->attn_t + 127) / 128 * 128;
  return 8 * 128 + 4 * s->attn_io + 2 * s->attn_io + 4 * s->attn_bht +
         s->attn_bht / s->attn_t * tp * tp;
}
/* The attention backward's device scratch (cuda/attention.cu) for attn_bht and attn_part:
 * D (one float per query row and head, padded to 256 bytes), then the grouped-query
 * partial sums.  tessera plan counts it from here too. */
static inline size_t tsr_ops_attention_scratch_bytes(long attn_bht, long attn_part) {
  if (attn_bht <= 0) return 0;
  return ((size_t)attn_bht * sizeof(float) + 255) / 256 * 256 + (size_t)attn_part * sizeof(float);
}

/* ---- GEMM (OpenBLAS on the CPU) ----
 * y[n, out] = x[n, in] @ w[out, in]^T (+ bias[out] if bias != NULL) */
void tsr_ops_matmul_fwd(float *y, const float *x, const float *w, const float *bias,
                        int n, int in, int out);
/* dx[n, in] = dy @ w (written: the input gradient needs no zeroed buffer);
 * dw[out, in] += dy^T @ x;  dbias[out] += sum_rows dy (the weight gradients accumulate).
 * Any of dx, dw, dbias may be NULL (not needed). */
void tsr_ops_matmul_bwd(float *dx, float *dw, float *dbias, const float *dy,
                        const float *x, const float *w, int n, int in, int out);

/* ---- embedding ----
 * out[r, :] = wte[tokens[r] - vocab_start, :] if tokens[r] in [vocab_start, vocab_start+vocab_local)
 *             else 0;   then += wpe[r % T, :] if wpe != NULL (learned positions, gpt2).
 * (vocab_start/vocab_local exist for the vocab-parallel split; single rank: 0, vocab.) */
void tsr_ops_embedding_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int n, int T, int C, int vocab_start, int vocab_local);
void tsr_ops_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                           int n, int T, int C, int vocab_start, int vocab_local);

/* ---- RMSNorm: out = x / sqrt(mean(x^2) + eps) * w;  rstd[n] saved ---- */
void tsr_ops_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w,
                         int n, int C, float eps);
void tsr_ops_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                         const float *w, const float *rstd, int n, int C);

/* ---- LayerNorm (biased variance, like torch): out = (x-mean)*rstd*w + b ---- */
void tsr_ops_layernorm_fwd(float *out, float *mean, float *rstd, const float *x,
                           const float *w, const float *b, int n, int C, float eps);
void tsr_ops_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                           const float *w, const float *mean, const float *rstd, int n, int C);

/* ---- RoPE, half-split convention, in place ----
 * x[r*stride + h*head_dim + i] for r in [0,n), h in [0,n_heads), pos = r % T.
 * For i < head_dim/2 the pair (x[i], x[i+head_dim/2]) is rotated by angle
 * pos * theta^(-2i/head_dim):  (a, b) -> (a cos - b sin, a sin + b cos).
 * bwd applies the inverse rotation to the gradient in place (RoPE is orthogonal). */
void tsr_ops_rope_fwd(float *x, int n, int T, int n_heads, int head_dim, int stride, float theta);
void tsr_ops_rope_bwd(float *dx, int n, int T, int n_heads, int head_dim, int stride, float theta);

/* ---- causal grouped-query attention ----
 * q: element (b,t,h,i) at q[(b*T+t)*qkv_stride + h*hd + i]            (h < H)
 * k: element (b,t,g,i) at k[(b*T+t)*qkv_stride + g*hd + i]            (g < KV)
 * v: same layout as k.  Query head h uses KV head g = h / (H/KV).
 * out[(b*T+t)*H*hd + h*hd + i] (contiguous);  lse[(b*H+h)*T + t] = log-sum-exp of the
 * scaled scores of row t (saved so the backward can rebuild probabilities without
 * storing a T×T matrix).  Scale = 1/sqrt(hd).  Typically q, k, v all point into one
 * fused [n, (H+2KV)*hd] buffer with qkv_stride = (H+2KV)*hd.
 * bwd: dq/dk/dv use the same layout and stride as q/k/v and are accumulated. */
void tsr_ops_attention_fwd(float *out, float *lse, const float *q, const float *k,
                           const float *v, int B, int T, int H, int KV, int hd, int qkv_stride);
void tsr_ops_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                           const float *lse, const float *q, const float *k, const float *v,
                           int B, int T, int H, int KV, int hd, int qkv_stride);

/* ---- SwiGLU: gate_up[r] = [gate(F) | up(F)], out[r, j] = silu(gate_j) * up_j ---- */
void tsr_ops_swiglu_fwd(float *out, const float *gate_up, int n, int F);
void tsr_ops_swiglu_bwd(float *dgate_up, const float *dout, const float *gate_up, int n,
                        int F); /* dgate_up written (not accumulated), as gelu_bwd's dx */

/* ---- GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ---- */
void tsr_ops_gelu_fwd(float *out, const float *x, int n_elem);
void tsr_ops_gelu_bwd(float *dx, const float *dout, const float *x, int n_elem);

/* ---- elementwise ---- */
void tsr_ops_add(float *out, const float *a, const float *b, long n_elem); /* out = a + b */
void tsr_ops_acc(float *out, const float *a, long n_elem);                  /* out += a */
void tsr_ops_scale(float *x, float s, long n_elem);                          /* x *= s */
/* The residual add of a branch output y stored in prec: out = r(x + r(y)), r rounding to
 * prec (fp32: none), bitwise tsr_ops_round_* of y, tsr_ops_add, tsr_ops_round_* of out, in
 * one pass; y is left as it is.  out may be x. */
void tsr_ops_residual(float *out, const float *x, const float *y, long n_elem, tsr_prec prec);

/* ---- cross entropy, fused with its gradient ----
 * logits[n, V] (this rank's vocab columns [vocab_start, vocab_start+V)).
 * Returns the SUM over rows of -log softmax(logits)[target] (double).
 * Overwrites logits with d(loss_sum * dloss)/dlogits = dloss * (softmax - onehot).
 * Single rank: vocab_start = 0, V = vocab. */
double tsr_ops_xent_fwd_bwd(float *logits, const int32_t *targets, int n, int V, float dloss);
/* Loss only (evaluation); logits are left unchanged. */
double tsr_ops_xent_fwd(const float *logits, const int32_t *targets, int n, int V);
/* The same two, and tsr_ops_xent_rows below, with the sum kept in op memory: *acc (a
 * double of op memory) += sum / div, nothing returned, so on a device the host does
 * not wait for it; the trainer adds up a step's micro-batch losses this way and reads
 * them once, after the step's one synchronisation (the gradient norm). */
void tsr_ops_xent_fwd_bwd_acc(double *acc, double div, float *logits, const int32_t *targets,
                              int n, int V, float dloss);
void tsr_ops_xent_fwd_acc(double *acc, double div, const float *logits, const int32_t *targets,
                          int n, int V);

/* ---- vocab-parallel cross entropy (tensor parallel: the full logits never exist) ----
 * This rank holds the logit columns [vocab_start, vocab_start + V) of every row.  The
 * caller reduces across the tp group between the passes:
 *   1. local_stats: row_max[r] = max over local columns; target_logit[r] = the target's
 *      logit when this rank holds the target's column, else 0.
 *      -> all-reduce row_max with MAX, target_logit with SUM
 *   2. local_sumexp: sumexp[r] = sum over local columns of exp(z - row_max[r])
 *      -> all-reduce with SUM
 *   3. loss of row r = log(sumexp[r]) + row_max[r] - target_logit[r]  (tsr_ops_xent_rows)
 *   4. grad (training): logits := dloss * (exp(z - row_max) / sumexp - onehot).
 * Every target must be a token of the whole vocabulary, [0, vocab): unlike the fused
 * single-rank op these passes have no ignore index (a row whose target no rank holds
 * would count log-sum-exp as its loss).  The trainer's targets always are tokens. */
void tsr_ops_xent_local_stats(double *row_max, double *target_logit, const float *logits,
                              const int32_t *targets, int n, int V, int vocab_start);
void tsr_ops_xent_local_sumexp(double *sumexp, const float *logits, const double *row_max, int n,
                               int V);
double tsr_ops_xent_rows(const double *row_max, const double *sumexp, const double *target_logit,
                         int n); /* the SUM of the row losses */
void tsr_ops_xent_rows_acc(double *acc, double div, const double *row_max, const double *sumexp,
                           const double *target_logit, int n); /* *acc += SUM / div */
void tsr_ops_xent_grad(float *logits, const int32_t *targets, const double *row_max,
                       const double *sumexp, int n, int V, int vocab_start, float dloss);

/* ---- AdamW as torch.optim.AdamW (decoupled decay, bias-corrected), over n elements:
 * p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 * p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps).
 * g is multiplied by grad_scale first (clipping, 1/loss-scale). t is 1-based.
 * out (NULL: none) receives the new p rounded to out_prec in the same pass: the
 * parameter refresh fused in, bitwise what tsr_ops_round_* (or a copy) of p gives. */
void tsr_ops_adamw(float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
                   float beta2, float eps, float weight_decay, long t, float grad_scale,
                   float *out, tsr_prec out_prec); /* out overlaps none of p, m, v, g */
/* Its per-step scalars, formed as torch forms them (Python doubles, cast to fp32 where
 * they meet a tensor): p *= decay;  p -= step_size * m / (sqrt(v) / bc2_sqrt + eps).
 * The CUDA AdamW takes them from here too, so both round alike. */
typedef struct {
  float decay, step_size, bc2_sqrt, one_m_b1, one_m_b2;
} tsr_adamw_scalars;
tsr_adamw_scalars tsr_ops_adamw_scalars(float lr, float beta1, float beta2, float weight_decay,
                                        long t);

/* ---- casts and reductions ---- */
void tsr_ops_round_bf16(float *dst, const float *src, long n_elem); /* dst may == src */
void tsr_ops_round_fp16(float *dst, const float *src, long n_elem); /* dst may == src */
double tsr_ops_sumsq(const float *x, long n_elem); /* sum of squares in double */
/* sum over k < n_ranges, in order, of tsr_ops_sumsq(x + r[2k], r[2k+1] - r[2k]): bitwise
 * that loop, but a device computes all the ranges before one synchronisation. */
double tsr_ops_sumsq_ranges(const float *x, const int64_t *r, int n_ranges);
int tsr_ops_all_finite(const float *x, long n_elem);

#endif
