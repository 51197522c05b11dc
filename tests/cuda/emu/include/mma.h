/* mma.h (CPU emulation, tests/cuda/emulate.sh): the WMMA fragments of nvcuda::wmma that
 * cuda/attention.cu uses, 16x16x16 with bf16 inputs and fp32 accumulators.  Every
 * emulated thread holds the whole 16x16 tile (the hardware spreads it over the warp's
 * lanes in an unspecified layout, so kernels never index a fragment): loads, products and
 * stores are done in full by each lane, with the same result.  Products add in k order
 * in fp32, exact products of bf16 inputs, as the tensor cores do up to summation order. */
#ifndef EMU_MMA_H
#define EMU_MMA_H
#include <type_traits>
#include "cuda_bf16.h"
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
  float r[256];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 16; j++) {
      float s = c.x[16 * i + j];
      for (int k = 0; k < 16; k++) s += emu_f(a.x[16 * i + k]) * emu_f(b.x[16 * k + j]);
      r[16 * i + j] = s;
    }
  for (int e = 0; e < 256; e++) d.x[e] = r[e];
}
} // namespace wmma
} // namespace nvcuda
#endif
