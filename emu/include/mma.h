/* mma.h (CPU emulation, tests/cuda/emulate.sh): the stand-in for the tensor-core
 * instruction cuda/attn_mma.cu issues through inline PTX, which the emulation cannot run.
 * Products add in k order in fp32, exact products of 16-bit inputs, as the tensor cores
 * do up to summation order. */
#ifndef EMU_MMA_H
#define EMU_MMA_H
#include "cuda_runtime.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_kernel.h"

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
