/* attention.cu — causal grouped-query attention, flash-style, forward and backward: first
 * on fp32 or bf16 storage with fp32 arithmetic (below), then the same with its matrix
 * products on the tensor cores (the second half of the file, "tensor-core path").  Layouts
 * and semantics of both are those of tsr_ops_attention_fwd/bwd (src/ops.h): q/k/v rows of
 * stride qkv_stride, query head h reads kv head h / (H/KV), out contiguous [B*T, H*hd],
 * lse[(b*H + h)*T + t].
 *
 * Tiles of BQ = 32 queries by BK = 32 keys, 256 threads.  Thread (row = tid/8, sub =
 * tid%8) owns one query (or key) row of the tile and head dimensions sub, sub+8, ...;
 * the 8 threads of a row sit in one aligned group of lanes, so row reductions are three
 * xor shuffles.  Tiles live in shared memory as fp32 with rows padded to hd+1 floats
 * (conflict-free column access).  No T x T matrix is ever stored.
 *
 * Forward: one block per (query tile, b, h) walks the key tiles up to the diagonal with
 * an online softmax (running max m, sum l, rescaled accumulator).
 * Backward: D = rowsum(dout * out) first; then one kernel per key tile (b, kv head)
 * accumulates dk, dv over the group's query heads and the query tiles at or below the
 * diagonal, and one kernel per query tile (b, h) accumulates dq over the key tiles.
 * Both rebuild P = exp(scale * q.k - lse).  Every output element is owned by one thread
 * and summed in a fixed order: no atomics, deterministic. */
#include "cuda_common.cuh"

#define BQ 32
#define BK 32
#define ATT_THREADS 256
#define HD_MAX 128

/* Copy rows [row0, row0 + nrows) of one head (columns [col0, col0 + hd)) of a strided
 * buffer into a padded fp32 tile; rows at or beyond T are zero. */
template <class T>
__device__ __forceinline__ void load_tile(float *tile, const T *src, int row0, int nrows, int T_,
                                          size_t batch_off, int stride, int col0, int hd) {
  const int ld = hd + 1;
  for (int idx = threadIdx.x; idx < nrows * hd; idx += ATT_THREADS) {
    const int rr = idx / hd, d = idx - rr * hd, t = row0 + rr;
    tile[rr * ld + d] =
        t < T_ ? to_f32(src[batch_off + (size_t)t * stride + col0 + d]) : 0.0f;
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

/* acc[i] += sum over the tile's BK rows c of w[c] * tile[c * ld + d], for this thread's
 * head dims d = sub + 8 i below hd (P V in the forward, dS K for dq). */
template <int DPT>
__device__ __forceinline__ void acc_weighted_rows(float (&acc)[DPT], const float *w,
                                                  const float *tile, int ld, int sub, int hd) {
  for (int c = 0; c < BK; c++) {
    const float x = w[c];
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) acc[i] += x * tile[c * ld + d];
    }
  }
}

/* ---------------------------------------------------------------- forward */

template <class T, int DPT> /* DPT = head dims per thread = ceil(hd / 8) bound */
__global__ void __launch_bounds__(ATT_THREADS)
    attn_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H,
                    int KV, int hd, int qkv_stride, float scale) {
  extern __shared__ __align__(32) float smem[];
  const int ld = hd + 1;
  float *Qs = smem, *Ks = Qs + BQ * ld, *Vs = Ks + BK * ld, *Ps = Vs + BK * ld; /* Ps: [BQ][BK+1] */
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = blockIdx.x * BQ;
  const int row = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const int tq = q0 + row;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  load_tile(Qs, q, q0, BQ, T_, boff, qkv_stride, h * hd, hd);
  float m = -INFINITY, l = 0.0f, acc[DPT];
#pragma unroll
  for (int i = 0; i < DPT; i++) acc[i] = 0.0f;

  const int kend = min(q0 + BQ, T_); /* keys this tile's queries can see */
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads(); /* the previous tile's Ks/Vs/Ps are no longer read */
    load_tile(Ks, k, k0, BK, T_, boff, qkv_stride, g * hd, hd);
    load_tile(Vs, v, k0, BK, T_, boff, qkv_stride, g * hd, hd);
    __syncthreads();
    float s[BK / 8], tile_max = -INFINITY;
    dot_rows(s, Qs + row * ld, Ks + sub * ld, 8 * ld, hd); /* keys sub, sub+8, ... */
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
      const int key = k0 + sub + 8 * j;
      s[j] = (key <= tq && key < T_) ? scale * s[j] : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
    const float m_new = fmaxf(m, tile_max);
    /* every row sees key 0 in the first tile, so m_new is finite; guard anyway */
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
    for (int o = 1; o < 8; o <<= 1) rowsum += __shfl_xor_sync(0xffffffffu, rowsum, o);
    l = l * corr + rowsum;
    m = m_new;
    __syncthreads(); /* Ps complete */
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] *= corr;
    acc_weighted_rows(acc, Ps + row * (BK + 1), Vs, ld, sub, hd);
  }
  if (tq < T_) {
    T *o = out + ((size_t)b * T_ + tq) * H * hd + (size_t)h * hd;
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) o[d] = from_f32<T>(acc[i] * inv);
    }
    if (sub == 0) lse[((size_t)b * H + h) * T_ + tq] = m + logf(l);
  }
}

/* --------------------------------------------------------------- backward */

/* D[(b*H + h)*T + t] = sum_i dout[.., i] * out[.., i]: one warp per (row, head). */
template <class T>
__global__ void attn_bwd_dot_kernel(float *D, const T *dout, const T *out, int B, int T_, int H,
                                    int hd) {
  const long w = (blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= (long)B * T_ * H) return;
  const long row = w / H; /* b*T + t */
  const int h = (int)(w % H);
  const T *go = dout + row * H * hd + (size_t)h * hd, *o = out + row * H * hd + (size_t)h * hd;
  float s = 0.0f;
  for (int i = lane; i < hd; i += 32) s += to_f32(go[i]) * to_f32(o[i]);
  s = warp_sum(s);
  const long b = row / T_, t = row % T_;
  if (lane == 0) D[(b * H + h) * T_ + t] = s;
}

/* lse and D of the queries [q0, q0 + ROWS) of one head, from its row `stat` of the
 * statistics (zeros past T), by the THREADS threads of the block. */
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_stats(float *Ls, float *Ds, const float *lse,
                                           const float *D, size_t stat, int q0, int T_) {
  for (int rr = threadIdx.x; rr < ROWS; rr += THREADS) {
    const int t = q0 + rr;
    Ls[rr] = t < T_ ? lse[stat + t] : 0.0f;
    Ds[rr] = t < T_ ? D[stat + t] : 0.0f;
  }
}

/* The query side of the backward for queries [q0, q0 + BQ) of head h: their Q and dout
 * tiles and their lse and D statistics (rows past T as zeros). */
template <class T>
__device__ __forceinline__ void load_query_side(float *Qs, float *dOs, float *Ls, float *Ds,
                                                const T *q, const T *dout, const float *lse,
                                                const float *D, int b, int h, int q0, int T_,
                                                int H, int hd, int qkv_stride) {
  load_tile(Qs, q, q0, BQ, T_, (size_t)b * T_ * qkv_stride, qkv_stride, h * hd, hd);
  load_tile(dOs, dout, q0, BQ, T_, (size_t)b * T_ * H * hd, H * hd, h * hd, hd);
  load_stats<BQ, ATT_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
}

/* dq of one query tile: dq_t += scale * sum_j P_tj (dP_tj - D_t) k_j */
template <class T, int DPT>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dq_kernel(T *dq, const T *dout, const float *lse, const float *D, const T *q,
                       const T *k, const T *v, int T_, int H, int KV, int hd, int qkv_stride,
                       float scale) {
  extern __shared__ __align__(32) float smem[];
  const int ld = hd + 1;
  float *Qs = smem, *dOs = Qs + BQ * ld, *Ks = dOs + BQ * ld, *Vs = Ks + BK * ld;
  float *dSs = Vs + BK * ld, *Ls = dSs + BQ * (BK + 1), *Ds = Ls + BQ;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = blockIdx.x * BQ;
  const int row = threadIdx.x >> 3, sub = threadIdx.x & 7;
  const int tq = q0 + row;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  load_query_side(Qs, dOs, Ls, Ds, q, dout, lse, D, b, h, q0, T_, H, hd, qkv_stride);
  float acc[DPT];
#pragma unroll
  for (int i = 0; i < DPT; i++) acc[i] = 0.0f;

  const int kend = min(q0 + BQ, T_);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    __syncthreads();
    load_tile(Ks, k, k0, BK, T_, boff, qkv_stride, g * hd, hd);
    load_tile(Vs, v, k0, BK, T_, boff, qkv_stride, g * hd, hd);
    __syncthreads();
    float qk[BK / 8], dp[BK / 8];
    dot_rows(qk, Qs + row * ld, Ks + sub * ld, 8 * ld, hd);
    dot_rows(dp, dOs + row * ld, Vs + sub * ld, 8 * ld, hd);
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
      const int c = sub + 8 * j, key = k0 + c;
      float ds = 0.0f;
      if (key <= tq && key < T_ && tq < T_) {
        const float p = expf(scale * qk[j] - Ls[row]);
        ds = p * (dp[j] - Ds[row]);
      }
      dSs[row * (BK + 1) + c] = ds;
    }
    __syncthreads();
    acc_weighted_rows(acc, dSs + row * (BK + 1), Ks, ld, sub, hd);
  }
  if (tq < T_) {
    T *d_out = dq + boff + (size_t)tq * qkv_stride + (size_t)h * hd;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) d_out[d] = from_f32<T>(to_f32(d_out[d]) + scale * acc[i]);
    }
  }
}

/* dk, dv of one key tile of kv head g: sums over the group's query heads (outer) and
 * the query tiles from the diagonal down (inner), rows in order within a tile.
 *   dv_j += sum_t P_tj dout_t;   dk_j += scale * sum_t P_tj (dP_tj - D_t) q_t */
template <class T, int DPT>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_bwd_dkdv_kernel(T *dk, T *dv, const T *dout, const float *lse, const float *D,
                         const T *q, const T *k, const T *v, int T_, int H, int KV, int hd,
                         int qkv_stride, float scale) {
  extern __shared__ __align__(32) float smem[];
  const int ld = hd + 1;
  float *Ks = smem, *Vs = Ks + BK * ld, *Qs = Vs + BK * ld, *dOs = Qs + BQ * ld;
  float *Ps = dOs + BQ * ld, *dSs = Ps + BQ * (BK + 1), *Ls = dSs + BQ * (BK + 1), *Ds = Ls + BQ;
  const int group = H / KV;
  const int b = blockIdx.y / KV, g = blockIdx.y % KV;
  const int j0 = blockIdx.x * BK;
  const int col = threadIdx.x >> 3, sub = threadIdx.x & 7; /* col: this thread's key */
  const int key = j0 + col;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  load_tile(Ks, k, j0, BK, T_, boff, qkv_stride, g * hd, hd);
  load_tile(Vs, v, j0, BK, T_, boff, qkv_stride, g * hd, hd);
  float acc_k[DPT], acc_v[DPT];
#pragma unroll
  for (int i = 0; i < DPT; i++) acc_k[i] = acc_v[i] = 0.0f;

  for (int h = g * group; h < (g + 1) * group; h++) {
    for (int q0 = j0 / BQ * BQ; q0 < T_; q0 += BQ) {
      __syncthreads(); /* previous Qs/dOs/Ps/dSs reads are done (first pass: Ks/Vs loaded) */
      load_query_side(Qs, dOs, Ls, Ds, q, dout, lse, D, b, h, q0, T_, H, hd, qkv_stride);
      __syncthreads();
      float qk[BQ / 8], dp[BQ / 8];
      dot_rows(qk, Ks + col * ld, Qs + sub * ld, 8 * ld, hd); /* queries sub, sub+8, ... */
      dot_rows(dp, Vs + col * ld, dOs + sub * ld, 8 * ld, hd);
#pragma unroll
      for (int j = 0; j < BQ / 8; j++) {
        const int rr = sub + 8 * j, t = q0 + rr;
        float p = 0.0f, ds = 0.0f;
        if (t < T_ && key <= t && key < T_) {
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
            acc_v[i] += p * dOs[rr * ld + d];
            acc_k[i] += ds * Qs[rr * ld + d];
          }
        }
      }
    }
  }
  if (key < T_) {
    const size_t off = boff + (size_t)key * qkv_stride + (size_t)g * hd;
#pragma unroll
    for (int i = 0; i < DPT; i++) {
      const int d = sub + 8 * i;
      if (d < hd) {
        if (dk) dk[off + d] = from_f32<T>(to_f32(dk[off + d]) + scale * acc_k[i]);
        if (dv) dv[off + d] = from_f32<T>(to_f32(dv[off + d]) + acc_v[i]);
      }
    }
  }
}

/* ------------------------------------------------------------------ drivers */

static size_t fwd_smem(int hd) { return (size_t)((BQ + 2 * BK) * (hd + 1) + BQ * (BK + 1)) * sizeof(float); }
static size_t dq_smem(int hd) {
  return (size_t)((2 * BQ + 2 * BK) * (hd + 1) + BQ * (BK + 1) + 2 * BQ) * sizeof(float);
}
static size_t dkdv_smem(int hd) {
  return (size_t)((2 * BK + 2 * BQ) * (hd + 1) + 2 * BQ * (BK + 1) + 2 * BQ) * sizeof(float);
}

static int check_shape(int B, int T, int H, int KV, int hd, int qkv_stride) {
  TSR_CUDA_ARG(B > 0 && T > 0 && H > 0 && KV > 0 && H % KV == 0);
  TSR_CUDA_ARG(hd > 0 && hd <= HD_MAX);
  TSR_CUDA_ARG(qkv_stride >= H * hd); /* q, k, v may share one fused buffer or not */
  TSR_CUDA_ARG((long)B * H <= 65535); /* gridDim.y of the kernels is B * H (or B * KV) */
  return 0;
}

template <class T, int DPT>
static int attn_fwd(T *out, float *lse, const T *q, const T *k, const T *v, int B, int T_, int H,
                    int KV, int hd, int qkv_stride, cudaStream_t stream) {
  const size_t smem = fwd_smem(hd);
  TSR_CUDA_CHECK(allow_smem(attn_fwd_kernel<T, DPT>, smem));
  const dim3 grid((T_ + BQ - 1) / BQ, B * H);
  attn_fwd_kernel<T, DPT><<<grid, ATT_THREADS, smem, stream>>>(
      out, lse, q, k, v, T_, H, KV, hd, qkv_stride, (float)(1.0 / sqrt((double)hd)));
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* D (B*H*T floats), then the tensor-core backward's per-query-head dk, dv partials */
size_t tsr_cuda_attention_scratch_(long bht, long part) {
  return tsr_ops_attention_scratch_bytes(bht, part); /* the layout below: D, then part */
}

template <class T, int DPT>
static int attn_bwd(T *dq, T *dk, T *dv, const T *dout, const T *out, const float *lse,
                    const T *q, const T *k, const T *v, int B, int T_, int H, int KV, int hd,
                    int qkv_stride, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  const float scale = (float)(1.0 / sqrt((double)hd));
  float *D = NULL;
  TSR_CUDA_SCRATCH(D, ws, (size_t)B * H * T_ * sizeof(float));
  const long warps = (long)B * T_ * H;
  attn_bwd_dot_kernel<T><<<(unsigned)((warps * 32 + 255) / 256), 256, 0, stream>>>(D, dout, out, B,
                                                                                T_, H, hd);
  TSR_CUDA_LAUNCHED();
  if (dq) {
    const size_t smem = dq_smem(hd);
    TSR_CUDA_CHECK(allow_smem(attn_bwd_dq_kernel<T, DPT>, smem));
    attn_bwd_dq_kernel<T, DPT><<<dim3((T_ + BQ - 1) / BQ, B * H), ATT_THREADS, smem, stream>>>(
        dq, dout, lse, D, q, k, v, T_, H, KV, hd, qkv_stride, scale);
    TSR_CUDA_LAUNCHED();
  }
  if (dk || dv) {
    const size_t smem = dkdv_smem(hd);
    TSR_CUDA_CHECK(allow_smem(attn_bwd_dkdv_kernel<T, DPT>, smem));
    attn_bwd_dkdv_kernel<T, DPT><<<dim3((T_ + BK - 1) / BK, B * KV), ATT_THREADS, smem, stream>>>(
        dk, dv, dout, lse, D, q, k, v, T_, H, KV, hd, qkv_stride, scale);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

/* head_dim <= 64 uses 8 accumulators per thread, up to 128 uses 16 */
template <class T>
static int attention_fwd(T *out, float *lse, const T *q, const T *k, const T *v, int B, int T_,
                         int H, int KV, int hd, int qkv_stride, cudaStream_t stream) {
  TSR_CALL(check_shape(B, T_, H, KV, hd, qkv_stride));
  if (hd <= 64) return attn_fwd<T, 8>(out, lse, q, k, v, B, T_, H, KV, hd, qkv_stride, stream);
  return attn_fwd<T, 16>(out, lse, q, k, v, B, T_, H, KV, hd, qkv_stride, stream);
}
template <class T>
static int attention_bwd(T *dq, T *dk, T *dv, const T *dout, const T *out, const float *lse,
                         const T *q, const T *k, const T *v, int B, int T_, int H, int KV, int hd,
                         int qkv_stride, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  TSR_CALL(check_shape(B, T_, H, KV, hd, qkv_stride));
  if (!dq && !dk && !dv) return 0;
  if (hd <= 64)
    return attn_bwd<T, 8>(dq, dk, dv, dout, out, lse, q, k, v, B, T_, H, KV, hd, qkv_stride, ws, stream);
  return attn_bwd<T, 16>(dq, dk, dv, dout, out, lse, q, k, v, B, T_, H, KV, hd, qkv_stride, ws, stream);
}

extern "C" int tsr_cuda_attention_fwd(float *out, float *lse, const float *q, const float *k,
                                      const float *v, int B, int T, int H, int KV, int hd,
                                      int qkv_stride, cudaStream_t stream) {
  return attention_fwd<float>(out, lse, q, k, v, B, T, H, KV, hd, qkv_stride, stream);
}
extern "C" int tsr_cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                      const float *out, const float *lse, const float *q,
                                      const float *k, const float *v, int B, int T, int H,
                                      int KV, int hd, int qkv_stride, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  return attention_bwd<float>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, qkv_stride,
                              ws, stream);
}
extern "C" int tsr_cuda_attention_fwd_bf16(tsr_bf16 *out, float *lse, const tsr_bf16 *q,
                                           const tsr_bf16 *k, const tsr_bf16 *v, int B, int T,
                                           int H, int KV, int hd, int qkv_stride,
                                           cudaStream_t stream) {
  return attention_fwd<bf16>((bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v,
                             B, T, H, KV, hd, qkv_stride, stream);
}
extern "C" int tsr_cuda_attention_bwd_bf16(tsr_bf16 *dq, tsr_bf16 *dk, tsr_bf16 *dv,
                                           const tsr_bf16 *dout, const tsr_bf16 *out,
                                           const float *lse, const tsr_bf16 *q, const tsr_bf16 *k,
                                           const tsr_bf16 *v, int B, int T, int H, int KV, int hd,
                                           int qkv_stride, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  return attention_bwd<bf16>((bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (const bf16 *)dout,
                             (const bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k,
                             (const bf16 *)v, B, T, H, KV, hd, qkv_stride, ws, stream);
}

/* ============================================================ tensor-core path
 * The same attention with its five matrix products on the tensor cores (WMMA, 16x16x16
 * bf16 fragments, fp32 accumulation): what the trainer runs when its GEMMs take bf16
 * inputs (tsr_ops_set_matmul_inputs(TSR_MATMUL_BF16)).  q, k, v, dout (and P, dS) are
 * rounded to bf16 for the products; softmax statistics, accumulators and the outputs stay
 * fp32.  head_dim 32, 64, 96 or 128 (tsr_cuda_attention_tc_supported).
 *
 * Blocks of 4 warps own 64 rows (queries for the forward and dq, keys for dk/dv), 16 per
 * warp, and walk tiles of 64 keys (queries); the blocks with the most tiles start first
 * (the last query tiles, the first key tiles), so that short ones fill the tail of the
 * grid.  Each warp writes its 16 x 64 score tile to its own shared-memory strip, its 32
 * lanes (two per row, 32 columns each) apply the mask and the softmax there and write P
 * (or dS) back as bf16 for the next product.  The
 * forward keeps its output rows in registers (two lanes per row, hd/2 columns each),
 * rescaled by the online softmax; P V comes back through the strip.  Every output element
 * is summed in a fixed order: deterministic, no atomics.  WMMA wants 32-byte aligned
 * fragment pointers: every offset below is a multiple of 32 bytes, and the kernels'
 * dynamic shared memory is declared __align__(32). */
#include <mma.h>

#define TC_ROWS 64 /* rows of a block, keys (queries) of a tile */
#define TC_WARPS 4
#define TC_THREADS (32 * TC_WARPS)

namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt; /* B = X^T */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Shared-memory strides: bf16 tiles of hd (+8) columns, the fp32 strips hold a 16 x 64
 * score tile or a 16 x hd product (+4), the bf16 strips 16 x 64 (+8).  Every fragment
 * pointer is then 32-byte aligned and ldm a multiple of 8 (bf16) or 4 (fp32). */
template <int HD> struct tc_dims {
  static const int LDB = HD + 8;
  static const int LDF = (HD > TC_ROWS ? HD : TC_ROWS) + 4;
  static const int LDP = TC_ROWS + 8;
  static const size_t TILE = (size_t)TC_ROWS * LDB * sizeof(bf16);
  static const size_t FSTRIP = (size_t)16 * LDF * sizeof(float);
  static const size_t PSTRIP = (size_t)16 * LDP * sizeof(bf16);
};

/* The backward kernels' shared memory, carved for warp w: four bf16 tiles (which holds
 * what is the kernel's choice), this warp's two fp32 strips (scores S, dP) and two bf16
 * strips (P, dS), then lse and D of a query tile. */
template <int HD> struct tc_bwd_layout {
  typedef tc_dims<HD> Dm;
  static const size_t STRIPS = 4 * Dm::TILE, PSTRIPS = STRIPS + 2 * TC_WARPS * Dm::FSTRIP,
                      STATS = PSTRIPS + 2 * TC_WARPS * Dm::PSTRIP;
  static const size_t BYTES = STATS + 2 * TC_ROWS * sizeof(float);
  bf16 *tile[4], *P, *dS;
  float *S, *dP, *Ls, *Ds;
  __device__ tc_bwd_layout(void *smem, int w) {
    char *base = (char *)smem;
    for (int i = 0; i < 4; i++) tile[i] = (bf16 *)(base + i * Dm::TILE);
    S = (float *)(base + STRIPS + w * Dm::FSTRIP);
    dP = (float *)(base + STRIPS + (TC_WARPS + w) * Dm::FSTRIP);
    P = (bf16 *)(base + PSTRIPS + w * Dm::PSTRIP);
    dS = (bf16 *)(base + PSTRIPS + (TC_WARPS + w) * Dm::PSTRIP);
    Ls = (float *)(base + STATS);
    Ds = Ls + TC_ROWS;
  }
};

/* A tile: rows [row0, row0 + 64) of one head of a strided buffer, rows past T zero, in
 * two steps so that its global loads can be in flight while the block computes:
 * tc_fetch reads it into registers (TC_LOADS float4 groups of 4 columns per thread,
 * 16-byte loads where the rows start 16-byte aligned), tc_put writes them to shared
 * memory as bf16 (8 bytes at a time). */
#define TC_LOADS(HD) (TC_ROWS * (HD) / 4 / TC_THREADS)
template <class T, int HD>
__device__ __forceinline__ void tc_fetch(float4 (&r)[TC_LOADS(HD)], const T *src, int row0,
                                         int T_, size_t batch_off, int stride, int col0) {
  const T *base = src + batch_off + col0;
  const bool vec = sizeof(T) == 4 && stride % 4 == 0 && ((uintptr_t)base & 15) == 0;
#pragma unroll
  for (int i = 0; i < TC_LOADS(HD); i++) {
    const int idx = threadIdx.x + i * TC_THREADS;
    const int rr = idx / (HD / 4), d = 4 * (idx - rr * (HD / 4)), t = row0 + rr;
    float4 x = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t < T_) {
      const T *e = base + (size_t)t * stride + d;
      if (vec) {
        x = *(const float4 *)e;
      } else {
        x.x = to_f32(e[0]), x.y = to_f32(e[1]), x.z = to_f32(e[2]), x.w = to_f32(e[3]);
      }
    }
    r[i] = x;
  }
}
template <int HD>
__device__ __forceinline__ void tc_put(bf16 *tile, const float4 (&r)[TC_LOADS(HD)]) {
#pragma unroll
  for (int i = 0; i < TC_LOADS(HD); i++) {
    const int idx = threadIdx.x + i * TC_THREADS;
    const int rr = idx / (HD / 4), d = 4 * (idx - rr * (HD / 4));
    union {
      bf16 h[4];
      uint2 u;
    } pk;
    pk.h[0] = __float2bfloat16_rn(r[i].x), pk.h[1] = __float2bfloat16_rn(r[i].y);
    pk.h[2] = __float2bfloat16_rn(r[i].z), pk.h[3] = __float2bfloat16_rn(r[i].w);
    *(uint2 *)(tile + rr * tc_dims<HD>::LDB + d) = pk.u; /* LDB, d: multiples of 4 */
  }
}
template <class T, int HD>
__device__ __forceinline__ void tc_load(bf16 *tile, const T *src, int row0, int T_,
                                        size_t batch_off, int stride, int col0) {
  float4 r[TC_LOADS(HD)];
  tc_fetch<T, HD>(r, src, row0, T_, batch_off, stride, col0);
  tc_put<HD>(tile, r);
}

/* strip[0..16) x [0..64) = A_w (16 x HD, rows of `a`) times the 64 rows of `bt`, transposed */
template <int HD>
__device__ __forceinline__ void tc_scores(float *strip, const bf16 *a, const bf16 *bt) {
  const int LDB = tc_dims<HD>::LDB;
  frag_a fa[HD / 16];
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) wmma::load_matrix_sync(fa[kk], a + 16 * kk, LDB);
#pragma unroll
  for (int j = 0; j < TC_ROWS / 16; j++) {
    frag_c c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      frag_bt fb;
      wmma::load_matrix_sync(fb, bt + 16 * j * LDB + 16 * kk, LDB);
      wmma::mma_sync(c, fa[kk], fb, c);
    }
    wmma::store_matrix_sync(strip + 16 * j, c, tc_dims<HD>::LDF, wmma::mem_row_major);
  }
}

/* acc[n] += P_w (16 x 64 bf16 strip) times the 64 x HD tile b, per 16 columns n */
template <int HD>
__device__ __forceinline__ void tc_accumulate(frag_c (&acc)[HD / 16], const bf16 *p,
                                              const bf16 *b) {
  const int LDB = tc_dims<HD>::LDB;
#pragma unroll
  for (int kk = 0; kk < TC_ROWS / 16; kk++) {
    frag_a fa;
    wmma::load_matrix_sync(fa, p + 16 * kk, tc_dims<HD>::LDP);
#pragma unroll
    for (int n = 0; n < HD / 16; n++) {
      frag_b fb;
      wmma::load_matrix_sync(fb, b + 16 * kk * LDB + 16 * n, LDB);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

/* dst[row, col0 + c] += mul * strip[r][c] for this warp's 16 rows (rows past T skipped) */
template <class T, int HD>
__device__ __forceinline__ void tc_add_rows(T *dst, const float *strip, int row0, int T_,
                                            size_t batch_off, int stride, int col0, float mul) {
  const int lane = threadIdx.x & 31;
  for (int idx = lane; idx < 16 * HD; idx += 32) {
    const int r = idx / HD, c = idx - r * HD, t = row0 + r;
    if (t < T_) {
      T *p = dst + batch_off + (size_t)t * stride + col0 + c;
      *p = from_f32<T>(to_f32(*p) + mul * strip[r * tc_dims<HD>::LDF + c]);
    }
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_tc_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H,
                       int KV, int qkv_stride, float scale) {
  typedef tc_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  char *base = (char *)smem;
  bf16 *Qs = (bf16 *)base, *Ks = (bf16 *)(base + Dm::TILE), *Vs = (bf16 *)(base + 2 * Dm::TILE);
  float *S = (float *)(base + 3 * Dm::TILE + w * Dm::FSTRIP);
  bf16 *P = (bf16 *)(base + 3 * Dm::TILE + TC_WARPS * Dm::FSTRIP + w * Dm::PSTRIP);
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, tq = q0 + 16 * w + r;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  float o[HD / 2], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
  /* K's next tile is fetched during P V, V's during the scores and the softmax */
  float4 pre[TC_LOADS(HD)];
  tc_fetch<T, HD>(pre, k, 0, T_, boff, qkv_stride, g * HD);
  for (int k0 = 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads(); /* the previous tile is no longer read */
    tc_put<HD>(Ks, pre);
    tc_fetch<T, HD>(pre, v, k0, T_, boff, qkv_stride, g * HD);
    __syncthreads();
    tc_scores<HD>(S, Qs + 16 * w * Dm::LDB, Ks);
    __syncwarp();
    float s[32], tmax = -INFINITY;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int key = k0 + 32 * half + i;
      s[i] = (key <= tq && key < T_) ? scale * S[r * Dm::LDF + 32 * half + i] : -INFINITY;
      tmax = fmaxf(tmax, s[i]);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    const float m_new = fmaxf(m, tmax), m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float corr = expf(m - m_use);
    float rowsum = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const float p = expf(s[i] - m_use);
      P[r * Dm::LDP + 32 * half + i] = __float2bfloat16_rn(p);
      rowsum += p;
    }
    rowsum += __shfl_xor_sync(0xffffffffu, rowsum, 1);
    l = l * corr + rowsum;
    m = m_new;
    tc_put<HD>(Vs, pre);
    if (k0 + TC_ROWS <= q0 && k0 + TC_ROWS < T_)
      tc_fetch<T, HD>(pre, k, k0 + TC_ROWS, T_, boff, qkv_stride, g * HD);
    __syncthreads(); /* P written, S read, Vs complete */
    frag_c pv[HD / 16];
#pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(pv[n], 0.0f);
    tc_accumulate<HD>(pv, P, Vs);
#pragma unroll
    for (int n = 0; n < HD / 16; n++)
      wmma::store_matrix_sync(S + 16 * n, pv[n], Dm::LDF, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = o[i] * corr + S[r * Dm::LDF + (HD / 2) * half + i];
  }
  if (tq < T_) {
    T *dst = out + ((size_t)b * T_ + tq) * H * HD + (size_t)h * HD + (HD / 2) * half;
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dst[i] = from_f32<T>(o[i] * inv);
    if (half == 0) lse[((size_t)b * H + h) * T_ + tq] = m + logf(l);
  }
}

/* dq of 64 queries of head h: dq += scale * dS K, dS = P (dP - D), dP = dout V^T */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_tc_dq_kernel(T *dq, const T *dout, const float *lse, const float *D, const T *q,
                      const T *k, const T *v, int T_, int H, int KV, int qkv_stride,
                      float scale) {
  typedef tc_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const tc_bwd_layout<HD> sm(smem, w);
  bf16 *Qs = sm.tile[0], *dOs = sm.tile[1], *Ks = sm.tile[2], *Vs = sm.tile[3], *dS = sm.dS;
  float *S = sm.S, *dP = sm.dP, *Ls = sm.Ls, *Ds = sm.Ds;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, row = 16 * w + r, tq = q0 + row;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  tc_load<T, HD>(dOs, dout, q0, T_, (size_t)b * T_ * H * HD, H * HD, h * HD);
  load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
  frag_c acc[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
  /* V's tile is fetched during the scores, K's next one during dP, dS and dq */
  float4 pre[TC_LOADS(HD)];
  tc_fetch<T, HD>(pre, k, 0, T_, boff, qkv_stride, g * HD);
  for (int k0 = 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads();
    tc_put<HD>(Ks, pre);
    tc_fetch<T, HD>(pre, v, k0, T_, boff, qkv_stride, g * HD);
    __syncthreads();
    tc_scores<HD>(S, Qs + 16 * w * Dm::LDB, Ks);
    tc_put<HD>(Vs, pre);
    if (k0 + TC_ROWS <= q0 && k0 + TC_ROWS < T_)
      tc_fetch<T, HD>(pre, k, k0 + TC_ROWS, T_, boff, qkv_stride, g * HD);
    __syncthreads();
    tc_scores<HD>(dP, dOs + 16 * w * Dm::LDB, Vs);
    __syncwarp();
#pragma unroll 8
    for (int i = 0; i < 32; i++) {
      const int c = 32 * half + i, key = k0 + c;
      float ds = 0.0f;
      if (key <= tq && key < T_ && tq < T_) {
        const float p = expf(scale * S[r * Dm::LDF + c] - Ls[row]);
        ds = p * (dP[r * Dm::LDF + c] - Ds[row]);
      }
      dS[r * Dm::LDP + c] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    tc_accumulate<HD>(acc, dS, Ks);
  }
#pragma unroll
  for (int n = 0; n < HD / 16; n++)
    wmma::store_matrix_sync(S + 16 * n, acc[n], Dm::LDF, wmma::mem_row_major);
  __syncwarp();
  tc_add_rows<T, HD>(dq, S, q0 + 16 * w, T_, boff, qkv_stride, h * HD, scale);
}

/* dk, dv of 64 keys from one query head h, over the query tiles from the diagonal on:
 * dv += P^T dout,  dk += scale * dS^T q, with P^T = K Q^T (masked, exp(scale s - lse))
 * and dP^T = V dout^T computed key-major.  One block per (key tile, b, query head), so
 * that the grid has B*H*T/64 blocks and not B*KV*T/64: with grouped-query attention
 * (part != NULL) each head's sums go to its own slice of part (dk's, then dv's
 * part_stride floats later), added up over the group by attn_tc_gqa_reduce_kernel. */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_tc_dkdv_kernel(T *dk, T *dv, float *part, size_t part_stride, const T *dout,
                        const float *lse, const float *D, const T *q, const T *k, const T *v,
                        int T_, int H, int KV, int qkv_stride, float scale) {
  typedef tc_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
  const tc_bwd_layout<HD> sm(smem, w);
  bf16 *Ks = sm.tile[0], *Vs = sm.tile[1], *Qs = sm.tile[2], *dOs = sm.tile[3];
  bf16 *P = sm.P, *dS = sm.dS;
  float *S = sm.S, *dP = sm.dP, *Ls = sm.Ls, *Ds = sm.Ds;
  const int b = blockIdx.y / H, h = blockIdx.y % H, g = h / (H / KV);
  const int j0 = blockIdx.x * TC_ROWS, key = j0 + 16 * w + r;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Ks, k, j0, T_, boff, qkv_stride, g * HD);
  tc_load<T, HD>(Vs, v, j0, T_, boff, qkv_stride, g * HD);
  frag_c acc_k[HD / 16], acc_v[HD / 16];
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    wmma::fill_fragment(acc_k[n], 0.0f);
    wmma::fill_fragment(acc_v[n], 0.0f);
  }
  {
    /* dout's tile is fetched during S^T, q's next one during dP^T, dS, dk and dv */
    const size_t doff = (size_t)b * T_ * H * HD;
    float4 pre[TC_LOADS(HD)];
    tc_fetch<T, HD>(pre, q, j0, T_, boff, qkv_stride, h * HD);
    for (int q0 = j0; q0 < T_; q0 += TC_ROWS) {
      __syncthreads();
      tc_put<HD>(Qs, pre);
      tc_fetch<T, HD>(pre, dout, q0, T_, doff, H * HD, h * HD);
      load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
      __syncthreads();
      tc_scores<HD>(S, Ks + 16 * w * Dm::LDB, Qs); /* S^T: this warp's keys x 64 queries */
      tc_put<HD>(dOs, pre);
      if (q0 + TC_ROWS < T_) tc_fetch<T, HD>(pre, q, q0 + TC_ROWS, T_, boff, qkv_stride, h * HD);
      __syncthreads();
      tc_scores<HD>(dP, Vs + 16 * w * Dm::LDB, dOs); /* dP^T */
      __syncwarp();
#pragma unroll 8
      for (int i = 0; i < 32; i++) {
        const int c = 32 * half + i, t = q0 + c;
        float p = 0.0f, ds = 0.0f;
        if (t < T_ && key <= t && key < T_) {
          p = expf(scale * S[r * Dm::LDF + c] - Ls[c]);
          ds = p * (dP[r * Dm::LDF + c] - Ds[c]);
        }
        P[r * Dm::LDP + c] = __float2bfloat16_rn(p);
        dS[r * Dm::LDP + c] = __float2bfloat16_rn(ds);
      }
      __syncwarp();
      tc_accumulate<HD>(acc_v, P, dOs);
      tc_accumulate<HD>(acc_k, dS, Qs);
    }
  }
#pragma unroll
  for (int n = 0; n < HD / 16; n++) {
    wmma::store_matrix_sync(S + 16 * n, acc_k[n], Dm::LDF, wmma::mem_row_major);
    wmma::store_matrix_sync(dP + 16 * n, acc_v[n], Dm::LDF, wmma::mem_row_major);
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
  if (dk) tc_add_rows<T, HD>(dk, S, j0 + 16 * w, T_, boff, qkv_stride, g * HD, scale);
  if (dv) tc_add_rows<T, HD>(dv, dP, j0 + 16 * w, T_, boff, qkv_stride, g * HD, 1.0f);
}

/* dk += scale * (sum over the group's query heads of their dk sums), dv likewise: one
 * thread per (b, t, kv head, d), heads added in order */
template <class T, int HD>
__global__ void attn_tc_gqa_reduce_kernel(T *dk, T *dv, const float *part, size_t part_stride,
                                          int B, int T_, int H, int KV, int qkv_stride,
                                          float scale) {
  const long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (idx >= (long)B * T_ * KV * HD) return;
  const int d = (int)(idx % HD);
  long rest = idx / HD;
  const int g = (int)(rest % KV);
  rest /= KV;
  const int t = (int)(rest % T_), b = (int)(rest / T_), group = H / KV;
  float sk = 0.0f, sv = 0.0f;
  for (int h = g * group; h < (g + 1) * group; h++) {
    const size_t o = (((size_t)b * H + h) * T_ + t) * HD + d;
    sk += part[o];
    sv += part[part_stride + o];
  }
  const size_t off = ((size_t)b * T_ + t) * qkv_stride + (size_t)g * HD + d;
  if (dk) dk[off] = from_f32<T>(to_f32(dk[off]) + scale * sk);
  if (dv) dv[off] = from_f32<T>(to_f32(dv[off]) + sv);
}

template <int HD> static size_t tc_fwd_smem() {
  return 3 * tc_dims<HD>::TILE + TC_WARPS * (tc_dims<HD>::FSTRIP + tc_dims<HD>::PSTRIP);
}
template <int HD> static size_t tc_bwd_smem() { return tc_bwd_layout<HD>::BYTES; }
/* what head_dim HD's kernels need per block: the larger of forward and backward */
template <int HD> static size_t tc_smem() {
  return tc_bwd_smem<HD>() > tc_fwd_smem<HD>() ? tc_bwd_smem<HD>() : tc_fwd_smem<HD>();
}

/* ============================================================ mma.sync path
 * The tensor-core attention again, on mma.sync.m16n8k16 (bf16 inputs, fp32 accumulators)
 * with every product's accumulators in registers, as FlashAttention-2 lays it out: the
 * scores of a warp's 16 rows never leave its registers, the softmax runs on them in
 * place (each row's values sit on the 4 lanes of a quad: two xor shuffles), and P (or dS)
 * is re-packed from the accumulator layout into the A operand of the next product
 * without touching shared memory.  Same blocks as above (4 warps x 16 rows, tiles of 64),
 * same semantics, scratch and determinism; selected by tsr_cuda_attention_tc_use.
 *
 * Shared memory holds bf16 tiles twice where a product needs them with the head
 * dimension as its n index: row-major [64][HD + 8] (the k = hd operand: Q K^T, dO V^T)
 * and transposed [HD][64 + 8] (the k = key/query operand: P V, dS K, P^T dO, dS^T Q),
 * so that every fragment is two 32-bit loads; both paddings put the 8 row groups x 4
 * lanes of a fragment load on 32 different banks.  The forward reads V transposed from
 * global memory (it needs no row-major V); the backward transposes K, Q and dO in shared
 * memory, so that each is read from global memory once per tile. */
#define MM_LDT (TC_ROWS + 8) /* transposed tiles' row stride */
#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

/* D += A B for the calling warp (m16n8k16; layouts in tests/cuda/emu/include/mma.h, which
 * stands in for the instruction on the CPU emulation). */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(TSR_CUDA_EMULATION)
  emu_mma_m16n8k16_bf16(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap(); /* pre-sm_80: tsr_cuda_attention_tc_supported refuses these GPUs */
#endif
}
__device__ __forceinline__ uint32_t ld32(const bf16 *p) { return *(const uint32_t *)p; }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  union {
    bf16 h[2];
    uint32_t u;
  } p;
  p.h[0] = __float2bfloat16_rn(lo), p.h[1] = __float2bfloat16_rn(hi);
  return p.u;
}
/* A operand: the 16 x 16 block at p, row-major with row stride ld (g = lane / 4, t = lane % 4) */
__device__ __forceinline__ void mm_frag_a(uint32_t (&a)[4], const bf16 *p, int ld, int g, int t) {
  a[0] = ld32(p + g * ld + 2 * t), a[1] = ld32(p + (g + 8) * ld + 2 * t);
  a[2] = ld32(p + g * ld + 2 * t + 8), a[3] = ld32(p + (g + 8) * ld + 2 * t + 8);
}
/* B operand (16 x 8, k x n): element (k, n) at p[n * ld + k] */
__device__ __forceinline__ void mm_frag_b(uint32_t (&b)[2], const bf16 *p, int ld, int g, int t) {
  b[0] = ld32(p + g * ld + 2 * t), b[1] = ld32(p + g * ld + 2 * t + 8);
}
/* The A operand over k = 16 columns [16 kk, 16 kk + 16) of a 16-row accumulator strip
 * c[n8 tile][4] (as mma16816 leaves it), rounded to bf16: no data leaves the lane. */
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack_bf16(c[2 * kk][0], c[2 * kk][1]), a[1] = pack_bf16(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* s[j] = A1 B1_j^T and p[j] = A2 B2_j^T for the N tiles j of 8 rows, over k = HD: A1, A2
 * the warp's 16 rows and B1, B2 rows 8 j .. 8 j + 7 of row-major bf16 tiles (stride ld)
 * (Q K^T and dO V^T for dq; K Q^T and V dO^T for dk/dv) */
template <int HD, int N>
__device__ __forceinline__ void mm_two_products(float (&s)[N][4], float (&p)[N][4],
                                                const bf16 *a1, const bf16 *a2, const bf16 *b1,
                                                const bf16 *b2, int ld, int g, int t) {
#pragma unroll
  for (int j = 0; j < N; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[j][e] = p[j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    uint32_t fa1[4], fa2[4];
    mm_frag_a(fa1, a1 + 16 * kk, ld, g, t);
    mm_frag_a(fa2, a2 + 16 * kk, ld, g, t);
#pragma unroll
    for (int j = 0; j < N; j++) {
      uint32_t fb1[2], fb2[2];
      mm_frag_b(fb1, b1 + 8 * j * ld + 16 * kk, ld, g, t);
      mm_frag_b(fb2, b2 + 8 * j * ld + 16 * kk, ld, g, t);
      mma16816(s[j], fa1, fb1);
      mma16816(p[j], fa2, fb2);
    }
  }
}
/* acc[n] += A (16 x 16, an operand from acc_to_a) times the 16 rows [k0, k0 + 16) of the
 * transposed tile bt (bt[d * MM_LDT + k]), for the HD / 8 column tiles n */
template <int HD>
__device__ __forceinline__ void mm_acc_rows(float (&acc)[HD / 8][4], const uint32_t (&a)[4],
                                            const bf16 *bt, int k0, int g, int t) {
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    uint32_t b[2];
    mm_frag_b(b, bt + 8 * n * MM_LDT + k0, MM_LDT, g, t);
    mma16816(acc[n], a, b);
  }
}

/* Rows [row0, row0 + 64) of one head into a transposed bf16 tile tt[d * MM_LDT + row]
 * (rows past T zero).  A thread takes two adjacent rows by 8 columns (32-byte reads) and
 * writes 8 words, each the pair of rows at one column: a warp's 32 row pairs write 32
 * consecutive words. */
template <class T>
__device__ __forceinline__ void load8(float (&x)[8], const T *e, bool vec) {
  if (vec) {
    const float4 a = *(const float4 *)e, b = *(const float4 *)(e + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = to_f32(e[i]);
  }
}
template <class T, int HD>
__device__ __forceinline__ void mm_load_t(bf16 *tt, const T *src, int row0, int T_,
                                          size_t batch_off, int stride, int col0) {
  const T *base = src + batch_off + col0;
  const bool vec = sizeof(T) == 4 && stride % 4 == 0 && ((uintptr_t)base & 15) == 0;
#pragma unroll
  for (int i = 0; i < HD / 32; i++) { /* (TC_ROWS / 2) * (HD / 8) units over TC_THREADS */
    const int u = threadIdx.x + i * TC_THREADS, rp = u & 31, d = 8 * (u >> 5);
    const int t0 = row0 + 2 * rp;
    float x0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (t0 < T_) load8(x0, base + (size_t)t0 * stride + d, vec);
    if (t0 + 1 < T_) load8(x1, base + (size_t)(t0 + 1) * stride + d, vec);
#pragma unroll
    for (int e = 0; e < 8; e++)
      *(uint32_t *)(tt + (d + e) * MM_LDT + 2 * rp) = pack_bf16(x0[e], x1[e]);
  }
}

/* The transposed copy tt[d * MM_LDT + row] of a row-major bf16 tile already in shared
 * memory (the backward's second layout of K, Q and dO: read from global memory once). */
template <int HD>
__device__ __forceinline__ void mm_transpose(bf16 *tt, const bf16 *tile) {
  const int LDB = tc_dims<HD>::LDB;
#pragma unroll
  for (int i = 0; i < HD / 32; i++) {
    const int u = threadIdx.x + i * TC_THREADS, rp = u & 31, d = 8 * (u >> 5);
    union {
      uint4 v;
      bf16 h[8];
    } a, b;
    a.v = *(const uint4 *)(tile + 2 * rp * LDB + d); /* LDB and d: multiples of 8 */
    b.v = *(const uint4 *)(tile + (2 * rp + 1) * LDB + d);
#pragma unroll
    for (int e = 0; e < 8; e++) {
      union {
        bf16 h[2];
        uint32_t u;
      } w;
      w.h[0] = a.h[e], w.h[1] = b.h[e];
      *(uint32_t *)(tt + (d + e) * MM_LDT + 2 * rp) = w.u;
    }
  }
}

template <int HD> struct mm_dims {
  static const int LDB = tc_dims<HD>::LDB;
  static const size_t TILE = tc_dims<HD>::TILE;                       /* [64][HD + 8] */
  static const size_t TILE_T = (size_t)HD * MM_LDT * sizeof(bf16);    /* [HD][64 + 8] */
  static const size_t STATS = 2 * TC_ROWS * sizeof(float);
  static const size_t FWD = 2 * TILE + TILE_T;                        /* Q, K; V^T */
  static const size_t DQ = 4 * TILE + TILE_T + STATS;                 /* Q, dO, K, V; K^T */
  static const size_t DKDV = 4 * TILE + 2 * TILE_T + STATS;           /* K, V, Q, dO; Q^T, dO^T */
  static const size_t MAX = DKDV > DQ ? (DKDV > FWD ? DKDV : FWD) : (DQ > FWD ? DQ : FWD);
};

/* The backward kernels' shared memory: four row-major tiles (which holds what is the
 * kernel's choice), N_T transposed ones, then lse and D of a query tile (mm_dims::DQ for
 * N_T = 1, ::DKDV for 2). */
template <int HD, int N_T> struct mm_bwd_layout {
  static const int TILE = TC_ROWS * mm_dims<HD>::LDB, TT = HD * MM_LDT; /* bf16 elements */
  __device__ static bf16 *tile(float *smem, int i) { return (bf16 *)smem + i * TILE; }
  __device__ static bf16 *tt(float *smem, int i) { return (bf16 *)smem + 4 * TILE + i * TT; }
  __device__ static float *stats(float *smem) { return (float *)((bf16 *)smem + 4 * TILE + N_T * TT); }
};

/* Forward: the block's 64 queries (the last tiles first: they have the most keys), warp w
 * rows 16 w + g and + 8; s holds the warp's 16 x 64 scores in log2 units. */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_mma_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H,
                        int KV, int qkv_stride, float scale_log2) {
  typedef mm_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  bf16 *Qs = (bf16 *)smem, *Ks = Qs + TC_ROWS * Dm::LDB, *Vt = Ks + TC_ROWS * Dm::LDB;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, r0 = q0 + 16 * w + g, r1 = r0 + 8;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  __syncthreads();
  uint32_t qa[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) mm_frag_a(qa[kk], Qs + 16 * w * Dm::LDB + 16 * kk, Dm::LDB, g, t);
  float o[HD / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int k0 = 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads(); /* the previous tile is no longer read */
    tc_load<T, HD>(Ks, k, k0, T_, boff, qkv_stride, kvh * HD);
    mm_load_t<T, HD>(Vt, v, k0, T_, boff, qkv_stride, kvh * HD);
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t kb[2];
        mm_frag_b(kb, Ks + 8 * j * Dm::LDB + 16 * kk, Dm::LDB, g, t);
        mma16816(s[j], qa[kk], kb);
      }
    }
    const bool edge = k0 + TC_ROWS - 1 > q0 + 16 * w || k0 + TC_ROWS > T_; /* a key to mask */
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * j + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
        s[j][e] = edge && (key > row || key >= T_) ? -INFINITY : s[j][e] * scale_log2;
        if (e < 2) mx0 = fmaxf(mx0, s[j][e]);
        else mx1 = fmaxf(mx1, s[j][e]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* key 0 is in every row's first tile, so the maxima are finite; guard anyway */
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
    const float c0 = exp2f(m0 - u0), c1 = exp2f(m1 - u1);
    m0 = n0, m1 = n1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      s[j][0] = exp2f(s[j][0] - u0), s[j][1] = exp2f(s[j][1] - u0);
      s[j][2] = exp2f(s[j][2] - u1), s[j][3] = exp2f(s[j][3] - u1);
      sum0 += s[j][0] + s[j][1], sum1 += s[j][2] + s[j][3];
    }
    l0 = l0 * c0 + sum0, l1 = l1 * c1 + sum1; /* this lane's columns; the quad adds at the end */
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] *= c0, o[n][1] *= c0, o[n][2] *= c1, o[n][3] *= c1;
#pragma unroll
    for (int kk = 0; kk < TC_ROWS / 16; kk++) {
      uint32_t pa[4];
      acc_to_a(pa, s, kk);
      mm_acc_rows<HD>(o, pa, Vt, 16 * kk, g, t);
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1), l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1), l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = 1.0f / l0, i1 = 1.0f / l1;
  T *d0 = out + ((size_t)b * T_ + r0) * H * HD + (size_t)h * HD + 2 * t;
  T *d1 = d0 + (size_t)8 * H * HD;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    if (r0 < T_) d0[8 * n] = from_f32<T>(o[n][0] * i0), d0[8 * n + 1] = from_f32<T>(o[n][1] * i0);
    if (r1 < T_) d1[8 * n] = from_f32<T>(o[n][2] * i1), d1[8 * n + 1] = from_f32<T>(o[n][3] * i1);
  }
  if (t == 0) {
    float *ls = lse + ((size_t)b * H + h) * T_;
    if (r0 < T_) ls[r0] = (m0 + log2f(l0)) * LN2_F;
    if (r1 < T_) ls[r1] = (m1 + log2f(l1)) * LN2_F;
  }
}

/* dst rows (row0 + g, + 8), columns col0 + 8 n + 2 t (+1) += mul * acc, from a 16-row
 * accumulator strip (rows past T skipped) */
template <class T, int HD>
__device__ __forceinline__ void mm_add_rows(T *dst, const float (&acc)[HD / 8][4], int row0,
                                            int T_, size_t batch_off, int stride, int col0,
                                            float mul, int g, int t) {
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int r = row0 + g + 8 * hr;
    if (r >= T_) continue;
    T *p = dst + batch_off + (size_t)r * stride + col0 + 2 * t;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      p[8 * n] = from_f32<T>(to_f32(p[8 * n]) + mul * acc[n][2 * hr]);
      p[8 * n + 1] = from_f32<T>(to_f32(p[8 * n + 1]) + mul * acc[n][2 * hr + 1]);
    }
  }
}

/* dq of the block's 64 queries: dq += scale * dS K over the key tiles up to the diagonal,
 * dS = P (dP - D), P = exp(scale q.k - lse), dP = dout V^T */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_mma_dq_kernel(T *dq, const T *dout, const float *lse, const float *D, const T *q,
                       const T *k, const T *v, int T_, int H, int KV, int qkv_stride,
                       float scale_log2, float scale) {
  typedef mm_dims<HD> Dm;
  const int LDB = Dm::LDB;
  extern __shared__ __align__(32) float smem[];
  typedef mm_bwd_layout<HD, 1> Sm;
  bf16 *Qs = Sm::tile(smem, 0), *dOs = Sm::tile(smem, 1), *Ks = Sm::tile(smem, 2),
       *Vs = Sm::tile(smem, 3), *Kt = Sm::tt(smem, 0);
  float *Ls = Sm::stats(smem), *Ds = Ls + TC_ROWS;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, r0 = q0 + 16 * w + g, r1 = r0 + 8;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  tc_load<T, HD>(dOs, dout, q0, T_, (size_t)b * T_ * H * HD, H * HD, h * HD);
  load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
  __syncthreads();
  const float L0 = Ls[16 * w + g] * LOG2E_F, L1 = Ls[16 * w + g + 8] * LOG2E_F;
  const float D0 = Ds[16 * w + g], D1 = Ds[16 * w + g + 8];
  const bf16 *Qw = Qs + 16 * w * LDB, *dOw = dOs + 16 * w * LDB;
  float acc[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int k0 = 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads();
    tc_load<T, HD>(Ks, k, k0, T_, boff, qkv_stride, kvh * HD);
    tc_load<T, HD>(Vs, v, k0, T_, boff, qkv_stride, kvh * HD);
    __syncthreads();
    mm_transpose<HD>(Kt, Ks);
    __syncthreads();
    float s[8][4], dp[8][4];
    mm_two_products<HD, 8>(s, dp, Qw, dOw, Ks, Vs, LDB, g, t);
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * j + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
        const float p = key <= row && key < T_ && row < T_
                            ? exp2f(s[j][e] * scale_log2 - (e < 2 ? L0 : L1))
                            : 0.0f;
        s[j][e] = p * (dp[j][e] - (e < 2 ? D0 : D1)); /* dS */
      }
#pragma unroll
    for (int kk = 0; kk < TC_ROWS / 16; kk++) {
      uint32_t sa[4];
      acc_to_a(sa, s, kk);
      mm_acc_rows<HD>(acc, sa, Kt, 16 * kk, g, t);
    }
  }
  mm_add_rows<T, HD>(dq, acc, q0 + 16 * w, T_, boff, qkv_stride, h * HD, scale, g, t);
}

/* dk, dv of the block's 64 keys from query head h, over the query tiles from the
 * diagonal on (in halves of 32 queries, to keep both accumulators in registers):
 * dv += P^T dout, dk += scale * dS^T q, with P^T = exp(scale K Q^T - lse) and
 * dP^T = V dout^T computed key-major.  Grid and GQA partial sums as attn_tc_dkdv_kernel. */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    attn_mma_dkdv_kernel(T *dk, T *dv, float *part, size_t part_stride, const T *dout,
                         const float *lse, const float *D, const T *q, const T *k, const T *v,
                         int T_, int H, int KV, int qkv_stride, float scale_log2, float scale) {
  typedef mm_dims<HD> Dm;
  const int LDB = Dm::LDB;
  extern __shared__ __align__(32) float smem[];
  typedef mm_bwd_layout<HD, 2> Sm;
  bf16 *Ks = Sm::tile(smem, 0), *Vs = Sm::tile(smem, 1), *Qs = Sm::tile(smem, 2),
       *dOs = Sm::tile(smem, 3), *Qt = Sm::tt(smem, 0), *dOt = Sm::tt(smem, 1);
  float *Ls = Sm::stats(smem), *Ds = Ls + TC_ROWS;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / KV);
  const int j0 = blockIdx.x * TC_ROWS, key0 = j0 + 16 * w + g, key1 = key0 + 8;
  const size_t boff = (size_t)b * T_ * qkv_stride, doff = (size_t)b * T_ * H * HD;

  tc_load<T, HD>(Ks, k, j0, T_, boff, qkv_stride, kvh * HD);
  tc_load<T, HD>(Vs, v, j0, T_, boff, qkv_stride, kvh * HD);
  const bf16 *Kw = Ks + 16 * w * LDB, *Vw = Vs + 16 * w * LDB;
  float ak[HD / 8][4], av[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) ak[n][e] = av[n][e] = 0.0f;

  for (int q0 = j0; q0 < T_; q0 += TC_ROWS) {
    __syncthreads();
    tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
    tc_load<T, HD>(dOs, dout, q0, T_, doff, H * HD, h * HD);
    load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
    __syncthreads();
    mm_transpose<HD>(Qt, Qs);
    mm_transpose<HD>(dOt, dOs);
    __syncthreads();
#pragma unroll
    for (int hq = 0; hq < 2; hq++) {
      const int c0 = 32 * hq; /* this half's first query column in the tile */
      float st[4][4], dpt[4][4];
      mm_two_products<HD, 4>(st, dpt, Kw, Vw, Qs + c0 * LDB, dOs + c0 * LDB, LDB, g, t);
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = c0 + 8 * j + 2 * t + (e & 1), tq = q0 + c, key = e < 2 ? key0 : key1;
          const float p = tq < T_ && key <= tq && key < T_
                              ? exp2f(st[j][e] * scale_log2 - Ls[c] * LOG2E_F)
                              : 0.0f;
          st[j][e] = p;
          dpt[j][e] = p * (dpt[j][e] - Ds[c]); /* dS^T */
        }
#pragma unroll
      for (int kk = 0; kk < 2; kk++) {
        uint32_t pa[4], sa[4];
        acc_to_a(pa, st, kk);
        acc_to_a(sa, dpt, kk);
        mm_acc_rows<HD>(av, pa, dOt, c0 + 16 * kk, g, t);
        mm_acc_rows<HD>(ak, sa, Qt, c0 + 16 * kk, g, t);
      }
    }
  }
  if (part) { /* this head's raw sums, rows (b, h, t) of hd floats */
    float *pk = part + ((size_t)b * H + h) * T_ * HD, *pv = pk + part_stride;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int r = j0 + 16 * w + g + 8 * hr;
      if (r >= T_) continue;
#pragma unroll
      for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          pk[(size_t)r * HD + 8 * n + 2 * t + e] = ak[n][2 * hr + e];
          pv[(size_t)r * HD + 8 * n + 2 * t + e] = av[n][2 * hr + e];
        }
    }
    return;
  }
  if (dk) mm_add_rows<T, HD>(dk, ak, j0 + 16 * w, T_, boff, qkv_stride, kvh * HD, scale, g, t);
  if (dv) mm_add_rows<T, HD>(dv, av, j0 + 16 * w, T_, boff, qkv_stride, kvh * HD, 1.0f, g, t);
}

/* The tensor-core forward, with the WMMA (MMA false) or the mma.sync kernel */
template <class T, int HD, bool MMA>
static int attn_tc_fwd(T *out, float *lse, const T *q, const T *k, const T *v, int B, int T_,
                       int H, int KV, int qkv_stride, cudaStream_t stream) {
  const dim3 grid((unsigned)((T_ + TC_ROWS - 1) / TC_ROWS), B * H);
  const float scale = (float)(1.0 / sqrt((double)HD));
  if (MMA) {
    const size_t smem = mm_dims<HD>::FWD;
    TSR_CUDA_CHECK(allow_smem(attn_mma_fwd_kernel<T, HD>, smem));
    attn_mma_fwd_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(out, lse, q, k, v, T_, H, KV,
                                                                   qkv_stride, scale * LOG2E_F);
  } else {
    const size_t smem = tc_fwd_smem<HD>();
    TSR_CUDA_CHECK(allow_smem(attn_tc_fwd_kernel<T, HD>, smem));
    attn_tc_fwd_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(out, lse, q, k, v, T_, H, KV,
                                                                  qkv_stride, scale);
  }
  TSR_CUDA_LAUNCHED();
  return 0;
}

/* The tensor-core backward, with the WMMA (MMA false) or the mma.sync kernels: D, then
 * dq, then dk and dv (per query head into the scratch under grouped-query attention,
 * added over each group after). */
template <class T, int HD, bool MMA>
static int attn_tc_bwd(T *dq, T *dk, T *dv, const T *dout, const T *out, const float *lse,
                       const T *q, const T *k, const T *v, int B, int T_, int H, int KV,
                       int qkv_stride, const tsr_cuda_scratch *ws, cudaStream_t stream) {
  const float scale = (float)(1.0 / sqrt((double)HD)), scale_log2 = scale * LOG2E_F;
  const size_t bht = (size_t)B * H * T_, part_stride = bht * HD;
  const int gqa = KV < H && (dk || dv);
  float *D = NULL, *part = NULL;
  TSR_CUDA_SCRATCH(D, ws, tsr_cuda_attention_scratch_((long)bht, gqa ? 2 * (long)part_stride : 0));
  if (gqa) part = (float *)((char *)D + scratch_round(bht * sizeof(float)));
  const long warps = (long)B * T_ * H;
  attn_bwd_dot_kernel<T><<<(unsigned)((warps * 32 + 255) / 256), 256, 0, stream>>>(D, dout, out, B,
                                                                                T_, H, HD);
  TSR_CUDA_LAUNCHED();
  const dim3 grid((unsigned)((T_ + TC_ROWS - 1) / TC_ROWS), B * H);
  if (dq && MMA) {
    const size_t smem = mm_dims<HD>::DQ;
    TSR_CUDA_CHECK(allow_smem(attn_mma_dq_kernel<T, HD>, smem));
    attn_mma_dq_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(
        dq, dout, lse, D, q, k, v, T_, H, KV, qkv_stride, scale_log2, scale);
    TSR_CUDA_LAUNCHED();
  } else if (dq) {
    const size_t smem = tc_bwd_smem<HD>();
    TSR_CUDA_CHECK(allow_smem(attn_tc_dq_kernel<T, HD>, smem));
    attn_tc_dq_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(
        dq, dout, lse, D, q, k, v, T_, H, KV, qkv_stride, scale);
    TSR_CUDA_LAUNCHED();
  }
  if (!dk && !dv) return 0;
  if (MMA) {
    const size_t smem = mm_dims<HD>::DKDV;
    TSR_CUDA_CHECK(allow_smem(attn_mma_dkdv_kernel<T, HD>, smem));
    attn_mma_dkdv_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(
        dk, dv, part, part_stride, dout, lse, D, q, k, v, T_, H, KV, qkv_stride, scale_log2,
        scale);
  } else {
    const size_t smem = tc_bwd_smem<HD>();
    TSR_CUDA_CHECK(allow_smem(attn_tc_dkdv_kernel<T, HD>, smem));
    attn_tc_dkdv_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(
        dk, dv, part, part_stride, dout, lse, D, q, k, v, T_, H, KV, qkv_stride, scale);
  }
  TSR_CUDA_LAUNCHED();
  if (gqa) {
    const long n = (long)B * T_ * KV * HD;
    attn_tc_gqa_reduce_kernel<T, HD><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
        dk, dv, part, part_stride, B, T_, H, KV, qkv_stride, scale);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

/* ---------------------------------------------------------------- the choice */
static int g_tc_kernel = TSR_CUDA_TC_WMMA;
extern "C" void tsr_cuda_attention_tc_use(int kernel) {
  g_tc_kernel = kernel == TSR_CUDA_TC_MMA ? TSR_CUDA_TC_MMA : TSR_CUDA_TC_WMMA;
}
extern "C" int tsr_cuda_attention_tc_kernel(void) { return g_tc_kernel; }

/* Shared memory a head_dim's kernels need per block (the larger of forward and backward;
 * 0: no tensor-core kernel for it). */
extern "C" size_t tsr_cuda_attention_tc_smem(int hd) {
  const int mma = g_tc_kernel == TSR_CUDA_TC_MMA;
  switch (hd) {
    case 32: return mma ? mm_dims<32>::MAX : tc_smem<32>();
    case 64: return mma ? mm_dims<64>::MAX : tc_smem<64>();
    case 96: return mma ? mm_dims<96>::MAX : tc_smem<96>();
    case 128: return mma ? mm_dims<128>::MAX : tc_smem<128>();
  }
  return 0;
}
/* A kernel for hd, and the current GPU gives a block that much shared memory (sm_86/89
 * parts give 99 KB: hd 96 and 128 fall back to the fp32 kernel there). */
extern "C" int tsr_cuda_attention_tc_supported(int hd) {
  const size_t need = tsr_cuda_attention_tc_smem(hd);
  int dev = 0, optin = 0, major = 0;
  if (!need || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return need <= (size_t)optin && major >= 8; /* bf16 tensor-core products: sm_80 on */
}

extern "C" int tsr_cuda_attention_tc_fwd(float *out, float *lse, const float *q, const float *k,
                                         const float *v, int B, int T, int H, int KV, int hd,
                                         int qkv_stride, cudaStream_t stream) {
  TSR_CALL(check_shape(B, T, H, KV, hd, qkv_stride));
  TSR_CUDA_ARG(tsr_cuda_attention_tc_supported(hd));
#define TC_FWD(HD)                                                                          \
  (g_tc_kernel == TSR_CUDA_TC_MMA                                                           \
       ? attn_tc_fwd<float, HD, true>(out, lse, q, k, v, B, T, H, KV, qkv_stride, stream)    \
       : attn_tc_fwd<float, HD, false>(out, lse, q, k, v, B, T, H, KV, qkv_stride, stream))
  switch (hd) {
    case 32: return TC_FWD(32);
    case 64: return TC_FWD(64);
    case 96: return TC_FWD(96);
    default: return TC_FWD(128);
  }
#undef TC_FWD
}
extern "C" int tsr_cuda_attention_tc_bwd(float *dq, float *dk, float *dv, const float *dout,
                                         const float *out, const float *lse, const float *q,
                                         const float *k, const float *v, int B, int T, int H,
                                         int KV, int hd, int qkv_stride,
                                         const tsr_cuda_scratch *ws, cudaStream_t stream) {
  TSR_CALL(check_shape(B, T, H, KV, hd, qkv_stride));
  TSR_CUDA_ARG(tsr_cuda_attention_tc_supported(hd));
  if (!dq && !dk && !dv) return 0;
#define TC_BWD(HD)                                                                        \
  (g_tc_kernel == TSR_CUDA_TC_MMA                                                         \
       ? attn_tc_bwd<float, HD, true>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV,    \
                                      qkv_stride, ws, stream)                              \
       : attn_tc_bwd<float, HD, false>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV,   \
                                       qkv_stride, ws, stream))
  switch (hd) {
    case 32: return TC_BWD(32);
    case 64: return TC_BWD(64);
    case 96: return TC_BWD(96);
    default: return TC_BWD(128);
  }
#undef TC_BWD
}
