/* cuda_fp16.h (CPU emulation, tests/cuda/emulate.sh): __half as 16 raw IEEE binary16 bits;
 * conversions through the compiler's _Float16, which rounds to nearest even with
 * subnormals and overflow to inf as the hardware does: an implementation independent of
 * src/core/dtype.h's, so the tests' bitwise checks compare two.  Widening goes through a table
 * of all 65536 values (made with _Float16 once), as the soft-float call per value made
 * the emulated fp16 tensor cores 30 times slower than the bf16 ones. */
#ifndef EMU_FP16_H
#define EMU_FP16_H
#include <stdint.h>
#include <string.h>
struct __half { uint16_t x; };
typedef __half half;
static inline const float *emu_half_table(void) {
  static float t[65536];
  for (unsigned i = 0; i < 65536; i++) {
    const uint16_t u = (uint16_t)i;
    _Float16 f;
    memcpy(&f, &u, 2);
    t[i] = (float)f;
  }
  return t;
}
static inline float __half2float(__half h) {
  static const float *const t = emu_half_table();
  return t[h.x];
}
static inline __half __float2half_rn(float v) {
  const _Float16 f = (_Float16)v;
  __half h;
  memcpy(&h.x, &f, 2);
  return h;
}
#endif
