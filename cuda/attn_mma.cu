/* attn_mma.cu — causal grouped-query attention on the tensor cores, on mma.sync.m16n8k16
 * (bf16 or fp16 inputs, fp32 accumulators) with every product's accumulators in
 * registers, as FlashAttention-2 lays it out: the scores of a warp's 16 rows never leave
 * its registers, the softmax runs on them in place (each row's values sit on the 4 lanes
 * of a quad: two xor shuffles), and P (or dS) is re-packed from the accumulator layout
 * into the A operand of the next product without touching shared memory.  q, k, v, dout
 * are read as stored; P and dS are rounded to the storage type for their products;
 * softmax statistics and accumulators are fp32.  Blocks of 4 warps x 16 rows, tiles of
 * 64 (attn.cuh); the blocks with the most tiles start first (the last query tiles, the
 * first key tiles), so that short ones fill the tail of the grid.  Our 16-bit attention
 * where cuDNN's is not built, declines a shape, or TSR_CUDA_ATTENTION=mma asks for it
 * (attention.cu).
 *
 * Shared memory holds 16-bit tiles twice where a product needs them with the head
 * dimension as its n index: row-major [64][HD + 8] (the k = hd operand: Q K^T, dO V^T)
 * and transposed [HD][64 + 8] (the k = key/query operand: P V, dS K, P^T dO, dS^T Q),
 * so that every fragment is two 32-bit loads; both paddings put the 8 row groups x 4
 * lanes of a fragment load on 32 different banks.  The forward reads V transposed from
 * global memory (it needs no row-major V); the backward transposes K, Q and dO in shared
 * memory, so that each is read from global memory once per tile.  Documents (doc): the
 * tiles skipped and masked as attn.cuh says; a lane reads its rows' document starts once,
 * dk/dv the starts of a query tile's columns only where the tile crosses one. */
#include "attn.cuh"

#if defined(TSR_CUDA_EMULATION)
#include <mma.h> /* the emulation's stand-ins for the instruction */
#endif

#define MM_LDT (TC_ROWS + 8) /* transposed tiles' row stride */
#define LOG2E_F 1.4426950408889634f
#define LN2_F 0.6931471805599453f

/* D += A B for the calling warp (m16n8k16; layouts in emu/include/mma.h, which
 * stands in for the instruction on the CPU emulation). */
template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma16816<bf16>(float (&d)[4], const uint32_t (&a)[4],
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
template <>
__device__ __forceinline__ void mma16816<f16>(float (&d)[4], const uint32_t (&a)[4],
                                              const uint32_t (&b)[2]) {
#if defined(TSR_CUDA_EMULATION)
  emu_mma_m16n8k16_f16(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

template <class T> __device__ __forceinline__ uint32_t ld32(const T *p) {
  return *(const uint32_t *)p;
}
/* two values rounded to T, the first in the low 16 bits */
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T a = from_f32<T>(lo), b = from_f32<T>(hi);
  uint16_t ua, ub;
  memcpy(&ua, &a, 2);
  memcpy(&ub, &b, 2);
  return (uint32_t)ua | (uint32_t)ub << 16;
}
/* A operand: the 16 x 16 block at p, row-major with row stride ld (g = lane / 4, t = lane % 4) */
template <class T>
__device__ __forceinline__ void mm_frag_a(uint32_t (&a)[4], const T *p, int ld, int g, int t) {
  a[0] = ld32(p + g * ld + 2 * t), a[1] = ld32(p + (g + 8) * ld + 2 * t);
  a[2] = ld32(p + g * ld + 2 * t + 8), a[3] = ld32(p + (g + 8) * ld + 2 * t + 8);
}
/* B operand (16 x 8, k x n): element (k, n) at p[n * ld + k] */
template <class T>
__device__ __forceinline__ void mm_frag_b(uint32_t (&b)[2], const T *p, int ld, int g, int t) {
  b[0] = ld32(p + g * ld + 2 * t), b[1] = ld32(p + g * ld + 2 * t + 8);
}
/* The A operand over k = 16 columns [16 kk, 16 kk + 16) of a 16-row accumulator strip
 * c[n8 tile][4] (as mma16816 leaves it), rounded to T: no data leaves the lane. */
template <class T, int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]), a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* s[j] = A1 B1_j^T and p[j] = A2 B2_j^T for the N tiles j of 8 rows, over k = HD: A1, A2
 * the warp's 16 rows and B1, B2 rows 8 j .. 8 j + 7 of row-major tiles (stride ld)
 * (Q K^T and dO V^T for dq; K Q^T and V dO^T for dk/dv) */
template <class T, int HD, int N>
__device__ __forceinline__ void mm_two_products(float (&s)[N][4], float (&p)[N][4], const T *a1,
                                                const T *a2, const T *b1, const T *b2, int ld,
                                                int g, int t) {
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
      mma16816<T>(s[j], fa1, fb1);
      mma16816<T>(p[j], fa2, fb2);
    }
  }
}
/* sum[n] += A (16 x 16, an operand from acc_to_a) times the 16 rows [k0, k0 + 16) of the
 * transposed tile bt (bt[d * MM_LDT + k]), for the HD / 8 column tiles n */
template <class T, int HD>
__device__ __forceinline__ void mm_rows(float (&sum)[HD / 8][4], const uint32_t (&a)[4],
                                        const T *bt, int k0, int g, int t) {
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
    uint32_t b[2];
    mm_frag_b(b, bt + 8 * n * MM_LDT + k0, MM_LDT, g, t);
    mma16816<T>(sum[n], a, b);
  }
}

/* 8 consecutive 16-bit values at e (raw bits), 16-byte loads where aligned */
__device__ __forceinline__ void load8(uint16_t (&x)[8], const uint16_t *e, bool vec) {
  if (vec) {
    const uint4 a = *(const uint4 *)e;
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
      x[2 * i] = (uint16_t)(w[i] & 0xffffu), x[2 * i + 1] = (uint16_t)(w[i] >> 16);
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++) x[i] = e[i];
  }
}
/* Rows [row0, row0 + 64) of one head into a transposed tile tt[d * MM_LDT + row] (rows
 * past T zero).  A thread takes two adjacent rows by 8 columns and writes 8 words, each
 * the pair of rows at one column: a warp's 32 row pairs write 32 consecutive words. */
template <class T, int HD>
__device__ __forceinline__ void mm_load_t(T *tt, const T *src, int row0, int T_,
                                          size_t batch_off, int stride, int col0) {
  const uint16_t *base = (const uint16_t *)(src + batch_off + col0);
  const bool vec = stride % 8 == 0 && ((uintptr_t)base & 15) == 0;
#pragma unroll
  for (int i = 0; i < HD / 32; i++) { /* (TC_ROWS / 2) * (HD / 8) units over TC_THREADS */
    const int u = threadIdx.x + i * TC_THREADS, rp = u & 31, d = 8 * (u >> 5);
    const int t0 = row0 + 2 * rp;
    uint16_t x0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (t0 < T_) load8(x0, base + (size_t)t0 * stride + d, vec);
    if (t0 + 1 < T_) load8(x1, base + (size_t)(t0 + 1) * stride + d, vec);
#pragma unroll
    for (int e = 0; e < 8; e++)
      *(uint32_t *)(tt + (d + e) * MM_LDT + 2 * rp) = (uint32_t)x0[e] | (uint32_t)x1[e] << 16;
  }
}

/* The transposed copy tt[d * MM_LDT + row] of a row-major tile already in shared memory
 * (the backward's second layout of K, Q and dO: read from global memory once). */
template <class T, int HD>
__device__ __forceinline__ void mm_transpose(T *tt, const T *tile) {
  const int LDB = tc_dims<HD>::LDB;
#pragma unroll
  for (int i = 0; i < HD / 32; i++) {
    const int u = threadIdx.x + i * TC_THREADS, rp = u & 31, d = 8 * (u >> 5);
    uint16_t a[8], b[8];
    load8(a, (const uint16_t *)(tile + 2 * rp * LDB + d), true); /* LDB, d: multiples of 8 */
    load8(b, (const uint16_t *)(tile + (2 * rp + 1) * LDB + d), true);
#pragma unroll
    for (int e = 0; e < 8; e++)
      *(uint32_t *)(tt + (d + e) * MM_LDT + 2 * rp) = (uint32_t)a[e] | (uint32_t)b[e] << 16;
  }
}

template <int HD> struct mm_dims {
  static const int LDB = tc_dims<HD>::LDB;
  static const size_t TILE = tc_dims<HD>::TILE;                       /* [64][HD + 8] */
  static const size_t TILE_T = (size_t)HD * MM_LDT * 2;               /* [HD][64 + 8] */
  static const size_t STATS = 2 * TC_ROWS * sizeof(float);
  static const size_t FWD = 2 * TILE + TILE_T;                        /* Q, K; V^T */
  static const size_t DQ = 4 * TILE + TILE_T + STATS;                 /* Q, dO, K, V; K^T */
  static const size_t DKDV = 4 * TILE + 2 * TILE_T + STATS;           /* K, V, Q, dO; Q^T, dO^T */
  static const size_t MAX = DKDV > DQ ? (DKDV > FWD ? DKDV : FWD) : (DQ > FWD ? DQ : FWD);
};

/* The backward kernels' shared memory: four row-major tiles (which holds what is the
 * kernel's choice), N_T transposed ones, then lse and D of a query tile (mm_dims::DQ for
 * N_T = 1, ::DKDV for 2). */
template <class T, int HD, int N_T> struct mm_bwd_layout {
  static const int TILE = TC_ROWS * mm_dims<HD>::LDB, TT = HD * MM_LDT; /* elements */
  __device__ static T *tile(float *smem, int i) { return (T *)smem + i * TILE; }
  __device__ static T *tt(float *smem, int i) { return (T *)smem + 4 * TILE + i * TT; }
  __device__ static float *stats(float *smem) { return (float *)((T *)smem + 4 * TILE + N_T * TT); }
};

/* Forward: the block's 64 queries (the last tiles first: they have the most keys), warp w
 * rows 16 w + g and + 8; s holds the warp's 16 x 64 scores in log2 units. */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    mma_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc,
                   int T_, int H, int KV, int qkv_stride, float scale_log2) {
  typedef mm_dims<HD> Dm;
  extern __shared__ __align__(32) float smem[];
  T *Qs = (T *)smem, *Ks = Qs + TC_ROWS * Dm::LDB, *Vt = Ks + TC_ROWS * Dm::LDB;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / KV);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * TC_ROWS, r0 = q0 + 16 * w + g, r1 = r0 + 8;
  const size_t boff = (size_t)b * T_ * qkv_stride;

  tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
  __syncthreads();
  uint32_t qa[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++)
    mm_frag_a(qa[kk], Qs + 16 * w * Dm::LDB + 16 * kk, Dm::LDB, g, t);
  float o[HD / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  /* documents: the first key of rows r0, r1 and the largest of the warp's rows */
  const int32_t *dc = doc ? doc + (size_t)b * T_ : NULL;
  const int ds0 = dc && r0 < T_ ? dc[r0] : 0, ds1 = dc && r1 < T_ ? dc[r1] : 0;
  const int dsw = dc ? dc[min(q0 + 16 * w + 15, T_ - 1)] : 0;

  for (int k0 = dc ? dc[q0] / TC_ROWS * TC_ROWS : 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
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
        mma16816<T>(s[j], qa[kk], kb);
      }
    }
    /* a key to mask: right of the diagonal, past T, or left of a row's document start */
    const bool edge = k0 + TC_ROWS - 1 > q0 + 16 * w || k0 + TC_ROWS > T_ || k0 < dsw;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * j + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
        s[j][e] = edge && (key > row || key >= T_ || key < (e < 2 ? ds0 : ds1))
                      ? -INFINITY
                      : s[j][e] * scale_log2;
        if (e < 2) mx0 = fmaxf(mx0, s[j][e]);
        else mx1 = fmaxf(mx1, s[j][e]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    /* a row whose document starts past this tile has seen no key yet: -inf maxima */
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
    l0 = l0 * c0 + sum0, l1 = l1 * c1 + sum1; /* this lane's columns; the quad sums at the end */
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] *= c0, o[n][1] *= c0, o[n][2] *= c1, o[n][3] *= c1;
#pragma unroll
    for (int kk = 0; kk < TC_ROWS / 16; kk++) {
      uint32_t pa[4];
      acc_to_a<T>(pa, s, kk);
      mm_rows<T, HD>(o, pa, Vt, 16 * kk, g, t);
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

/* dst rows (row0 + g, + 8), columns col0 + 8 n + 2 t (+1) = mul * sum, from a 16-row
 * accumulator strip (rows past T skipped) */
template <class T, int HD>
__device__ __forceinline__ void mm_store_rows(T *dst, const float (&sum)[HD / 8][4], int row0,
                                              int T_, size_t batch_off, int stride, int col0,
                                              float mul, int g, int t) {
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int r = row0 + g + 8 * hr;
    if (r >= T_) continue;
    T *p = dst + batch_off + (size_t)r * stride + col0 + 2 * t;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      p[8 * n] = from_f32<T>(mul * sum[n][2 * hr]);
      p[8 * n + 1] = from_f32<T>(mul * sum[n][2 * hr + 1]);
    }
  }
}

/* dq of the block's 64 queries: dq = scale * dS K over the key tiles up to the diagonal,
 * dS = P (dP - D), P = exp(scale q.k - lse), dP = dout V^T */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    mma_dq_kernel(T *dq, const T *dout, const float *lse, const float *D, const T *q, const T *k,
                  const T *v, const int32_t *doc, int T_, int H, int KV, int qkv_stride,
                  float scale_log2, float scale) {
  typedef mm_dims<HD> Dm;
  const int LDB = Dm::LDB;
  extern __shared__ __align__(32) float smem[];
  typedef mm_bwd_layout<T, HD, 1> Sm;
  T *Qs = Sm::tile(smem, 0), *dOs = Sm::tile(smem, 1), *Ks = Sm::tile(smem, 2),
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
  const T *Qw = Qs + 16 * w * LDB, *dOw = dOs + 16 * w * LDB;
  float sum[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) sum[n][0] = sum[n][1] = sum[n][2] = sum[n][3] = 0.0f;
  const int32_t *dc = doc ? doc + (size_t)b * T_ : NULL;
  const int ds0 = dc && r0 < T_ ? dc[r0] : 0, ds1 = dc && r1 < T_ ? dc[r1] : 0;

  for (int k0 = dc ? dc[q0] / TC_ROWS * TC_ROWS : 0; k0 <= q0 && k0 < T_; k0 += TC_ROWS) {
    __syncthreads();
    tc_load<T, HD>(Ks, k, k0, T_, boff, qkv_stride, kvh * HD);
    tc_load<T, HD>(Vs, v, k0, T_, boff, qkv_stride, kvh * HD);
    __syncthreads();
    mm_transpose<T, HD>(Kt, Ks);
    __syncthreads();
    float s[8][4], dp[8][4];
    mm_two_products<T, HD, 8>(s, dp, Qw, dOw, Ks, Vs, LDB, g, t);
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * j + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
        const float p = key <= row && key < T_ && row < T_ && key >= (e < 2 ? ds0 : ds1)
                            ? exp2f(s[j][e] * scale_log2 - (e < 2 ? L0 : L1))
                            : 0.0f;
        s[j][e] = p * (dp[j][e] - (e < 2 ? D0 : D1)); /* dS */
      }
#pragma unroll
    for (int kk = 0; kk < TC_ROWS / 16; kk++) {
      uint32_t sa[4];
      acc_to_a<T>(sa, s, kk);
      mm_rows<T, HD>(sum, sa, Kt, 16 * kk, g, t);
    }
  }
  mm_store_rows<T, HD>(dq, sum, q0 + 16 * w, T_, boff, qkv_stride, h * HD, scale, g, t);
}

/* dk, dv of the block's 64 keys from query head h, over the query tiles from the
 * diagonal on (in halves of 32 queries, to keep both sums in registers):
 * dv = P^T dout, dk = scale * dS^T q, with P^T = exp(scale K Q^T - lse) and
 * dP^T = V dout^T computed key-major.  One block per (key tile, b, query head), so that
 * the grid has B*H*T/64 blocks and not B*KV*T/64: under grouped-query attention
 * (part != NULL) each head's raw sums go to its own slice of part (attn.cuh). */
template <class T, int HD>
__global__ void __launch_bounds__(TC_THREADS)
    mma_dkdv_kernel(T *dk, T *dv, float *part, size_t part_stride, const T *dout,
                    const float *lse, const float *D, const T *q, const T *k, const T *v,
                    const int32_t *doc, int T_, int H, int KV, int qkv_stride, float scale_log2,
                    float scale) {
  typedef mm_dims<HD> Dm;
  const int LDB = Dm::LDB;
  extern __shared__ __align__(32) float smem[];
  typedef mm_bwd_layout<T, HD, 2> Sm;
  T *Ks = Sm::tile(smem, 0), *Vs = Sm::tile(smem, 1), *Qs = Sm::tile(smem, 2),
    *dOs = Sm::tile(smem, 3), *Qt = Sm::tt(smem, 0), *dOt = Sm::tt(smem, 1);
  float *Ls = Sm::stats(smem), *Ds = Ls + TC_ROWS;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int b = blockIdx.y / H, h = blockIdx.y % H, kvh = h / (H / KV);
  const int j0 = blockIdx.x * TC_ROWS, key0 = j0 + 16 * w + g, key1 = key0 + 8;
  const size_t boff = (size_t)b * T_ * qkv_stride, doff = (size_t)b * T_ * H * HD;

  tc_load<T, HD>(Ks, k, j0, T_, boff, qkv_stride, kvh * HD);
  tc_load<T, HD>(Vs, v, j0, T_, boff, qkv_stride, kvh * HD);
  const T *Kw = Ks + 16 * w * LDB, *Vw = Vs + 16 * w * LDB;
  float sk[HD / 8][4], sv[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) sk[n][e] = sv[n][e] = 0.0f;

  const int32_t *dc = doc ? doc + (size_t)b * T_ : NULL;
  for (int q0 = j0; q0 < T_; q0 += TC_ROWS) {
    /* this tile's queries, and all after them, start their documents past the keys */
    if (dc && dc[q0] >= j0 + TC_ROWS) break;
    /* some query of the tile starts its document past the tile's first key */
    const bool cross = dc && dc[min(q0 + TC_ROWS - 1, T_ - 1)] > j0;
    __syncthreads();
    tc_load<T, HD>(Qs, q, q0, T_, boff, qkv_stride, h * HD);
    tc_load<T, HD>(dOs, dout, q0, T_, doff, H * HD, h * HD);
    load_stats<TC_ROWS, TC_THREADS>(Ls, Ds, lse, D, ((size_t)b * H + h) * T_, q0, T_);
    __syncthreads();
    mm_transpose<T, HD>(Qt, Qs);
    mm_transpose<T, HD>(dOt, dOs);
    __syncthreads();
#pragma unroll
    for (int hq = 0; hq < 2; hq++) {
      const int c0 = 32 * hq; /* this half's first query column in the tile */
      float st[4][4], dpt[4][4];
      mm_two_products<T, HD, 4>(st, dpt, Kw, Vw, Qs + c0 * LDB, dOs + c0 * LDB, LDB, g, t);
#pragma unroll
      for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = c0 + 8 * j + 2 * t + (e & 1), tq = q0 + c, key = e < 2 ? key0 : key1;
          const float p = tq < T_ && key <= tq && key < T_ && (!cross || key >= dc[tq])
                              ? exp2f(st[j][e] * scale_log2 - Ls[c] * LOG2E_F)
                              : 0.0f;
          st[j][e] = p;
          dpt[j][e] = p * (dpt[j][e] - Ds[c]); /* dS^T */
        }
#pragma unroll
      for (int kk = 0; kk < 2; kk++) {
        uint32_t pa[4], sa[4];
        acc_to_a<T>(pa, st, kk);
        acc_to_a<T>(sa, dpt, kk);
        mm_rows<T, HD>(sv, pa, dOt, c0 + 16 * kk, g, t);
        mm_rows<T, HD>(sk, sa, Qt, c0 + 16 * kk, g, t);
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
          pk[(size_t)r * HD + 8 * n + 2 * t + e] = sk[n][2 * hr + e];
          pv[(size_t)r * HD + 8 * n + 2 * t + e] = sv[n][2 * hr + e];
        }
    }
    return;
  }
  if (dk) mm_store_rows<T, HD>(dk, sk, j0 + 16 * w, T_, boff, qkv_stride, kvh * HD, scale, g, t);
  if (dv) mm_store_rows<T, HD>(dv, sv, j0 + 16 * w, T_, boff, qkv_stride, kvh * HD, 1.0f, g, t);
}

size_t tsr_attn_mma_smem(int hd) {
  switch (hd) {
    case 32: return mm_dims<32>::MAX;
    case 64: return mm_dims<64>::MAX;
    case 96: return mm_dims<96>::MAX;
    case 128: return mm_dims<128>::MAX;
  }
  return 0;
}

template <class T, int HD>
static int mma_fwd(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc,
                   int B, int T_, int H, int KV, int qkv_stride) {
  const dim3 grid((unsigned)((T_ + TC_ROWS - 1) / TC_ROWS), B * H);
  const float scale = (float)(1.0 / sqrt((double)HD));
  const size_t smem = mm_dims<HD>::FWD;
  TSR_CUDA_CALL(allow_smem(mma_fwd_kernel<T, HD>, smem));
  mma_fwd_kernel<T, HD><<<grid, TC_THREADS, smem, tsr_cuda_ctx.stream>>>(
      out, lse, q, k, v, doc, T_, H, KV, qkv_stride, scale * LOG2E_F);
  TSR_CUDA_LAUNCHED();
  return 0;
}

template <class T, int HD>
static int mma_bwd(T *dq, T *dk, T *dv, float *part, const T *dout, const float *lse,
                   const float *D, const T *q, const T *k, const T *v, const int32_t *doc, int B,
                   int T_, int H, int KV, int qkv_stride) {
  const float scale = (float)(1.0 / sqrt((double)HD)), scale_log2 = scale * LOG2E_F;
  const size_t part_stride = (size_t)B * H * T_ * HD;
  const dim3 grid((unsigned)((T_ + TC_ROWS - 1) / TC_ROWS), B * H);
  const cudaStream_t stream = tsr_cuda_ctx.stream;
  if (dq) {
    const size_t smem = mm_dims<HD>::DQ;
    TSR_CUDA_CALL(allow_smem(mma_dq_kernel<T, HD>, smem));
    mma_dq_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(dq, dout, lse, D, q, k, v, doc, T_, H,
                                                             KV, qkv_stride, scale_log2, scale);
    TSR_CUDA_LAUNCHED();
  }
  if (dk || dv) {
    const size_t smem = mm_dims<HD>::DKDV;
    TSR_CUDA_CALL(allow_smem(mma_dkdv_kernel<T, HD>, smem));
    mma_dkdv_kernel<T, HD><<<grid, TC_THREADS, smem, stream>>>(
        dk, dv, part, part_stride, dout, lse, D, q, k, v, doc, T_, H, KV, qkv_stride, scale_log2,
        scale);
    TSR_CUDA_LAUNCHED();
  }
  return 0;
}

template <class T>
static int fwd_t(void *out, float *lse, const void *q, const void *k, const void *v,
                 const int32_t *doc, int B, int T_, int H, int KV, int hd, int qkv_stride) {
  TC_HD_SWITCH(hd, HD,
               mma_fwd<T, HD>((T *)out, lse, (const T *)q, (const T *)k, (const T *)v, doc, B, T_,
                              H, KV, qkv_stride));
  return 0;
}
template <class T>
static int bwd_t(void *dq, void *dk, void *dv, float *part, const void *dout, const float *lse,
                 const float *D, const void *q, const void *k, const void *v, const int32_t *doc,
                 int B, int T_, int H, int KV, int hd, int qkv_stride) {
  TC_HD_SWITCH(hd, HD,
               mma_bwd<T, HD>((T *)dq, (T *)dk, (T *)dv, part, (const T *)dout, lse, D,
                              (const T *)q, (const T *)k, (const T *)v, doc, B, T_, H, KV,
                              qkv_stride));
  return 0;
}

int tsr_attn_mma_fwd(tsr_dtype dt, void *out, float *lse, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc) {
  TSR_CUDA_ARG(dt == TSR_BF16 || dt == TSR_F16);
  if (dt == TSR_F16) return fwd_t<f16>(out, lse, q, k, v, doc, B, T, H, KV, hd, qkv_stride);
  return fwd_t<bf16>(out, lse, q, k, v, doc, B, T, H, KV, hd, qkv_stride);
}
int tsr_attn_mma_bwd(tsr_dtype dt, void *dq, void *dk, void *dv, float *part, const void *dout,
                     const float *lse, const float *D, const void *q, const void *k,
                     const void *v, int B, int T, int H, int KV, int hd, int qkv_stride,
                     const int32_t *doc) {
  TSR_CUDA_ARG(dt == TSR_BF16 || dt == TSR_F16);
  if (dt == TSR_F16)
    return bwd_t<f16>(dq, dk, dv, part, dout, lse, D, q, k, v, doc, B, T, H, KV, hd, qkv_stride);
  return bwd_t<bf16>(dq, dk, dv, part, dout, lse, D, q, k, v, doc, B, T, H, KV, hd, qkv_stride);
}
