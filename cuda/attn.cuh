/* attn.cuh — what the attention kernel files share: the entry points of each family
 * (called by attention.cu, which picks one per shape), the loads of a query tile's
 * statistics, and the 16-bit tiles of the tensor-core kernels.
 *
 * Layouts and semantics of every family are those of ops_list.h's attention: q/k/v rows of
 * stride qkv_stride, query head h reads kv head h / (H/KV), out contiguous [B*T, H*hd],
 * lse[(b*H + h)*T + t], the backward writes dq, dk, dv.  The backward's D[(b*H + h)*T + t]
 * = sum_i dout * out over the row (attention.cu computes it first, into scratch).  Under
 * grouped-query attention (KV < H) the tensor-core backwards write each query head's raw
 * dk, dv sums to `part` (dk's, then dv's part_stride = B*H*T*hd floats later), which
 * attention.cu then sums over each group, in order.  No family stores a T x T matrix;
 * every output element is summed in a fixed order: deterministic, no atomics.
 *
 * Documents (doc != NULL, ops_list.h): query t of sequence b sees the keys
 * [doc[b*T + t], t].  doc does not decrease along a sequence, so a query tile's first row
 * has its smallest start: the forward and dq walk the key tiles from the one holding it
 * (the tiles before the document are skipped), and dk/dv stop walking the query tiles of
 * a key tile at the first whose first row starts after the tile's last key; the tiles
 * crossing a document start mask the keys left of each row's start as the diagonal tile
 * masks the keys right of it. */
#ifndef TSR_CUDA_ATTN_CUH
#define TSR_CUDA_ATTN_CUH

#include "cuda_common.cuh"

/* ---- attn_f32.cu: fp32 arithmetic on fp32, bf16 or fp16 storage, head_dim <= 128 ---- */
#define ATT_HD_MAX 128
int tsr_attn_f32_fwd(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc);
int tsr_attn_f32_bwd(tsr_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                     const float *lse, const float *D, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc);
/* The block ops (ops_list.h attention_block_*) on these kernels: Tq queries against Tk keys
 * per sequence, query row i seeing key row j when j <= i + off (and, with doc, j >=
 * doc[b*Tq + i]); out fp32; the backward adds into fp32 dq [B*Tq, H*hd], dk and dv
 * [B*Tk, KV*hd] (D as above, over Tq). */
int tsr_attn_f32_block_fwd(tsr_dtype dt, float *out, float *lse, const void *q, const void *k,
                           const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                           int q_stride, int kv_stride, int off, const int32_t *doc);
int tsr_attn_f32_block_bwd(tsr_dtype dt, float *dq, float *dk, float *dv, const void *dout,
                           const float *lse, const float *D, const void *q, const void *k,
                           const void *v, int B, int Tq, int Tk, int H, int KV, int hd,
                           int q_stride, int kv_stride, int off, const int32_t *doc);

/* ---- attn_mma.cu: the tensor cores (mma.sync), 16-bit storage (bf16 or fp16, the matrix
 * products in that type, fp32 accumulation and softmax), head_dim 32, 64, 96 or 128
 * (smem: bytes of shared memory per block, 0 for another head_dim) ---- */
size_t tsr_attn_mma_smem(int hd);
int tsr_attn_mma_fwd(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc);
int tsr_attn_mma_bwd(tsr_dtype dt, void *dq, void *dk, void *dv, float *part, const void *dout,
                     const float *lse, const float *D, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc);

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

/* ============================================================ tensor-core tiles
 * Blocks of 4 warps own 64 rows (queries for the forward and dq, keys for dk/dv), 16 per
 * warp, and walk tiles of 64 keys (queries).  A tile is rows [row0, row0 + 64) of one head
 * of a strided buffer in shared memory as stored (bf16 or fp16 bits, rows padded to HD + 8
 * elements), rows past T zero.  tc_load loads it in two steps, so that a thread's global
 * loads are in flight together: tc_fetch reads it into registers (TC_LOADS groups of 4
 * elements per thread, 8-byte loads where the rows allow), tc_put writes them out. */
#define TC_ROWS 64
#define TC_WARPS 4
#define TC_THREADS (32 * TC_WARPS)
#define TC_LOADS(HD) (TC_ROWS * (HD) / 4 / TC_THREADS)

/* A 16-bit tile's row stride, hd (+8) columns, and its bytes */
template <int HD> struct tc_dims {
  static const int LDB = HD + 8;
  static const size_t TILE = (size_t)TC_ROWS * LDB * 2;
};

template <class T, int HD>
__device__ __forceinline__ void tc_fetch(uint2 (&r)[TC_LOADS(HD)], const T *src, int row0,
                                         int T_, size_t batch_off, int stride, int col0) {
  const uint16_t *base = (const uint16_t *)(src + batch_off + col0);
  const bool vec = stride % 4 == 0 && ((uintptr_t)base & 7) == 0;
#pragma unroll
  for (int i = 0; i < TC_LOADS(HD); i++) {
    const int idx = threadIdx.x + i * TC_THREADS;
    const int rr = idx / (HD / 4), d = 4 * (idx - rr * (HD / 4)), t = row0 + rr;
    uint2 x;
    x.x = 0, x.y = 0;
    if (t < T_) {
      const uint16_t *e = base + (size_t)t * stride + d;
      if (vec) {
        x = *(const uint2 *)e;
      } else {
        x.x = (uint32_t)e[0] | (uint32_t)e[1] << 16;
        x.y = (uint32_t)e[2] | (uint32_t)e[3] << 16;
      }
    }
    r[i] = x;
  }
}
template <class T, int HD>
__device__ __forceinline__ void tc_put(T *tile, const uint2 (&r)[TC_LOADS(HD)]) {
#pragma unroll
  for (int i = 0; i < TC_LOADS(HD); i++) {
    const int idx = threadIdx.x + i * TC_THREADS;
    const int rr = idx / (HD / 4), d = 4 * (idx - rr * (HD / 4));
    *(uint2 *)(tile + rr * tc_dims<HD>::LDB + d) = r[i]; /* LDB, d: multiples of 4 */
  }
}
template <class T, int HD>
__device__ __forceinline__ void tc_load(T *tile, const T *src, int row0, int T_,
                                        size_t batch_off, int stride, int col0) {
  uint2 r[TC_LOADS(HD)];
  tc_fetch<T, HD>(r, src, row0, T_, batch_off, stride, col0);
  tc_put<T, HD>(tile, r);
}

/* The head dimension as a template argument: `...` (an int expression using HD) for
 * hd 32, 64, 96, 128; another hd is an argument error. */
#define TC_HD_SWITCH(hd, HD, ...)        \
  do {                                   \
    switch (hd) {                        \
      case 32: {                         \
        const int HD = 32;               \
        return __VA_ARGS__;              \
      }                                  \
      case 64: {                         \
        const int HD = 64;               \
        return __VA_ARGS__;              \
      }                                  \
      case 96: {                         \
        const int HD = 96;               \
        return __VA_ARGS__;              \
      }                                  \
      case 128: {                        \
        const int HD = 128;              \
        return __VA_ARGS__;              \
      }                                  \
    }                                    \
    TSR_CUDA_ARG(!"hd 32, 64, 96 or 128"); \
  } while (0)

#endif
