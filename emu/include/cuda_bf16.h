/* cuda_bf16.h (CPU emulation, tests/cuda/emulate.sh): __nv_bfloat16 as 16 raw bits;
 * conversions round to nearest even like the hardware (NaN -> canonical 0x7fff). */
#ifndef EMU_BF16_H
#define EMU_BF16_H
#include <stdint.h>
#include <string.h>
struct __nv_bfloat16 { uint16_t x; };
static inline float __bfloat162float(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) { if (u & 0x7fffffu) u = 0x7fff0000u; }  /* canonical NaN */
  else u += 0x7fffu + ((u >> 16) & 1u);
  __nv_bfloat16 b; b.x = (uint16_t)(u >> 16); return b;
}
#endif
