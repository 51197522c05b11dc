/* mma.h (CPU emulation, tests/cuda/emulate.sh): the WMMA fragments of nvcuda::wmma that
 * cuda/attn_wmma.cu uses, 16x16x16 with bf16 or fp16 inputs and fp32 accumulators.  Every
 * emulated thread holds the whole 16x16 tile (the hardware spreads it over the warp's
 * lanes in an unspecified layout, so kernels never index a fragment): loads, products and
 * stores are done in full by each lane, with the same result.  Products add in k order
 * in fp32, exact products of 16-bit inputs, as the tensor cores do up to summation order. */
#ifndef EMU_MMA_H
#define EMU_MMA_H
#include <type_traits>
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_kernel.h"
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  T x[16 * 16]; /* element (i, j) at x[16 i + j] */
  enum { num_elements = 16 * 16 };
};
static inline float emu_f(float v) { return v; }
static inline float emu_f(__nv_bfloat16 v) { return __bfloat162float(v); }
static inline float emu_f(__half v) { return __half2float(v); }
template <class Use, class T, class L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
  const bool col = std::is_same<L, col_major>::value;
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) f.x[16 * i + j] = col ? p[j * ldm + i] : p[i * ldm + j];
}
template <class T> void fill_fragment(fragment<accumulator, 16, 16, 16, T> &f, T v) {
  for (int e = 0; e < 256; e++) f.x[e] = v;
}
template <class T>
void store_matrix_sync(T *p, const fragment<accumulator, 16, 16, 16, T> &f, unsigned ldm,
                       layout_t layout) {
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++)
      (layout == mem_col_major ? p[j * ldm + i] : p[i * ldm + j]) = f.x[16 * i + j];
}
template <class TA, class LA, class TB, class LB, class TC>
void mma_sync(fragment<accumulator, 16, 16, 16, TC> &d, const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
              const fragment<matrix_b, 16, 16, 16, TB, LB> &b,
              const fragment<accumulator, 16, 16, 16, TC> &c) {
  float r[256], fa[256], fb[256];
  for (int e = 0; e < 256; e++) fa[e] = emu_f(a.x[e]), fb[e] = emu_f(b.x[e]);
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[16 * i + j];
      for (int k = 0; k < 16; k++) s += fa[16 * i + k] * fb[16 * k + j];
      r[16 * i + j] = s;
    }
  for (int e = 0; e < 256; e++) d.x[e] = r[e];
}
} // namespace wmma
} // namespace nvcuda

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 for the calling warp, in
 * the fragment layout of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating
 * point type"): lane l = 4 g + t holds A's (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..),
 * (g+8, 2t+8..) in a[0..3] (lower column in the low 16 bits), B's (k = 2t..2t+1, n = g)
 * and (k = 2t+8.., n = g) in b[0..1], and D's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) in
 * d[0..3].  The lanes' fragments are gathered, the 16 x 8 product formed in fp32 in k
 * order, and each lane keeps its four elements.  W widens one 16-bit pattern. */
#include <stdint.h>
static inline float emu_bf16_bits(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
static inline float emu_f16_bits(uint16_t u) { return __half2float(__half{u}); }
template <float (*W)(uint16_t)>
static inline void emu_mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct frags { uint32_t a[4], b[2]; } mine = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, all[32];
  emu_warp_gather(&mine, all, sizeof mine);
  float A[16][16], B[16][8];
  auto lo = [](uint32_t u) { return W((uint16_t)(u & 0xffffu)); };
  auto hi = [](uint32_t u) { return W((uint16_t)(u >> 16)); };
  for (int l = 0; l < 32; l++) {
    const int g = l >> 2, t = l & 3;
    const uint32_t *fa = all[l].a, *fb = all[l].b;
    A[g][2 * t] = lo(fa[0]), A[g][2 * t + 1] = hi(fa[0]);
    A[g + 8][2 * t] = lo(fa[1]), A[g + 8][2 * t + 1] = hi(fa[1]);
    A[g][2 * t + 8] = lo(fa[2]), A[g][2 * t + 9] = hi(fa[2]);
    A[g + 8][2 * t + 8] = lo(fa[3]), A[g + 8][2 * t + 9] = hi(fa[3]);
    B[2 * t][g] = lo(fb[0]), B[2 * t + 1][g] = hi(fb[0]);
    B[2 * t + 8][g] = lo(fb[1]), B[2 * t + 9][g] = hi(fb[1]);
  }
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int e = 0; e < 4; e++) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    float s = d[e];
    for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
    d[e] = s;
  }
}
static inline void emu_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu_mma_m16n8k16<emu_bf16_bits>(d, a, b);
}
static inline void emu_mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu_mma_m16n8k16<emu_f16_bits>(d, a, b);
}
#endif
