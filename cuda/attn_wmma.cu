/* attn_wmma.cu — causal grouped-query attention on the tensor cores through WMMA (16x16x16
 * fragments of the storage type, bf16 or fp16, fp32 accumulation): the default for 16-bit
 * runs (attention.cu).  q, k, v, dout are read as stored; P and dS are rounded to the
 * storage type for their products; softmax statistics and accumulators are fp32.  head_dim
 * 32, 64, 96 or 128.
 *
 * Blocks of 4 warps own 64 rows (attn.cuh); the blocks with the most tiles start first
 * (the last query tiles, the first key tiles), so that short ones fill the tail of the
 * grid.  Each warp writes its 16 x 64 score tile to its own shared-memory strip, its 32
 * lanes (two per row, 32 columns each) apply the mask and the softmax there and write P
 * (or dS) back in the storage type for the next product.  The forward keeps its output
 * rows in registers (two lanes per row, hd/2 columns each), rescaled by the online
 * softmax; P V comes back through the strip.  WMMA wants 32-byte aligned fragment
 * pointers: every offset below is a multiple of 32 bytes, and the kernels' dynamic shared
 * memory is declared __align__(32). */
#include <mma.h>

#include "attn.cuh"

namespace wmma = nvcuda::wmma;
template <class T> struct wm {
  typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bt; /* B = X^T */
  typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
};
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* The backward kernels' shared memory, carved for warp w: four 16-bit tiles (which holds
 * what is the kernel's choice), this warp's two fp32 strips (scores S, dP) and two 16-bit
 * strips (P, dS), then lse and D of a query tile. */
template <class T, int HD> struct tc_bwd_layout {
  typedef tc_dims<HD> Dm;
  static const size_t STRIPS = 4 * Dm::TILE, PSTRIPS = STRIPS + 2 * TC_WARPS * Dm::FSTRIP,
                      STATS = PSTRIPS + 2 * TC_WARPS * Dm::PSTRIP;
  static const size_t BYTES = STATS + 2 * TC_ROWS * sizeof(float);
  T *tile[4], *P, *dS;
  float *S, *dP, *Ls, *Ds;
  __device__ tc_bwd_layout(void *smem, int w) {
    char *base = (char *)smem;
    for (int i = 0; i < 4; i++) tile[i] = (T *)(base + i * Dm::TILE);
    S = (float *)(base + STRIPS + w * Dm::FSTRIP);
    dP = (float *)(base + STRIPS + (TC_WARPS + w) * Dm::FSTRIP);
    P = (T *)(base + PSTRIPS + w * Dm::PSTRIP);
    dS = (T *)(base + PSTRIPS + (TC_WARPS + w) * Dm::PSTRIP);
    Ls = (float *)(base + STATS);
    Ds = Ls + TC_ROWS;
  }
};

/* strip[0..16) x [0..64) = A_w (16 x HD, rows of `a`) times the 64 rows of `bt`, transposed */
template <class T, int HD>
__device__ __forceinline__ void tc_scores(float *strip, const T *a, const T *bt) {
  const int LDB = tc_dims<HD>::LDB;
  typename wm<T>::a fa[HD / 16];
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) wmma::load_matrix_sync(fa[kk], a + 16 * kk, LDB);
#pragma unroll
  for (int j = 0; j < TC_ROWS / 16; j++) {
    frag_c c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      typename wm<T>::bt fb;
      wmma::load_matrix_sync(fb, bt + 16 * j * LDB + 16 * kk, LDB);
      wmma::mma_sync(c, fa[kk], fb, c);
    }
    wmma::store_matrix_sync(strip + 16 * j, c, tc_dims<HD>::LDF, wmma::mem_row_major);
  }
}

/* sum[n] += P_w (16 x 64 strip) times the 64 x HD tile b, per 16 columns n */
template <class T, int HD>
__device__ __forceinline__ void tc_product(frag_c (&sum)[HD / 16], const T *p, const T *b) {
  const int LDB = tc_dims<HD>::LDB;
#pragma unroll
  for (int kk = 0; kk < TC_ROWS / 16; kk++) {
    typename wm<T>::a fa;
    wmma::load_matrix_sync(fa, p + 16 * kk, tc_dims<HD>::LDP);
#pragma unroll
    for (int n = 0; n < HD / 16; n++) {
      typename wm<T>::b fb;
      wmma::load_matrix_sync(fb, b + 16 * kk * LDB + 16 * n, LDB);
      wmma::mma_sync(sum[n], fa, fb, sum[n]);
    }
  }
}

/* dst[row, col0 + c] = mul * strip[r][c] for this warp's 16 rows (rows past T skipped) */
template <class T, int HD>
__device__ __forceinline__ void tc_store_rows(T *dst, const float *strip, int row0, int T_,
                                              size_t batch_off, int stride, int col0, float mul) {
  const int lane = threadIdx.x & 31;
  for (int idx = lane; idx < 16 * HD; idx += 32) {
    const int r = idx / HD, c = idx - r * HD, t = row0 + r;
    if (t < T_)
      dst[batch_off + (size_t)t * stride + col0 + c] =
          from_f32<T>(mul * strip[r * tc_dims<HD>::LDF + c]);
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    wmma_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H,
                    int KV, int qkv_stride, float scale) {
  typedef tc_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, hl = lane & 1;
  char *base = (char *)smem;
  T *Qs = (T *)base, *Ks = (T *)(base + Dm::TILE), *Vs = (T *)(base + 2 * Dm::TILE);
  float *S = (float *)(base + 3 * Dm::TILE + w * Dm::FSTRIP);
  T *P = (T *)(base + 3 * Dm::TILE + TC_WARPS * Dm::FSTRIP + w * Dm::PSTRIP);
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, tq = q0 + 16 * w + r;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  float o[HD / 2], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
  /* K's next tile is fetched during P V, V's during the scores and the softmax */
  uint2 pre[TC_LOADS(HD)];
  tc_fetch<T, HD>(pre, k, 0, T_, boff, qkv_stride, g * HD);
  for (int k0 = 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads(); /* the previous tile is no longer read */
    tc_put<T, HD>(Ks, pre);
    tc_fetch<T, HD>(pre, v, k0, T_, boff, qkv_stride, g * HD);
    __syncthreads();
    tc_scores<T, HD>(S, Qs + 16 * w * Dm::LDB, Ks);
    __syncwarp();
    float s[32], tmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int key = k0 + 32 * hl + i;
      s[i] = (key <= tq && key < T_) ? scale * S[r * Dm::LDF + 32 * hl + i] : -INFINITY;
      tmax = fmaxf(tmax, s[i]);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    const float m_new = fmaxf(m, tmax), m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = expf(m - m_use);
    float rowsum = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const float p = expf(s[i] - m_use);
      P[r * Dm::LDP + 32 * hl + i] = from_f32<T>(p);
      rowsum += p;
    }
    rowsum += __shfl_xor_sync(0xffffffffu, rowsum, 1);
    l = l * corr + rowsum;
    m = m_new;
    tc_put<T, HD>(Vs, pre);
    if (k0 + TC_ROWS <= q0 && k0 + TC_ROWS < T_)
      tc_fetch<T, HD>(pre, k, k0 + TC_ROWS, T_, boff, qkv_stride, g * HD);
    __syncthreads(); /* P written, S read, Vs complete */
    frag_c pv[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(pv[n], 0.0f);
    tc_product<T, HD>(pv, P, Vs);
#pragma unroll
    for (int n = 0; n < HD / 16; n++)
      wmma::store_matrix_sync(S + 16 * n, pv[n], Dm::LDF, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = o[i] * corr + S[r * Dm::LDF + (HD / 2) * hl + i];
  }
  if (tq < T_) {
    T *dst = out + ((size_t)b * T_ + tq) * H * HD + (size_t)h * HD + (HD / 2) * hl;
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dst[i] = from_f32<T>(o[i] * inv);
    if (hl == 0) lse[((size_t)b * H + h) * T_ + tq] = m + logf(l);
  }
}

/* dq of 64 queries of head h: dq = scale * dS K, dS = P (dP - D), dP = dout V^T */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    wmma_dq_kernel(T *dq, const T *dout, const float *lse, const float *D, const T *q,
                   const T *k, const T *v, int T_, int H, int KV, int qkv_stride, float scale) {
  typedef tc_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, hl = lane & 1;
  const tc_bwd_layout<T, HD> sm(smem, w);
  T *Qs = sm.tile[0], *dOs = sm.tile[1], *Ks = sm.tile[2], *Vs = sm.tile[3], *dS = sm.dS;
  float *S = sm.S, *dP = sm.dP, *Ls = sm.Ls, *Ds = sm.Ds;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, row = 16 * w + r, tq = q0 + row;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  tc_load<T, HD>(dOs, dout, q0, T_, (size_t)b * T_ * H * HD, H * HD, h * HD);
  load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
  frag_c sum[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(sum[n], 0.0f);
  /* V's tile is fetched during the scores, K's next one during dP, dS and dq */
  uint2 pre[TC_LOADS(HD)];
  tc_fetch<T, HD>(pre, k, 0, T_, boff, qkv_stride, g * HD);
  for (int k0 = 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads();
    tc_put<T, HD>(Ks, pre);
    tc_fetch<T, HD>(pre, v, k0, T_, boff, qkv_stride, g * HD);
    __syncthreads();
    tc_scores<T, HD>(S, Qs + 16 * w * Dm::LDB, Ks);
    tc_put<T, HD>(Vs, pre);
    if (k0 + TC_ROWS <= q0 && k0 + TC_ROWS < T_)
      tc_fetch<T, HD>(pre, k, k0 + TC_ROWS, T_, boff, qkv_stride, g * HD);
    __syncthreads();
    tc_scores<T, HD>(dP, dOs + 16 * w * Dm::LDB, Vs);
    __syncwarp();
#pragma unroll 8
    for (int i = 0; i < 32; i++) {
      const int c = 32 * hl + i, key = k0 + c;
      float ds = 0.0f;
      if (key <= tq && key < T_ && tq < T_) {
        const float p = expf(scale * S[r * Dm::LDF + c] - Ls[row]);
        ds = p * (dP[r * Dm::LDF + c] - Ds[row]);
      }
      dS[r * Dm::LDP + c] = from_f32<T>(ds);
    }
    __syncwarp();
    tc_product<T, HD>(sum, dS, Ks);
  }
#pragma unroll
  for (int n = 0; n < HD / 16; n++)
    wmma::store_matrix_sync(S + 16 * n, sum[n], Dm::LDF, wmma::mem_row_major);
  __syncwarp();
  tc_store_rows<T, HD>(dq, S, q0 + 16 * w, T_, boff, qkv_stride, h * HD, scale);
}

/* dk, dv of 64 keys from one query head h, over the query tiles from the diagonal on:
 * dv = P^T dout,  dk = scale * dS^T q, with P^T = K Q^T (masked, exp(scale s - lse))
 * and dP^T = V dout^T computed key-major.  One block per (key tile, b, query head), so
 * that the grid has B*H*T/64 blocks and not B*KV*T/64: under grouped-query attention
 * (part != NULL) each head's raw sums go to its own slice of part (attn.cuh). */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    wmma_dkdv_kernel(T *dk, T *dv, float *part, size_t part_stride, const T *dout,
                     const float *lse, const float *D, const T *q, const T *k, const T *v,
                     int T_, int H, int KV, int qkv_stride, float scale) {
  typedef tc_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, hl = lane & 1;
  const tc_bwd_layout<T, HD> sm(smem, w);
  T *Ks = sm.tile[0], *Vs = sm.tile[1], *Qs = sm.tile[2], *dOs = sm.tile[3];
  T *P = sm.P, *dS = sm.dS;
  float *S = sm.S, *dP = sm.dP, *Ls = sm.Ls, *Ds = sm.Ds;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int j0 = blockIdx.x * TC_ROWS, key = j0 + 16 * w + r;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Ks, k, j0, T_, boff, qkv_stride, g * HD);
  tc_load<T, HD>(Vs, v, j0, T_, boff, qkv_stride, g * HD);
  frag_c sum_k[HD / 16], sum_v[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    wmma::fill_fragment(sum_k[n], 0.0f);
    wmma::fill_fragment(sum_v[n], 0.0f);
  }
  {
    /* dout's tile is fetched during S^T, q's next one during dP^T, dS, dk and dv */
    const size_t doff = (size_t)b * T_ * H * HD;
    uint2 pre[TC_LOADS(HD)];
    tc_fetch<T, HD>(pre, q, j0, T_, boff, qkv_stride, h * HD);
    for (int q0 = j0; q0 < T_; q0 += TC_ROWS) {
      __syncthreads();
      tc_put<T, HD>(Qs, pre);
      tc_fetch<T, HD>(pre, dout, q0, T_, doff, H * HD, h * HD);
      load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
      __syncthreads();
      tc_scores<T, HD>(S, Ks + 16 * w * Dm::LDB, Qs); /* S^T: this warp's keys x 64 queries */
      tc_put<T, HD>(dOs, pre);
      if (q0 + TC_ROWS < T_) tc_fetch<T, HD>(pre, q, q0 + TC_ROWS, T_, boff, qkv_stride, h * HD);
      __syncthreads();
      tc_scores<T, HD>(dP, Vs + 16 * w * Dm::LDB, dOs); /* dP^T */
      __syncwarp();
#pragma unroll 8
      for (int i = 0; i < 32; i++) {
        const int c = 32 * hl + i, t = q0 + c;
        float p = 0.0f, ds = 0.0f;
        if (t < T_ && key <= t && key < T_) {
          p = expf(scale * S[r * Dm::LDF + c] - Ls[c]);
          ds = p * (dP[r * Dm::LDF + c] - Ds[c]);
        }
        P[r * Dm::LDP + c] = from_f32<T>(p);
        dS[r * Dm::LDP + c] = from_f32<T>(ds);
      }
      __syncwarp();
      tc_product<T, HD>(sum_v, P, dOs);
      tc_product<T, HD>(sum_k, dS, Qs);
    }
  }
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    wmma::store_matrix_sync(S + 16 * n, sum_k[n], Dm::LDF, wmma::mem_row_major);
    wmma::store_matrix_sync(dP + 16 * n, sum_v[n], Dm::LDF, wmma::mem_row_major);
  }
  __syncwarp();
  if (part) { /* this head's raw sums, rows (b, h, t) of hd floats */
    float *pk = part + ((size_t)b * H + h) * T_ * HD, *pv = pk + part_stride;
    for (int idx = lane; idx < 16 * HD; idx += 32) {
      const int rr = idx / HD, c = idx - rr * HD, t = j0 + 16 * w + rr;
      if (t < T_) {
        pk[(size_t)t * HD + c] = S[rr * Dm::LDF + c];
        pv[(size_t)t * HD + c] = dP[rr * Dm::LDF + c];
      }
    }
    return;
  }
  if (dk) tc_store_rows<T, HD>(dk, S, j0 + 16 * w, T_, boff, qkv_stride, g * HD, scale);
  if (dv) tc_store_rows<T, HD>(dv, dP, j0 + 16 * w, T_, boff, qkv_stride, g * HD, 1.0f);
}

template <int HD> static size_t fwd_smem() {
  return 3 * tc_dims<HD>::TILE + TC_WARPS * (tc_dims<HD>::FSTRIP + tc_dims<HD>::PSTRIP);
}
template <int HD> static size_t bwd_smem() { return tc_bwd_layout<bf16, HD>::BYTES; }
/* what head_dim HD's kernels need per block: the larger of forward and backward */
template <int HD> static size_t smem_of() {
  return bwd_smem<HD>() > fwd_smem<HD>() ? bwd_smem<HD>() : fwd_smem<HD>();
}

size_t tsr_attn_wmma_smem(int hd) {
  switch (hd) {
    case 32: return smem_of<32>();
    case 64: return smem_of<64>();
    case 96: return smem_of<96>();
    case 128: return smem_of<128>();
  }
  return 0;
}

template <class T, int HD>
static int wmma_fwd(T *out, float *lse, const T *q, const T *k, const T *v, int B, int T_, int H,
                    int KV, int qkv_stride) {
  const dim3 grid((unsigned)((T_ + TC_ROWS - 1) / TC_ROWS), B * H);
  const size_t smem = fwd_smem<HD>();
  TSR_CUDA_CALL(allow_smem(wmma_fwd_kernel<T, HD>, smem));
  wmma_fwd_kernel<T, HD><<<grid, TC_THREADS, smem, tsr_dev_ctx.stream>>>(
      out, lse, q, k, v, T_, H, KV, qkv_stride, (float)(1.0 / sqrt((double)HD)));
  TSR_CUDA_LAUNCHED();
  return 0;
}

template <class T, int HD>
static int wmma_bwd(T *dq, T *dk, T *dv, float *part, const T *dout, const float *lse,
                    const float *D, const T *q, const T *k, const T *v, int B, int T_, int H,
                    int KV, int qkv_stride) {
  const float scale = (float)(1.0 / sqrt((double)HD));
  const size_t part_stride = (size_t)B * H * T_ * HD;
  const dim3 grid((unsigned)((T_ + TC_ROWS - 1) / TC_ROWS), B * H);
  const size_t smem = bwd_smem<HD>();
  const cudaStream_t stream = tsr_dev_ctx.stream;
  if (dq) {
    TSR_CUDA_CALL(allow_smem(wmma_dq_kernel<T, HD>, smem));
    wmma_dq_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(dq, dout, lse, D, q, k, v, T_, H,
                                                              KV, qkv_stride, scale);
    TSR_CUDA_LAUNCHED();
  }
  if (dk || dv) {
    TSR_CUDA_CALL(allow_smem(wmma_dkdv_kernel<T, HD>, smem));
    wmma_dkdv_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(
        dk, dv, part, part_stride, dout, lse, D, q, k, v, T_, H, KV, qkv_stride, scale);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

template <class T>
static int fwd_t(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T_,
                 int H, int KV, int hd, int qkv_stride) {
  TC_HD_SWITCH(hd, HD,
               wmma_fwd<T, HD>((T *)out, lse, (const T *)q, (const T *)k, (const T *)v, B, T_, H,
                               KV, qkv_stride));
  return 0;
}
template <class T>
static int bwd_t(void *dq, void *dk, void *dv, float *part, const void *dout, const float *lse,
                 const float *D, const void *q, const void *k, const void *v, int B, int T_,
                 int H, int KV, int hd, int qkv_stride) {
  TC_HD_SWITCH(hd, HD,
               wmma_bwd<T, HD>((T *)dq, (T *)dk, (T *)dv, part, (const T *)dout, lse, D,
                               (const T *)q, (const T *)k, (const T *)v, B, T_, H, KV,
                               qkv_stride));
  return 0;
}

int tsr_attn_wmma_fwd(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                      const void *v, int B, int T, int H, int KV, int hd, int qkv_stride) {
  TSR_CUDA_ARG(dt == TSR_BF16 || dt == TSR_F16);
  if (dt == TSR_F16) return fwd_t<f16>(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride);
  return fwd_t<bf16>(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride);
}
int tsr_attn_wmma_bwd(tsr_dtype dt, void *dq, void *dk, void *dv, float *part,
                      const void *dout, const float *lse, const float *D, const void *q,
                      const void *k, const void *v, int B, int T, int H, int KV, int hd,
                      int qkv_stride) {
  TSR_CUDA_ARG(dt == TSR_BF16 || dt == TSR_F16);
  if (dt == TSR_F16)
    return bwd_t<f16>(dq, dk, dv, part, dout, lse, D, q, k, v, B, T, H, KV, hd, qkv_stride);
  return bwd_t<bf16>(dq, dk, dv, part, dout, lse, D, q, k, v, B, T, H, KV, hd, qkv_stride);
}
