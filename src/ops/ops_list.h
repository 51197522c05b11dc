/* ops_list.h — every op of the kernel interface, declared once.
 *
 * Each entry names an op, its parameters and the same parameters as an argument list:
 *   TSR_OP(name, (parameters), (arguments))           returns nothing
 *   TSR_OP_RET(type, name, (parameters), (arguments)) returns a value
 * This file has no include guard: a user defines both macros, includes it, and gets one
 * thing per op.  From it come the public prototypes tsr_ops_<name> (ops.h), the members
 * of a device backend's table (ops_backend.h), the dispatch between the CPU and a device
 * (ops.c), the CPU kernels' prototypes tsr_cpu_<name> (ops_cpu.h) and the CUDA ones,
 * tsr_cuda_<name> (cuda/backend.h).  A new op is one entry here plus its CPU kernel
 * (a src/cpu_ file) and its CUDA kernel (a .cu file of cuda/).
 *
 * Conventions (every op):
 *  - `dt` is the storage type of the op's activation-like tensors, its `void *`
 *    arguments: activations, activation gradients and compute-precision parameters
 *    (dtype.h).  `float *` arguments are fp32 whatever dt is: parameter gradients,
 *    statistics (norms' mean and rstd, attention's lse), master weights and Adam's state.
 *    `double *` arguments are loss statistics.  Compute is fp32: 16-bit inputs are
 *    widened exactly, every output is rounded once, to nearest even, when it is stored.
 *  - Activations are row-major [n_rows, width]: n_rows = B*T tokens, token r = b*T + t.
 *    Weight matrices are [out, in] row-major (PyTorch's nn.Linear).
 *  - Forward ops overwrite their outputs.  Input gradients (dx, dq, ...) are WRITTEN,
 *    except where an op says `acc`; parameter gradients (dw, db, dwte, ...) ACCUMULATE
 *    (+=) in fp32, which makes gradient accumulation over micro-batches free.
 *  - Deterministic: the same inputs give bitwise the same outputs, run after run (no
 *    racy sums; a device backend may opt out where an op says so).
 *  - Pointers are op memory (tsr_ops_alloc), except where an op says host memory.
 *  - Empty shapes (n = 0, ...) do nothing; an empty sum (in = 0 for a GEMM) is zero.
 *
 * Documents (data.document_mask: packed sequences, docs/model.md "Document masking").
 * The position ops (embedding, RoPE) and attention take doc, int32 op memory [B*T] or
 * NULL: row r = b*T + t belongs to the document of its sequence that starts at row
 * doc[r] of the sequence (0 <= doc[r] <= t, and doc[r] does not decrease with t within a
 * sequence: documents are contiguous).  Its position is pos(r) = t - doc[r], and it
 * attends to the keys of its own document only.  doc NULL is doc[r] = 0 everywhere: one
 * document per sequence, pos(r) = r % T, plain causal attention.  The position ops take
 * any doc[r] <= t, negative too: context parallelism gives a rank's rows, in chunks of T,
 * their positions in the whole sequence that way (docs/context_parallel.md). */

/* ---- linear layers: y[n, out] = x[n, in] @ w[out, in]^T (+ bias[out]) ---- */
TSR_OP(matmul_fwd, (tsr_dtype dt, void *y, const void *x, const void *w, const void *bias, int n,
                    int in, int out),
       (dt, y, x, w, bias, n, in, out))
/* dx[n, in] = dy @ w (written);  dw[out, in] += dy^T @ x;  dbias[out] += the column sums
 * of dy.  dx, dw, dbias may each be NULL (not wanted).  gelu_pre != NULL fuses the GELU's
 * backward in: dx = (dy @ w) * gelu'(gelu_pre) element-wise, where w is the MLP's
 * down-projection and gelu_pre the up-projection's output (GELU's input), so dx is the
 * gradient of gelu_pre. */
TSR_OP(matmul_bwd, (tsr_dtype dt, void *dx, float *dw, float *dbias, const void *dy,
                    const void *x, const void *w, const void *gelu_pre, int n, int in, int out),
       (dt, dx, dw, dbias, dy, x, w, gelu_pre, n, in, out))

/* ---- embedding ----
 * out[r, :] = wte[tokens[r] - vocab_start, :] when tokens[r] is in [vocab_start,
 * vocab_start + vocab_local), else 0;  then + wpe[pos(r), :] when wpe != NULL (GPT-2's
 * learned positions; pos: see "Documents" above), rounded once.  tokens are int32 op
 * memory.  The vocab range is this rank's rows of a vocab-parallel table (one rank: 0,
 * vocab).  bwd: dwpe[p] sums the rows at position p in increasing row order. */
TSR_OP(embedding_fwd, (tsr_dtype dt, void *out, const int32_t *tokens, const void *wte,
                       const void *wpe, int n, int T, int C, int vocab_start, int vocab_local,
                       const int32_t *doc),
       (dt, out, tokens, wte, wpe, n, T, C, vocab_start, vocab_local, doc))
TSR_OP(embedding_bwd, (tsr_dtype dt, float *dwte, float *dwpe, const void *dout,
                       const int32_t *tokens, int n, int T, int C, int vocab_start,
                       int vocab_local, const int32_t *doc),
       (dt, dwte, dwpe, dout, tokens, n, T, C, vocab_start, vocab_local, doc))

/* ---- norms, with the residual add before them fused in ----
 * y == NULL: out = norm(x).  y != NULL: h = x + y (rounded: the residual stream as
 * stored; h may be x) and out = norm(h).  RMSNorm: out = x / sqrt(mean(x^2) + eps) * w,
 * rstd[n] saved.  LayerNorm (biased variance, as torch): out = (x - mean) rstd w + b,
 * mean[n] and rstd[n] saved. */
TSR_OP(rmsnorm_fwd, (tsr_dtype dt, void *out, float *rstd, void *h, const void *x, const void *y,
                     const void *w, int n, int C, float eps),
       (dt, out, rstd, h, x, y, w, n, C, eps))
/* dx = (acc ? dx : 0) + d(norm)/dx . dout (acc: the residual stream's gradient, to
 * which the norm's input gradient adds);  dw[C] += ... (fp32).  x is the norm's input
 * (h of the forward when it had y). */
TSR_OP(rmsnorm_bwd, (tsr_dtype dt, void *dx, float *dw, const void *dout, const void *x,
                     const void *w, const float *rstd, int n, int C, int acc),
       (dt, dx, dw, dout, x, w, rstd, n, C, acc))
TSR_OP(layernorm_fwd, (tsr_dtype dt, void *out, float *mean, float *rstd, void *h, const void *x,
                       const void *y, const void *w, const void *b, int n, int C, float eps),
       (dt, out, mean, rstd, h, x, y, w, b, n, C, eps))
/* db may be NULL (a LayerNorm without bias). */
TSR_OP(layernorm_bwd, (tsr_dtype dt, void *dx, float *dw, float *db, const void *dout,
                       const void *x, const void *w, const float *mean, const float *rstd, int n,
                       int C, int acc),
       (dt, dx, dw, db, dout, x, w, mean, rstd, n, C, acc))

/* ---- RoPE, half-split convention, in place ----
 * x[r*stride + h*head_dim + i] for r in [0, n), h in [0, n_heads), position pos(r) (see
 * "Documents" above).  For i < head_dim/2 the pair (x[i], x[i + head_dim/2]) is rotated by
 * pos * inv_freq(i) (tsr_rope_inv_freq, rope.h: theta^(-2i/head_dim), rescaled when
 * rope.scaling says so; angles formed in double): (a, b) -> (a cos - b sin, a sin + b cos).
 * bwd rotates the gradient back (RoPE is orthogonal). */
TSR_OP(rope_fwd, (tsr_dtype dt, void *x, int n, int T, int n_heads, int head_dim, int stride,
                  tsr_rope rope, const int32_t *doc),
       (dt, x, n, T, n_heads, head_dim, stride, rope, doc))
TSR_OP(rope_bwd, (tsr_dtype dt, void *dx, int n, int T, int n_heads, int head_dim, int stride,
                  tsr_rope rope, const int32_t *doc),
       (dt, dx, n, T, n_heads, head_dim, stride, rope, doc))

/* ---- causal grouped-query attention, scale 1/sqrt(hd) ----
 * q: element (b, t, h, i) at q[(b*T + t)*qkv_stride + h*hd + i] (h < H);  k, v likewise
 * with g < KV heads;  query head h uses KV head h / (H / KV).  Typically q, k, v point into
 * one fused [n, (H + 2 KV) hd] buffer with qkv_stride = (H + 2 KV) hd.  Query t of
 * sequence b attends to the keys [doc[b*T + t], t] of its sequence: its own document's,
 * causally ("Documents" above; doc NULL: keys [0, t]).
 * out[(b*T + t)*H*hd + h*hd + i] (contiguous);  lse[(b*H + h)*T + t] = log-sum-exp of row
 * t's scaled scores (fp32), which the backward rebuilds the probabilities from.  Never
 * stores a T x T matrix.
 * bwd: dq, dk, dv (the layout and stride of q, k, v) are written. */
TSR_OP(attention_fwd, (tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                       const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                       const int32_t *doc),
       (dt, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc))
TSR_OP(attention_bwd, (tsr_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                       const void *out, const float *lse, const void *q, const void *k,
                       const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                       const int32_t *doc),
       (dt, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, doc))

/* ---- attention over one block of keys, for a sequence cut into chunks (context
 * parallelism, docs/context_parallel.md): the pieces of a causal attention that is summed
 * block by block and merged with the log-sum-exp.  Same heads, scale and GQA as above.
 * B sequences; of each, Tq query rows at global positions q0 .. q0+Tq-1 and a block of Tk
 * keys at k0 .. k0+Tk-1: q element (b, t, h, i) at q[(b*Tq + t)*q_stride + h*hd + i], k and
 * v at [(b*Tk + t)*kv_stride + g*hd + i].  causal: the query at position p sees the keys at
 * positions <= p (a block entirely right of every query is fully masked: see
 * tsr_ops_attn_block_kind, ops.h); causal 0: it sees the whole block.  A query that sees
 * no key of the block has out 0 and lse -inf (the identity of attention_merge).
 * fwd: out[(b*Tq + t)*H*hd + h*hd + i] and lse[(b*H + h)*Tq + t], both fp32 whatever dt:
 * the block's partial result, which attention_merge folds into a running one.
 * bwd: given the FINAL out (dt, as attention_fwd's), its lse (the log-sum-exp over every
 * block) and dout, ACCUMULATES (+=, fp32) this block's terms into dq [B*Tq, H*hd], dk and
 * dv [B*Tk, KV*hd] (contiguous); the sum over all blocks of a query's (a key's) terms is
 * attention_bwd's dq (dk, dv).  With one block, q0 = k0 and Tq = Tk = T these are
 * attention_fwd and attention_bwd (doc NULL) up to the output types.
 * doc (documents, int32 op memory [B*Tq], or NULL): query row t of sequence b sees only
 * the keys of the block at rows j >= doc[b*Tq + t] (0 <= doc <= Tk, not decreasing along
 * t): its document's start, in the block's rows. */
TSR_OP(attention_block_fwd, (tsr_dtype dt, float *out, float *lse, const void *q, const void *k,
                             const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                             int q_stride, int kv_stride, long q0, long k0, int causal,
                             const int32_t *doc),
       (dt, out, lse, q, k, v, B, Tq, Tk, H, KV, hd, q_stride, kv_stride, q0, k0, causal, doc))
TSR_OP(attention_block_bwd, (tsr_dtype dt, float *dq, float *dk, float *dv, const void *dout,
                             const void *out, const float *lse, const void *q, const void *k,
                             const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                             int q_stride, int kv_stride, long q0, long k0, int causal,
                             const int32_t *doc),
       (dt, dq, dk, dv, dout, out, lse, q, k, v, B, Tq, Tk, H, KV, hd, q_stride, kv_stride, q0,
        k0, causal, doc))
/* Two partial attentions of the same queries over disjoint key sets, (o1, lse1) and
 * (o2, lse2), as one over their union: with m = max(lse1, lse2),
 *   lse = m + log(exp(lse1 - m) + exp(lse2 - m)),  out = exp(lse1 - lse) o1 + exp(lse2 - lse) o2
 * (fp32; a side with lse -inf counts for nothing; both -inf: out 0, lse -inf).  out and lse
 * are [n_rows, H*hd] and [(b*H + h)*T + t] as attention_block_fwd's, n_rows = B*T; out may
 * be o1 (or o2) and lse lse1 (or lse2): the running result updated in place. */
TSR_OP(attention_merge, (float *out, float *lse, const float *o1, const float *lse1,
                         const float *o2, const float *lse2, int B, int T, int H, int hd),
       (out, lse, o1, lse1, o2, lse2, B, T, H, hd))

/* ---- activations ----
 * SwiGLU: gate_up[r] = [gate (F) | up (F)], out[r, j] = silu(gate_j) * up_j;  the backward
 * writes dgate_up.  GELU, tanh approximation: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))); its backward is fused into matmul_bwd (gelu_pre). */
TSR_OP(swiglu_fwd, (tsr_dtype dt, void *out, const void *gate_up, int n, int F),
       (dt, out, gate_up, n, F))
TSR_OP(swiglu_bwd, (tsr_dtype dt, void *dgate_up, const void *dout, const void *gate_up, int n,
                    int F),
       (dt, dgate_up, dout, gate_up, n, F))
TSR_OP(gelu_fwd, (tsr_dtype dt, void *out, const void *x, long n_elem), (dt, out, x, n_elem))

/* ---- element-wise ----
 * residual: out = x + y, rounded (out may be x).  add, acc: fp32 (parameter gradients):
 * out = a + b, out += a. */
TSR_OP(residual, (tsr_dtype dt, void *out, const void *x, const void *y, long n_elem),
       (dt, out, x, y, n_elem))
TSR_OP(add, (float *out, const float *a, const float *b, long n_elem), (out, a, b, n_elem))
TSR_OP(acc, (float *out, const float *a, long n_elem), (out, a, n_elem))
/* dst = src converted (widened exactly, or rounded to nearest even); n_elem elements.
 * dst and src may be the same memory only when the types are equal. */
TSR_OP(cast, (tsr_dtype dst_dt, void *dst, tsr_dtype src_dt, const void *src, long n_elem),
       (dst_dt, dst, src_dt, src, n_elem))

/* rows of width bytes from src (rows src_pitch bytes apart) to dst (dst_pitch apart):
 * a strided block copy (context parallelism's packing of keys, values and heads) */
TSR_OP(copy_2d, (void *dst, long dst_pitch, const void *src, long src_pitch, long width,
                 long rows),
       (dst, dst_pitch, src, src_pitch, width, rows))

/* ---- cross-entropy over logits[n, V] (this rank's vocabulary columns) ----
 * xent: *acc += (sum over rows of -log softmax(logits)[target]) / div, in double, in op
 * memory (a device adds it on the device: the host reads it once per step).  With grad,
 * logits are overwritten with dloss * (softmax - onehot(target)), in dt: the LM head's
 * output gradient.  One rank holds the whole vocabulary (vocab_start 0); a target outside
 * [0, V) is ignored (adds 0, gradient 0). */
TSR_OP(xent, (tsr_dtype dt, double *acc, double div, void *logits, const int32_t *targets, int n,
              int V, float dloss, int grad),
       (dt, acc, div, logits, targets, n, V, dloss, grad))
/* Vocab-parallel cross-entropy (tensor parallel: the full logits never exist).  This rank
 * holds columns [vocab_start, vocab_start + V) of every row; the caller reduces over the
 * tp group between the passes:
 *   1. local_stats: row_max[r] = max over local columns; target_logit[r] = the target's
 *      logit when this rank holds its column, else 0.  -> all-reduce MAX, SUM
 *   2. local_sumexp: sumexp[r] = sum over local columns of exp(z - row_max[r]) -> SUM
 *   3. xent_rows: *acc += (sum over rows of log sumexp + row_max - target_logit) / div
 *   4. xent_grad (training): logits := dloss * (exp(z - row_max) / sumexp - onehot).
 * Every target must be a token of the whole vocabulary (no ignore index here). */
TSR_OP(xent_local_stats, (tsr_dtype dt, double *row_max, double *target_logit, const void *logits,
                          const int32_t *targets, int n, int V, int vocab_start),
       (dt, row_max, target_logit, logits, targets, n, V, vocab_start))
TSR_OP(xent_local_sumexp, (tsr_dtype dt, double *sumexp, const void *logits,
                           const double *row_max, int n, int V),
       (dt, sumexp, logits, row_max, n, V))
TSR_OP(xent_rows, (double *acc, double div, const double *row_max, const double *sumexp,
                   const double *target_logit, int n),
       (acc, div, row_max, sumexp, target_logit, n))
TSR_OP(xent_grad, (tsr_dtype dt, void *logits, const int32_t *targets, const double *row_max,
                   const double *sumexp, int n, int V, int vocab_start, float dloss),
       (dt, logits, targets, row_max, sumexp, n, V, vocab_start, dloss))
/* The LM head fused with xent (one rank holds the vocabulary): the full logits [n, V]
 * never exist.  The rows of x [n, C] are taken `chunk` at a time (the last chunk may be
 * shorter; chunk <= 0 or > n: all n at once); a chunk's logits x_c w^T (w [V, C]) are
 * stored in scratch ([min(chunk, n), V] of dt) and treated as xent treats its logits:
 * *acc += (the chunk's loss sum) / div when acc != NULL; when dx or dw is wanted they are
 * replaced by g = dloss * (softmax - onehot(target)), and dx_c = g w is written (dx
 * [n, C]), dw [V, C] += g^T x_c (fp32).  Row by row this is matmul_fwd, xent and
 * matmul_bwd on the same values (a 16-bit chunk rounds its logits and g once, as they
 * would be stored); the loss is summed in xent's order; dw adds one chunk at a time.  A
 * target outside [0, V) is ignored (no loss, g = 0). */
TSR_OP(xent_head, (tsr_dtype dt, double *acc, double div, void *dx, float *dw, const void *x,
                   const void *w, const int32_t *targets, void *scratch, int n, int C, int V,
                   int chunk, float dloss),
       (dt, acc, div, dx, dw, x, w, targets, scratch, n, C, V, chunk, dloss))

/* ---- AdamW as torch.optim.AdamW (decoupled decay, bias-corrected), over n fp32 elements:
 * g is first multiplied by grad_scale (clipping, 1/loss-scale);  p *= 1 - lr*wd;
 * m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= (lr / (1-b1^t)) m / (sqrt(v) /
 * sqrt(1-b2^t) + eps), with the scalars of tsr_ops_adamw_scalars; t is 1-based.  out
 * (NULL: none) receives the new p stored as out_dt in the same pass: the refresh of the
 * compute copy, bitwise what tsr_ops_cast of p gives.  out overlaps none of p, m, v, g. */
TSR_OP(adamw, (float *p, float *m, float *v, const float *g, long n, float lr, float beta1,
               float beta2, float eps, float weight_decay, long t, float grad_scale, void *out,
               tsr_dtype out_dt),
       (p, m, v, g, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale, out, out_dt))

/* ---- reductions ----
 * The sum over k < n_ranges, in order, of the squares of x[r[2k] .. r[2k+1]) (fp32 values,
 * summed in double; r is host memory): a device computes every range before its one
 * synchronisation.  The sum of one range is bitwise the same for every thread count. */
TSR_OP_RET(double, sumsq_ranges, (const float *x, const int64_t *r, int n_ranges),
           (x, r, n_ranges))
