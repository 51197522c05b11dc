/* attn_f32.cu — causal grouped-query attention, flash-style, forward and backward, with
 * fp32 arithmetic on fp32, bf16 or fp16 storage: the attention of fp32 runs, and of 16-bit
 * runs where no tensor-core kernel takes the head dimension (attention.cu decides).
 *
 * Tiles of BQ = 32 queries by BK = 32 keys, 256 threads.  Thread (row = tid/8, sub =
 * tid%8) owns one query (or key) row of the tile and head dimensions sub, sub+8, ...;
 * the 8 threads of a row sit in one aligned group of lanes, so row reductions are three
 * xor shuffles.  Tiles live in shared memory as fp32 with rows padded to hd+1 floats
 * (conflict-free column access).
 *
 * Forward: one block per (query tile, b, h) walks the key tiles up to the diagonal with
 * an online softmax (running max m, sum l, rescaled output rows).
 * Backward (D given): one kernel per key tile (b, kv head) sums dk, dv over the group's
 * query heads and the query tiles at or below the diagonal, one kernel per query tile
 * (b, h) sums dq over the key tiles; both rebuild P = exp(scale * q.k - lse) and write
 * their outputs.  Documents (doc): attn.cuh.
 *
 * The kernels take the queries and the keys as two sets of rows (Tq and Tk per sequence,
 * strides of their own) and a diagonal offset off: query row i sees key row j when
 * j <= i + off.  attention_fwd/bwd run them with Tq = Tk = T and off = 0; the block ops of
 * a chunked sequence (attention.cu, tsr_attn_f32_block_*) with the block's rows and off,
 * an fp32 out (TO) and fp32 gradients added to (ACC). */
#include "attn.cuh"

#define BQ 32
#define BK 32
#define ATT_THREADS 256

/* Copy rows [row0, row0 + nrows) of one head (columns [col0, col0 + hd)) of a strided
 * buffer into a padded fp32 tile; rows at or beyond T are zero. */
template <class T>
__device__ __forceinline__ void load_tile(float *tile, const T *src, int row0, int nrows, int T_,
                                          size_t batch_off, int stride, int col0, int hd) {
  const int ld = hd + 1;
  for (int idx = threadIdx.x; idx < nrows * hd; idx += ATT_THREADS) {
    const int rr = idx / hd, d = idx - rr * hd, t = row0 + rr;
    tile[rr * ld + d] = t < T_ ? to_f32(src[batch_off + (size_t)t * stride + col0 + d]) : 0.0f;
  }
}

/* out[j] = a . b_j for the rows b_j = b + j * step (j < N): a is read once for all N. */
template <int N>
__device__ __forceinline__ void dot_rows(float (&out)[N], const float *a, const float *b, int step,
                                         int hd) {
#pragma unroll
  for (int j = 0; j < N; j++) out[j] = 0.0f;
  for (int d = 0; d < hd; d++) {
    const float x = a[d];
#pragma unroll
    for (int j = 0; j < N; j++) out[j] += x * b[j * step + d];
  }
}

/* o[i] += sum over the tile's BK rows c of w[c] * tile[c * ld + d], for this thread's
 * head dims d = sub + 8 i below hd (P V in the forward, dS K for dq). */
template <int DPT>
__device__ __forceinline__ void weighted_rows(float (&o)[DPT], const float *w, const float *tile,
                                              int ld, int sub, int hd) {
  for (int c = 0; c < BK; c++) {
    const float x = w[c];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) o[i] += x * tile[c * ld + d];
    }
  }
}

/* a gradient element: written (ACC false, as G) or added to (ACC true, fp32 only) */
template <bool ACC>
__device__ __forceinline__ void put_grad(float *p, float x) {
  if (ACC) *p += x;
  else *p = x;
}
template <bool ACC, class G>
__device__ __forceinline__ void put_grad(G *p, float x) {
  *p = from_f32<G>(x);
}

/* ---------------------------------------------------------------- forward */

template <class T, class TO, int DPT> /* DPT = head dims per thread = ceil(hd / 8) bound */
__global__ void __launch_bounds__(ATT_THREADS)
    flash_fwd_kernel(TO *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc,
                     int Tq, int Tk, int H, int KV, int hd, int q_stride, int kv_stride, int off,
                     float scale) {
  extern __shared__ __align__(32) float smem[];
  const int ld = hd + 1;
  float *Qs = smem, *Ks = Qs + BQ * ld, *Vs = Ks + BK * ld, *Ps = Vs + BK * ld; /* Ps: [BQ][BK+1] */
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = blockIdx.x * BQ;
  const int row = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const int tq = q0 + row;
  const size_t qoff = (size_t)b * Tq * q_stride, koff = (size_t)b * Tk * kv_stride;

  load_tile(Qs, q, q0, BQ, Tq, qoff, q_stride, h * hd, hd);
  float m = -INFINITY, l = 0.0f, o[DPT];
#pragma unroll
  for (int i = 0; i < DPT; i++) o[i] = 0.0f;

  const int32_t *dc = doc ? doc + (size_t)b * Tq : NULL;
  const int kstart = tq < Tq && dc ? dc[tq] : 0; /* this row's first key */
  const int kend = min(q0 + BQ + off, Tk); /* keys this tile's queries can see */
  for (int k0 = dc ? dc[q0] / BK * BK : 0; k0 < kend; k0 += BK) {
    __syncthreads(); /* the previous tile's Ks/Vs/Ps are no longer read */
    load_tile(Ks, k, k0, BK, Tk, koff, kv_stride, g * hd, hd);
    load_tile(Vs, v, k0, BK, Tk, koff, kv_stride, g * hd, hd);
    __syncthreads();
    float s[BK / 8], tile_max = -INFINITY;
    dot_rows(s, Qs + row * ld, Ks + sub * ld, 8 * ld, hd); /* keys sub, sub+8, ... */
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
      const int key = k0 + sub + 8 * j;
      s[j] = (key <= tq + off && key < Tk && key >= kstart) ? scale * s[j] : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
#pragma unroll
    for (int x = 1; x < 8; x <<= 1)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, x));
    const float m_new = fmaxf(m, tile_max);
    /* a row whose document starts past this tile has seen no key yet: m_new = -inf */
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = expf(m - m_use);
    float rowsum = 0.0f;
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
      const float p = expf(s[j] - m_use);
      Ps[row * (BK + 1) + sub + 8 * j] = p;
      rowsum += p;
    }
#pragma unroll
    for (int x = 1; x < 8; x <<= 1) rowsum += __shfl_xor_sync(0xffffffffu, rowsum, x);
    l = l * corr + rowsum;
    m = m_new;
    __syncthreads(); /* Ps complete */
#pragma unroll
    for (int i = 0; i < DPT; i++) o[i] *= corr;
    weighted_rows(o, Ps + row * (BK + 1), Vs, ld, sub, hd);
  }
  if (tq < Tq) {
    TO *dst = out + ((size_t)b * Tq + tq) * H * hd + (size_t)h * hd;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f; /* no key seen: out 0, lse -inf */
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) dst[d] = from_f32<TO>(o[i] * inv);
    }
    if (sub == 0) lse[((size_t)b * H + h) * Tq + tq] = m + logf(l);
  }
}

/* --------------------------------------------------------------- backward */

/* The query side of the backward for queries [q0, q0 + BQ) of head h: their Q and dout
 * tiles and their lse and D statistics (rows past T as zeros). */
template <class T>
__device__ __forceinline__ void load_query_side(float *Qs, float *dOs, float *Ls, float *Ds,
                                                const T *q, const T *dout, const float *lse,
                                                const float *D, int b, int h, int q0, int Tq,
                                                int H, int hd, int q_stride) {
  load_tile(Qs, q, q0, BQ, Tq, (size_t)b * Tq * q_stride, q_stride, h * hd, hd);
  load_tile(dOs, dout, q0, BQ, Tq, (size_t)b * Tq * H * hd, H * hd, h * hd, hd);
  load_stats<BQ, ATT_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * Tq, q0, Tq);
}

/* dq of one query tile: dq_t = scale * sum_j P_tj (dP_tj - D_t) k_j (rows dq_stride apart) */
template <class T, class G, bool ACC, int DPT>
__global__ void __launch_bounds__(ATT_THREADS)
    flash_dq_kernel(G *dq, const T *dout, const float *lse, const float *D, const T *q,
                    const T *k, const T *v, const int32_t *doc, int Tq, int Tk, int H, int KV,
                    int hd, int q_stride, int kv_stride, int dq_stride, int off, float scale) {
  extern __shared__ __align__(32) float smem[];
  const int ld = hd + 1;
  float *Qs = smem, *dOs = Qs + BQ * ld, *Ks = dOs + BQ * ld, *Vs = Ks + BK * ld;
  float *dSs = Vs + BK * ld, *Ls = dSs + BQ * (BK + 1), *Ds = Ls + BQ;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = blockIdx.x * BQ;
  const int row = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const int tq = q0 + row;
  const size_t koff = (size_t)b * Tk * kv_stride;

  load_query_side(Qs, dOs, Ls, Ds, q, dout, lse, D, b, h, q0, Tq, H, hd, q_stride);
  float sum[DPT];
#pragma unroll
  for (int i = 0; i < DPT; i++) sum[i] = 0.0f;

  const int32_t *dc = doc ? doc + (size_t)b * Tq : NULL;
  const int kstart = tq < Tq && dc ? dc[tq] : 0;
  const int kend = min(q0 + BQ + off, Tk);
  for (int k0 = dc ? dc[q0] / BK * BK : 0; k0 < kend; k0 += BK) {
    __syncthreads();
    load_tile(Ks, k, k0, BK, Tk, koff, kv_stride, g * hd, hd);
    load_tile(Vs, v, k0, BK, Tk, koff, kv_stride, g * hd, hd);
    __syncthreads();
    float qk[BK / 8], dp[BK / 8];
    dot_rows(qk, Qs + row * ld, Ks + sub * ld, 8 * ld, hd);
    dot_rows(dp, dOs + row * ld, Vs + sub * ld, 8 * ld, hd);
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
      const int c = sub + 8 * j, key = k0 + c;
      float ds = 0.0f;
      if (key <= tq + off && key < Tk && tq < Tq && key >= kstart) {
        const float p = expf(scale * qk[j] - Ls[row]);
        ds = p * (dp[j] - Ds[row]);
      }
      dSs[row * (BK + 1) + c] = ds;
    }
    __syncthreads();
    weighted_rows(sum, dSs + row * (BK + 1), Ks, ld, sub, hd);
  }
  if (tq < Tq) {
    G *dst = dq + ((size_t)b * Tq + tq) * dq_stride + (size_t)h * hd;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) put_grad<ACC>(dst + d, scale * sum[i]);
    }
  }
}

/* dk, dv of one key tile of kv head g: sums over the group's query heads (outer) and
 * the query tiles from the diagonal down (inner), rows in order within a tile.
 *   dv_j = sum_t P_tj dout_t;   dk_j = scale * sum_t P_tj (dP_tj - D_t) q_t
 * (rows dkv_stride apart) */
template <class T, class G, bool ACC, int DPT>
__global__ void __launch_bounds__(ATT_THREADS)
    flash_dkdv_kernel(G *dk, G *dv, const T *dout, const float *lse, const float *D, const T *q,
                      const T *k, const T *v, const int32_t *doc, int Tq, int Tk, int H, int KV,
                      int hd, int q_stride, int kv_stride, int dkv_stride, int off, float scale) {
  extern __shared__ __align__(32) float smem[];
  const int ld = hd + 1;
  float *Ks = smem, *Vs = Ks + BK * ld, *Qs = Vs + BK * ld, *dOs = Qs + BQ * ld;
  float *Ps = dOs + BQ * ld, *dSs = Ps + BQ * (BK + 1), *Ls = dSs + BQ * (BK + 1), *Ds = Ls + BQ;
  const int group = H / KV;
  const int b = blockIdx.y / KV, g = blockIdx.y % KV;
  const int j0 = blockIdx.x * BK;
  const int col = threadIdx.x >> 3, sub = threadIdx.x & 7; /* col: this thread's key */
  const int key = j0 + col;
  const size_t koff = (size_t)b * Tk * kv_stride;

  load_tile(Ks, k, j0, BK, Tk, koff, kv_stride, g * hd, hd);
  load_tile(Vs, v, j0, BK, Tk, koff, kv_stride, g * hd, hd);
  float sk[DPT], sv[DPT];
#pragma unroll
  for (int i = 0; i < DPT; i++) sk[i] = sv[i] = 0.0f;

  const int32_t *dc = doc ? doc + (size_t)b * Tq : NULL;
  const int qfirst = j0 - off > 0 ? (j0 - off) / BQ * BQ : 0; /* the tile of row j0 - off */
  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int q0 = qfirst; q0 < Tq; q0 += BQ) {
      if (dc && dc[q0] >= j0 + BK) break; /* these queries' and later ones' documents start later */
      __syncthreads(); /* previous Qs/dOs/Ps/dSs reads are done (first pass: Ks/Vs loaded) */
      load_query_side(Qs, dOs, Ls, Ds, q, dout, lse, D, b, h, q0, Tq, H, hd, q_stride);
      __syncthreads();
      float qk[BQ / 8], dp[BQ / 8];
      dot_rows(qk, Ks + col * ld, Qs + sub * ld, 8 * ld, hd); /* queries sub, sub+8, ... */
      dot_rows(dp, Vs + col * ld, dOs + sub * ld, 8 * ld, hd);
#pragma unroll
      for (int j = 0; j < BQ / 8; j++) {
        const int rr = sub + 8 * j, t = q0 + rr;
        float p = 0.0f, ds = 0.0f;
        if (t < Tq && key <= t + off && key < Tk && (!dc || key >= dc[t])) {
          p = expf(scale * qk[j] - Ls[rr]);
          ds = p * (dp[j] - Ds[rr]);
        }
        Ps[rr * (BK + 1) + col] = p;
        dSs[rr * (BK + 1) + col] = ds;
      }
      __syncthreads();
      for (int rr = 0; rr < BQ; rr++) {
        const float p = Ps[rr * (BK + 1) + col], ds = dSs[rr * (BK + 1) + col];
#pragma unroll
        for (int i = 0; i < DPT; i++) {
          const int d = sub + 8 * i;
          if (d < hd) {
            sv[i] += p * dOs[rr * ld + d];
            sk[i] += ds * Qs[rr * ld + d];
          }
        }
      }
    }
  }
  if (key < Tk) {
    const size_t at = ((size_t)b * Tk + key) * dkv_stride + (size_t)g * hd;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) {
        if (dk) put_grad<ACC>(dk + at + d, scale * sk[i]);
        if (dv) put_grad<ACC>(dv + at + d, sv[i]);
      }
    }
  }
}

/* ------------------------------------------------------------------ drivers */

static size_t fwd_smem(int hd) {
  return (size_t)((BQ + 2 * BK) * (hd + 1) + BQ * (BK + 1)) * sizeof(float);
}
static size_t dq_smem(int hd) {
  return (size_t)((2 * BQ + 2 * BK) * (hd + 1) + BQ * (BK + 1) + 2 * BQ) * sizeof(float);
}
static size_t dkdv_smem(int hd) {
  return (size_t)((2 * BK + 2 * BQ) * (hd + 1) + 2 * BQ * (BK + 1) + 2 * BQ) * sizeof(float);
}

template <class T, class TO, int DPT>
static int flash_fwd(TO *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc,
                     int B, int Tq, int Tk, int H, int KV, int hd, int q_stride, int kv_stride,
                     int off) {
  const size_t smem = fwd_smem(hd);
  TSR_CUDA_CALL(allow_smem(flash_fwd_kernel<T, TO, DPT>, smem));
  const dim3 grid((Tq + BQ - 1) / BQ, B * H);
  flash_fwd_kernel<T, TO, DPT><<<grid, ATT_THREADS, smem, tsr_cuda_ctx.stream>>>(
      out, lse, q, k, v, doc, Tq, Tk, H, KV, hd, q_stride, kv_stride, off,
      (float)(1.0 / sqrt((double)hd)));
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* the backward: dq rows dq_stride apart, dk and dv rows dkv_stride apart, written (G = T)
 * or added to (ACC, G = float) */
template <class T, class G, bool ACC, int DPT>
static int flash_bwd(G *dq, G *dk, G *dv, const T *dout, const float *lse, const float *D,
                     const T *q, const T *k, const T *v, const int32_t *doc, int B, int Tq,
                     int Tk, int H, int KV, int hd, int q_stride, int kv_stride, int dq_stride,
                     int dkv_stride, int off) {
  const float scale = (float)(1.0 / sqrt((double)hd));
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  if (dq) {
    const size_t smem = dq_smem(hd);
    TSR_CUDA_CALL(allow_smem(flash_dq_kernel<T, G, ACC, DPT>, smem));
    flash_dq_kernel<T, G, ACC, DPT><<<dim3((Tq + BQ - 1) / BQ, B * H), ATT_THREADS, smem,
                                      stream>>>(dq, dout, lse, D, q, k, v, doc, Tq, Tk, H, KV, hd,
                                                q_stride, kv_stride, dq_stride, off, scale);
    TSR_CUDA_LAUNCHED();
  }
  if (dk || dv) {
    const size_t smem = dkdv_smem(hd);
    TSR_CUDA_CALL(allow_smem(flash_dkdv_kernel<T, G, ACC, DPT>, smem));
    flash_dkdv_kernel<T, G, ACC, DPT><<<dim3((Tk + BK - 1) / BK, B * KV), ATT_THREADS, smem,
                                        stream>>>(dk, dv, dout, lse, D, q, k, v, doc, Tq, Tk, H,
                                                  KV, hd, q_stride, kv_stride, dkv_stride, off,
                                                  scale);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

/* head_dim <= 64 uses 8 sums per thread, up to 128 uses 16 */
int tsr_attn_f32_fwd(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc) {
  TSR_CUDA_ARG(hd > 0 && hd <= ATT_HD_MAX);
  TSR_DTYPE_SWITCH(dt, S,
                   return hd <= 64 ? flash_fwd<S, S, 8>((S *)out, lse, (const S *)q, (const S *)k,
                                                        (const S *)v, doc, B, T, T, H, KV, hd,
                                                        qkv_stride, qkv_stride, 0)
                                   : flash_fwd<S, S, 16>((S *)out, lse, (const S *)q,
                                                         (const S *)k, (const S *)v, doc, B, T, T,
                                                         H, KV, hd, qkv_stride, qkv_stride, 0));
  return 0;
}

int tsr_attn_f32_bwd(tsr_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                     const float *lse, const float *D, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc) {
  TSR_CUDA_ARG(hd > 0 && hd <= ATT_HD_MAX);
  TSR_DTYPE_SWITCH(dt, S,
                   return hd <= 64
                              ? flash_bwd<S, S, false, 8>(
                                    (S *)dq, (S *)dk, (S *)dv, (const S *)dout, lse, D,
                                    (const S *)q, (const S *)k, (const S *)v, doc, B, T, T, H, KV,
                                    hd, qkv_stride, qkv_stride, qkv_stride, qkv_stride, 0)
                              : flash_bwd<S, S, false, 16>(
                                    (S *)dq, (S *)dk, (S *)dv, (const S *)dout, lse, D,
                                    (const S *)q, (const S *)k, (const S *)v, doc, B, T, T, H, KV,
                                    hd, qkv_stride, qkv_stride, qkv_stride, qkv_stride, 0));
  return 0;
}

int tsr_attn_f32_block_fwd(tsr_dtype dt, float *out, float *lse, const void *q, const void *k,
                           const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                           int q_stride, int kv_stride, int off, const int32_t *doc) {
  TSR_CUDA_ARG(hd > 0 && hd <= ATT_HD_MAX);
  TSR_DTYPE_SWITCH(dt, S,
                   return hd <= 64 ? flash_fwd<S, float, 8>(out, lse, (const S *)q, (const S *)k,
                                                            (const S *)v, doc, B, Tq, Tk, H, KV,
                                                            hd, q_stride, kv_stride, off)
                                   : flash_fwd<S, float, 16>(out, lse, (const S *)q, (const S *)k,
                                                             (const S *)v, doc, B, Tq, Tk, H, KV,
                                                             hd, q_stride, kv_stride, off));
  return 0;
}

int tsr_attn_f32_block_bwd(tsr_dtype dt, float *dq, float *dk, float *dv, const void *dout,
                           const float *lse, const float *D, const void *q, const void *k,
                           const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                           int q_stride, int kv_stride, int off, const int32_t *doc) {
  TSR_CUDA_ARG(hd > 0 && hd <= ATT_HD_MAX);
  TSR_DTYPE_SWITCH(dt, S,
                   return hd <= 64
                              ? flash_bwd<S, float, true, 8>(
                                    dq, dk, dv, (const S *)dout, lse, D, (const S *)q,
                                    (const S *)k, (const S *)v, doc, B, Tq, Tk, H, KV, hd,
                                    q_stride, kv_stride, H * hd, KV * hd, off)
                              : flash_bwd<S, float, true, 16>(
                                    dq, dk, dv, (const S *)dout, lse, D, (const S *)q,
                                    (const S *)k, (const S *)v, doc, B, Tq, Tk, H, KV, hd,
                                    q_stride, kv_stride, H * hd, KV * hd, off));
  return 0;
}
